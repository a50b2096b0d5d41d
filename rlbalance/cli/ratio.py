"""The CPU/GPU ratio from a sweep database: R per point, FPS per accelerator and per watt, the
throughput-optimal ratio (knee), the efficiency-optimal ratio, the Pareto front; HTML, CSV, plots."""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default="sweep.db", help="SQLite database written by rlbalance sweep")
    p.add_argument("--name", default=None, help="the sweep to analyse (needed where the database holds several)")
    p.add_argument("--out", default="ratio", help="output folder (ratio.html, ratio.csv, ratio.json, plots)")


def run(args: argparse.Namespace) -> int:
    from rlbalance.analysis.ratio import analyse, write_outputs
    from rlbalance.analysis.sweep import load_rows, sweep_names
    from rlbalance.core.errors import ConfigError

    names = sweep_names(args.db)
    if args.name is None and len(names) > 1:  # points of different sweeps (workloads) are not one curve
        raise ConfigError(f"--name: {args.db} holds {len(names)} sweeps ({', '.join(names)}); "
                          f"analyse one at a time, e.g. --name {names[0]}")
    if args.name is not None and args.name not in names:
        raise ConfigError(f"--name {args.name!r}: no such sweep in {args.db}; it holds: {', '.join(names) or 'none'}")
    a = analyse(load_rows(args.db, args.name))
    page = write_outputs(a, args.out)
    for p in a["curve"]:
        spread = (f" ({p['fps_per_accelerator_min']:,.0f} to {p['fps_per_accelerator_max']:,.0f}, {p['runs']} runs)"
                  if p["runs"] > 1 else "")
        print(f"R={p['R']:g}: {p['fps_per_accelerator']:,.0f} FPS/accelerator{spread}, {p['verdict']}")
    knee = (f"{a['throughput_optimal_R']:g} ({a['knee_verdict']})" if a["throughput_optimal_R"] is not None
            else f"not bracketed (best swept: R={a['best_R_swept']:g})")
    print(f"throughput-optimal R = {knee}; efficiency-optimal R = {a['efficiency_optimal_R']} "
          f"(power {a['power_source']})")
    for w in a["warnings"]:
        print(f"warning: {w}")
    print(f"wrote {page}")
    return 0
