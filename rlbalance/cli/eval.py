"""Evaluate a trained run: play whole games with its latest checkpoint (no learning) and report the returns.

Examples:
  rlbalance eval runs/CartPole-v1-20261202-140000
  rlbalance eval runs/ALE_Pong-v5-20261202-150000 --episodes 30 --greedy
  rlbalance eval runs/ALE_Pong-v5-20261202-150000 --video            # and RUN/video.mp4 of one game
"""

from __future__ import annotations

import argparse
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
    p.add_argument("--seed", type=int, default=None, help="env and sampling seed; without it, one apart from "
                   "the run's training seeds")
    p.add_argument("--max-steps", type=int, default=10_000_000, help="give up after this many env steps")
    p.add_argument("--video", nargs="?", const="", default=None, metavar="MP4",
                   help="also record one game as an MP4 (to MP4, or RUN_DIR/video.mp4 without a path); "
                   "Atari at 15 frames/s, one frame per agent step")
    p.add_argument("--video-steps", type=int, default=10_000, help="--video: stop the game after this many agent steps")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from rlbalance.runtime.evaluate import evaluate

    video = None
    if args.video is not None:  # first: a run that cannot be recorded is refused before anything is written
        from rlbalance.runtime.evaluate import record_video

        video = record_video(args.run_dir, args.video or None, greedy=args.greedy, checkpoint=args.checkpoint,
                             device=args.device, seed=args.seed, max_steps=args.video_steps)
    r = evaluate(args.run_dir, episodes=args.episodes, num_envs=args.envs, greedy=args.greedy,
                 checkpoint=args.checkpoint, device=args.device, seed=args.seed, max_steps=args.max_steps)
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
    run_dir = Path(args.run_dir)
    print(f"wrote {run_dir / 'eval.json'}")
    if video is not None:
        v = video
        print(f"wrote {v['path']}: one game, return {v['return']:.1f}, {v['frames']} frames at {v['fps']:g} "
              f"frames/s ({v['seconds']:.1f} s){'' if v['game_over'] else ', cut at --video-steps'}")
    if (run_dir / "report.html").is_file():  # the run's report shows the evaluation too
        from rlbalance.telemetry.report import write_report

        print(f"updated {write_report(run_dir)}")
    return 0 if r["complete"] else 1
