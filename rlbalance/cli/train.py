"""Train an agent. Defaults train CartPole-v1 with central inference on 2 actors.

Each env family has a preset (run.preset: classic for CartPole and other gymnasium tasks, atari for ALE ids,
continuous for Box actions, toy, synthetic) over the field defaults; every option below shows the value a plain
run uses and what each preset sets. Options given here go on top of the preset.

Examples:
  rlbalance train
  rlbalance train --env.id ALE/Pong-v5 --learner.reward_clip 1 --run.total_steps 500000
  rlbalance train --config my.toml --set inference.mode=actor
  rlbalance train --ray local --actors.num_actors 4
  rlbalance train --resume runs/CartPole-v1-20261202-120000
"""

from __future__ import annotations

import argparse
import json

from rlbalance.cli.options import add_config_arguments, load_config


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--resume", metavar="RUN_DIR", help="Continue a run from its latest checkpoint; the run's own "
                   "config is used, with any --set/--section.field overrides on top (e.g. a larger run.total_steps).")
    p.add_argument("--allow-other-owner", action="store_true", help="--resume a run directory that another user "
                   "owns (refused otherwise: resuming writes into it as you)")
    p.add_argument("--ray", metavar="ADDRESS", help="Run the actors on a Ray cluster: 'local' starts a private one "
                   "on 127.0.0.1; HOST:PORT or 'auto' joins a running one (same as --ray.address).")
    add_config_arguments(p)


def run(args: argparse.Namespace) -> int:
    from rlbalance.runtime.train import train

    if args.ray:
        args.set = [*args.set, f"ray.address={args.ray}"]
    cfg = load_config(args, args.resume)  # (train() refuses another user's run directory first thing)
    summary = train(cfg, resume=args.resume, allow_other_owner=args.allow_other_owner)
    if summary.get("rank"):  # a learner rank of a torchrun launch: rank 0 prints the run's summary
        print(f"learner rank {summary['rank']}: {summary['outcome']}")
    else:
        _print_summary(summary)
    from rlbalance.cli import EXIT_COMPLETED, EXIT_FAILED, EXIT_INTERRUPTED

    return {"completed": EXIT_COMPLETED, "interrupted": EXIT_INTERRUPTED}.get(summary["outcome"], EXIT_FAILED)


def _print_summary(s: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"rlbalance train: {s['env']} ({s['mode']}, {s['inference']} inference, {s['device']})")
    table.add_column("figure")
    table.add_column("value", justify="right")
    rows = [("outcome", s["outcome"]), ("env steps", f"{s['steps']:,}"), ("frames", f"{s['frames']:,}"),
            ("updates", f"{s['updates']:,}"), ("wall time", f"{s['wall_s']:.1f} s"),
            ("sustained SPS (after warm-up)", f"{s['sps_sustained']:,.0f}"),
            ("sustained FPS (after warm-up)", f"{s['fps_sustained']:,.0f}"),
            ("mean return, last 100 episodes", f"{s['episode_return_last100']:.1f}"),
            ("best mean over 100 episodes", f"{s['episode_return_best100']:.1f}"),
            ("episodes", f"{s['episodes']:,}"), ("bottleneck verdict", s["verdict"]),
            ("node power", f"{s['node_power_w']['value']:.0f} W ({s['node_power_w']['source']})"
             if s.get("node_power_w") else "n/a"),
            ("run directory", s["run_dir"])]
    for k, v in rows:
        table.add_row(k, str(v))
    console = Console()
    console.print(table)
    console.print(f"[bold]{s['verdict']}[/bold]: {s['verdict_evidence']}.\n[bold]advice[/bold]: {s['verdict_advice']}.")
    print(json.dumps({"summary": s["run_dir"] + "/summary.json"}))
