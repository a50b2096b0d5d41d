"""Train briefly, then capture a torch.profiler kernel view of inference and training.

Operators are grouped by kind (convolution, GEMM, elementwise, memory copy, optimizer, reduction),
with achieved FLOP/s where the profiler counts the FLOPs. Writes profile.json and report.html in
the run directory.

  rlbalance profile                                   # CartPole MLP
  rlbalance profile --env.id ALE/Pong-v5 --run.total_steps 2000
"""

from __future__ import annotations

import argparse
import sys

from rlbalance import config as C
from rlbalance.cli.options import add_config_arguments, cli_overrides, read_config_file


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, default=10, help="profiled iterations per phase (after 3 warm-up): inference passes and whole learner updates (each "
                   "learner.epochs x learner.minibatches optimizer steps); the training budget is --run.total_steps")
    add_config_arguments(p)


def run(args: argparse.Namespace) -> int:
    from rlbalance.analysis.profiling import profile_run

    over = C.merge({"run": {"total_steps": 20_000}}, read_config_file(args),
                   cli_overrides(args))
    cfg = C.build(over)
    prof, run_dir = profile_run(cfg, steps=args.steps)
    if "phases" not in prof:  # the training run stopped (Ctrl-C, SIGTERM) before the capture
        print(f"rlbalance profile: the run stopped before the kernel view was captured; see {run_dir}",
              file=sys.stderr)
        return 130
    for phase, g in prof["phases"].items():
        kinds = ", ".join(f"{k} {v:.3f} ms" for k, v in sorted(g["by_kind_ms"].items(), key=lambda kv: -kv[1]))
        flops = f", {g['achieved_flops'] / 1e9:.2f} GFLOP/s achieved" if g["achieved_flops"] else ""
        print(f"{phase}: {g['wall_ms_per_step']:.3f} ms/step on {prof['device']}{flops}\n  {kinds}")
    print(f"report: {run_dir / 'report.html'}")
    return 0
