"""Write (or rewrite) a run's self-contained HTML report and CSV files from its run directory."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="an rlbalance run directory")


def run(args: argparse.Namespace) -> int:
    from rlbalance.core.errors import ConfigError
    from rlbalance.telemetry.report import write_report

    run = Path(args.run_dir)
    if not (run / "metrics.jsonl").is_file():
        raise ConfigError(f"run_dir {run}: no metrics.jsonl there; is it an rlbalance run directory?")
    print(write_report(run))
    return 0
