"""Evaluate a trained run: play whole games with its latest checkpoint (no learning) and report the returns.

Writes eval.json (and video.mp4) to evals/RUN_NAME-TIME/ in the current directory, or to --out DIR; the run
directory it reads is left as it is, unless --into-run asks for eval.json there and a line in the run's report.

Examples:
  rlbalance eval runs/CartPole-v1-20261202-140000
  rlbalance eval runs/ALE_Pong-v5-20261202-150000 --episodes 30 --greedy
  rlbalance eval runs/ALE_Pong-v5-20261202-150000 --video            # and an MP4 of one game
  rlbalance eval runs/CartPole-v1-20261202-140000 --into-run         # RUN/eval.json, shown in RUN/report.html
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="an rlbalance run directory")
    p.add_argument("--episodes", type=int, default=10, help="games to play at least (each env plays the same "
                   "number: episodes / envs, rounded up)")
    p.add_argument("--envs", type=int, default=8, help="envs stepped together")
    p.add_argument("--greedy", action="store_true", help="take the most likely action instead of sampling the "
                   "policy as in training")
    p.add_argument("--checkpoint", help="a checkpoint file; without it, the run's latest")
    p.add_argument("--device", default="cpu", help="device for the policy: cpu, cuda, auto")
    p.add_argument("--threads", type=int, default=1, metavar="N", help="torch threads for the policy on the CPU "
                   "(default 1: beside a training run, more threads spin against it and eval runs ~3x slower; alone "
                   "on the machine, one per core is ~1.2x faster: bench/results/eval-threads.md)")
    p.add_argument("--seed", type=int, default=None, help="env and sampling seed; without it, one apart from "
                   "the run's training seeds")
    p.add_argument("--max-steps", type=int, default=10_000_000, help="give up after this many env steps")
    p.add_argument("--out", metavar="DIR", help="where eval.json (and video.mp4) go (default: "
                   "evals/RUN_NAME-YYYYmmdd-HHMMSS in the current directory)")
    p.add_argument("--into-run", action="store_true", help="write eval.json (and video.mp4) into the run directory "
                   "and add the evaluation to its report")
    p.add_argument("--video", nargs="?", const="", default=None, metavar="MP4",
                   help="also record one game as an MP4 (to MP4, or video.mp4 beside eval.json without a path); "
                   "Atari at 15 frames/s, one frame per agent step")
    p.add_argument("--trust-modules", action="store_true", help="import the modules the run's config.json names "
                   "(env.id 'module:Name', env.imports, learner.agent 'module:Agent'); without it they are shown and "
                   "refused before anything is imported, since a run directory may come from anyone")
    p.add_argument("--video-steps", type=int, default=10_000, help="--video: stop the game after this many agent steps")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from rlbalance.runtime.evaluate import check_eval_args, evaluate

    from rlbalance.core.errors import ConfigError
    from rlbalance.runtime.rundir import RunDir

    if args.into_run and args.out:
        raise ConfigError("--out and --into-run: give one (--into-run writes into the run directory itself)")
    # a missing run, or one naming modules not confirmed, is refused before anything is written
    RunDir(Path(args.run_dir)).read_config(trust_modules=args.trust_modules)
    run_dir = Path(args.run_dir)
    out = run_dir if args.into_run else Path(args.out) if args.out else Path(
        "evals", f"{run_dir.resolve().name}-{time.strftime('%Y%m%d-%H%M%S')}")
    video = None
    check_eval_args(args.episodes, args.envs, args.max_steps, args.threads)  # before the video is recorded
    if args.video is not None:  # first: a run that cannot be recorded is refused before anything is written
        from rlbalance.runtime.evaluate import record_video

        video = record_video(args.run_dir, args.video or out / "video.mp4", greedy=args.greedy,
                             checkpoint=args.checkpoint, device=args.device, seed=args.seed,
                             max_steps=args.video_steps, threads=args.threads, trust_modules=args.trust_modules)
    r = evaluate(args.run_dir, episodes=args.episodes, num_envs=args.envs, greedy=args.greedy,
                 checkpoint=args.checkpoint, device=args.device, seed=args.seed, max_steps=args.max_steps,
                 out_dir=out, threads=args.threads, trust_modules=args.trust_modules)
    console = Console()
    if r["episodes"]:
        console.print(
            f"[bold]{r['env']}[/bold], checkpoint at {r['checkpoint_steps']:,} steps, {r['policy']} policy: "
            f"return {r['return_mean']:.1f} +- {r['return_std']:.1f} over {r['episodes']} games "
            f"(min {r['return_min']:.1f}, max {r['return_max']:.1f}, mean length {r['length_mean']:.0f} steps)")
    if not r["complete"]:
        console.print(f"[bold red]incomplete[/bold red]: --max-steps {args.max_steps:,} ran out after "
                      f"{r['episodes']} of {r['games_per_env'] * r['num_envs']} games (kept in eval.json); "
                      "raise --max-steps or lower --episodes")
    print(f"wrote {out / 'eval.json'}")
    if video is not None:
        v = video
        print(f"wrote {v['path']}: one game, return {v['return']:.1f}, {v['frames']} frames at {v['fps']:g} "
              f"frames/s ({v['seconds']:.1f} s){'' if v['game_over'] else ', cut at --video-steps'}")
    if args.into_run and (run_dir / "report.html").is_file():  # the run's report shows the evaluation too
        from rlbalance.telemetry.report import write_report

        print(f"updated {write_report(run_dir)}")
    return 0 if r["complete"] else 1
