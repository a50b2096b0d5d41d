"""The CPU/GPU ratio from a sweep database: R per point, FPS per accelerator and per watt, the
throughput-optimal ratio (knee), the efficiency-optimal ratio, the Pareto front; HTML, CSV, plots."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default="sweep.db", help="SQLite database written by rlbalance sweep")
    p.add_argument("--name", default=None, help="only this sweep's rows (default: all)")
    p.add_argument("--out", default="ratio", help="output folder (ratio.html, ratio.csv, ratio.json, plots)")


def run(args: argparse.Namespace) -> int:
    from ..ratio import analyse, write_outputs
    from ..sweep import load_rows

    a = analyse(load_rows(args.db, args.name))
    page = write_outputs(a, args.out)
    for p in a["curve"]:
        print(f"R={p['R']:g}: {p['fps_per_accelerator']:,.0f} FPS/accelerator, {p['verdict']}")
    print(f"throughput-optimal R = {a['throughput_optimal_R']:g} ({a['knee_verdict']}); "
          f"efficiency-optimal R = {a['efficiency_optimal_R']} (power {a['power_source']})")
    print(f"wrote {page}")
    return 0
