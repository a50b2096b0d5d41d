"""Calibrate one workload (env + model) on this machine: env step cost per core, SMT effect, inference
latency and training step time against batch size, transport cost. Writes a calibration JSON.

  rlbalance calibrate --out calib/cartpole.json
  rlbalance calibrate --env.id ALE/Pong-v5 --out calib/pong.json
"""

from __future__ import annotations

import argparse
import json

from rlbalance import config as C
from rlbalance.cli.options import add_config_arguments, cli_overrides, read_config_file


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="calibration.json", help="calibration file to write")
    p.add_argument("--quick", action="store_true", help="fewer batch sizes (tests, smoke runs)")
    add_config_arguments(p)


def run(args: argparse.Namespace) -> int:
    from rlbalance.analysis.calibrate import run_calibration, save

    cfg = C.build(C.merge(read_config_file(args), cli_overrides(args)))
    cal = run_calibration(cfg, quick=args.quick, progress=lambda s: print(f"calibrate: {s}", flush=True))
    path = save(cal, args.out)
    print(json.dumps({k: cal[k] for k in ("env_step_us", "inference_ms", "train_step_ms", "pipe_round_trip_us",
                                          "copy_ns_per_byte")}, indent=1))
    print(f"wrote {path}")
    return 0
