"""Sweep a design space: every combination of the axes is a real training run of fixed length.

Results go to an SQLite database, one row per point; rerunning the same sweep skips finished points.

  rlbalance sweep --axis actors.num_actors=1,2,3,4 --steps 200000 --db sweep.db
  rlbalance sweep --axis actors.num_actors=1,2,3,4 --repeats 3 --db sweep.db   # 3 runs per point, spread drawn
  rlbalance sweep --axis cores=1,2 --axis actors.envs_per_actor=8,16 --dry-run
  rlbalance ratio --db sweep.db --out ratio/
"""

from __future__ import annotations

import argparse

from rlbalance import config as C
from rlbalance.cli.options import add_config_arguments, cli_overrides, read_config_file


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--axis", action="append", default=[], metavar="NAME=V1,V2",
                   help="a config field (section.field) or 'cores' (pin actors to N cores), with its values")
    p.add_argument("--steps", type=int, default=200_000, help="env steps per point (warm-up is excluded from FPS)")
    p.add_argument("--db", default="sweep.db", help="SQLite database of results")
    p.add_argument("--name", default="sweep", help="sweep name (rows are tagged with it)")
    p.add_argument("--repeats", type=int, default=1, help="runs per point, in rounds (the ratio analysis takes "
                   "their median and draws the spread); rerun with a larger N to add runs to a finished sweep")
    p.add_argument("--dry-run", action="store_true", help="print the points and exit")
    add_config_arguments(p)


def run(args: argparse.Namespace) -> int:
    from rlbalance.analysis.sweep import done_keys, expand, open_db, parse_axes, run_key, run_sweep

    base = C.merge(read_config_file(args), cli_overrides(args))
    axes = parse_axes(args.axis)
    if not axes:
        raise C.ConfigError("--axis: give at least one axis, e.g. --axis actors.num_actors=1,2,4")
    if args.repeats < 1:
        raise C.ConfigError(f"--repeats {args.repeats}: runs per point must be >= 1, e.g. --repeats 3")
    points = expand(base, axes, args.steps)
    if args.dry_run:
        import os

        done = done_keys(open_db(args.db)) if os.path.exists(args.db) else set()
        for i, p in enumerate(points):
            have = sum(run_key(p.key, r) in done for r in range(args.repeats))
            state = "done" if have == args.repeats else "todo"
            print(f"{i:3d} [{state}] {p.key} " + " ".join(f"{k}={v}" for k, v in p.values.items())
                  + (f" ({have}/{args.repeats} runs done)" if args.repeats > 1 else ""))
        print(f"{len(points)} points x {args.repeats} run{'s' if args.repeats > 1 else ''}, "
              f"{sum(run_key(p.key, r) in done for p in points for r in range(args.repeats))} runs already in {args.db}")
        return 0
    from rich.progress import Progress

    out_dir = (base.get("run") or {}).get("out_dir", "runs")
    with Progress() as bar:
        task = bar.add_task("sweep", total=len(points) * args.repeats)

        def progress(i, n, label):
            bar.update(task, completed=i, description=f"sweep {label}"[:70])

        rows = run_sweep(args.name, base, axes, args.steps, args.db, out_dir, progress, repeats=args.repeats)
    print(f"{len(rows)} runs of {len(points)} points in {args.db} (sweep {args.name!r}); "
          f"next: rlbalance ratio --db {args.db} --name {args.name}")
    return 0
