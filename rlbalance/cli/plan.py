"""Predict throughput, bottleneck, power and the best CPU/GPU ratio of a calibrated workload on other
machines: the catalog (DGX-1, DGX-2, DGX A100, DGX H100, cloud instances) and machines you describe.
Every figure is modeled; --validate compares the model with measured sweep points.

  rlbalance plan --calibration calib/pong.json
  rlbalance plan --calibration calib/pong.json --systems dgx-a100,dgx-1
  rlbalance plan --calibration c.json --machine "mybox:cores=32,threads=64,gpus=2,gpu=A100,cpu_tdp_w=280,base_w=300"
  rlbalance plan --calibration c.json --validate sweep.db
"""

from __future__ import annotations

import argparse
import json

from rlbalance.core.jsonio import dumps as strict_dumps


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calibration", required=True, help="file written by rlbalance calibrate")
    p.add_argument("--catalog", default=None, help="systems YAML (default: the built-in catalog)")
    p.add_argument("--systems", default="", help="comma-separated catalog names (default: all)")
    p.add_argument("--machine", action="append", default=[], help="NAME:cores=..,threads=..,gpus=..,gpu=..,"
                   "cpu_tdp_w=..,base_w=..[,price_per_hour=..]")
    p.add_argument("--gpu-calibration", action="append", default=[], metavar="FILE",
                   help="a calibration of the same workload made on a GPU (rlbalance calibrate on that machine); "
                        "machines with that GPU model use its measured speed instead of the roofline estimate")
    p.add_argument("--validate", metavar="SWEEP_DB", help="compare predictions with measured sweep points (those of "
                   "the calibrated workload: points of other workloads in the database are left out and counted)")
    p.add_argument("--sweep", default=None, help="with --validate: only this sweep's points (default: all)")
    p.add_argument("--envs-per-actor", type=int, default=None, metavar="K",
                   help="predict with K envs per actor group (default: the calibrated workload's; a K the "
                        "calibration did not measure is flagged as extrapolated)")
    p.add_argument("--out", default=None, help="write plan.json (and plan.png) here")


def _parse_machine(text: str, catalog_data: dict):
    from rlbalance.analysis.catalog import parse_catalog
    from rlbalance.core.errors import ConfigError

    name, sep, rest = text.partition(":")
    if not sep:
        raise ConfigError(f"--machine {text!r}: expected NAME:cores=..,threads=..,gpus=..,...")
    fields = {}
    for kv in rest.split(","):
        k, eq, v = kv.partition("=")
        if not eq:
            raise ConfigError(f"--machine {text!r}: {kv!r} is not key=value")
        fields[k.strip()] = v.strip() if k.strip() in ("gpu", "description") else float(v) if "." in v else int(v)
    return parse_catalog({"gpus": catalog_data, "systems": {name: fields}}, "--machine")[name]


def run(args: argparse.Namespace) -> int:
    from rlbalance.analysis.calibrate import load
    from rlbalance.analysis.catalog import load_catalog
    from rlbalance.analysis.planner import best_ratios, predict, speed_for, validate
    from rlbalance.core.errors import ConfigError

    if args.sweep and not args.validate:
        raise ConfigError("--sweep NAME picks the points of --validate SWEEP_DB: give --validate too")
    if args.envs_per_actor is not None and args.validate:
        raise ConfigError("--envs-per-actor applies to predictions; --validate takes each point's own envs per actor")
    cal = load(args.calibration)
    k = args.envs_per_actor
    if k is not None:
        b = ((cal.get("config") or {}).get("learner") or {}).get("batch_size")
        if k < 1 or (b and b % k):
            raise ConfigError(f"--envs-per-actor {k}: must be >= 1" + (
                f" and divide the calibrated learner.batch_size={b} (an actor buffer holds K unrolls; e.g. "
                f"{', '.join(str(x) for x in range(1, b + 1) if b % x == 0)})" if b else " (e.g. 8)"))
    gpu_cals = [load(f) for f in args.gpu_calibration]
    if args.validate:
        from rlbalance.analysis.sweep import load_rows

        rows = load_rows(args.validate, args.sweep)
        if not rows:
            from rlbalance.analysis.sweep import sweep_names

            raise ConfigError(f"--validate {args.validate}: no sweep points" + (
                f" in sweep {args.sweep!r}; its sweeps: {sweep_names(args.validate)} (--sweep NAME)" if args.sweep
                else "; run rlbalance sweep first"))
        v = validate(cal, rows)
        for x in v["points"]:
            print(f"{json.dumps(x['point'])}: measured {x['measured_fps']:,.0f} FPS, predicted "
                  f"{x['predicted_fps']:,.0f} (range {x['predicted_fps_range'][0]:,.0f}-"
                  f"{x['predicted_fps_range'][1]:,.0f}{', extrapolated' if x['extrapolated'] else ''}; error "
                  f"{x['error']:.0%}); verdict {x['measured_verdict']} / {x['predicted_verdict']}")
        if v["skipped"]:
            print(f"left out {len(v['skipped'])} point(s) of other workloads, e.g. {v['skipped'][0]['key']}: "
                  f"{v['skipped'][0]['why']}")
        print(f"median absolute error {v['median_abs_error']:.1%}, worst {v['worst_abs_error']:.1%}")
        return 0
    catalog = load_catalog(args.catalog)
    chosen = [s for s in args.systems.split(",") if s] or list(catalog)
    unknown = [s for s in chosen if s not in catalog]
    if unknown:
        raise ConfigError(f"--systems: unknown {unknown}; the catalog has {sorted(catalog)}")
    machines = [catalog[s] for s in chosen]
    gpus_known = {m.gpu.name: {"fp32_tflops": m.gpu.fp32_tflops, "tdp_w": m.gpu.tdp_w, "idle_w": m.gpu.idle_w}
                  for m in catalog.values() if m.gpu}
    machines += [_parse_machine(t, gpus_known) for t in args.machine]
    from rich.console import Console
    from rich.table import Table

    k = args.envs_per_actor or cal["workload"]["envs_per_actor"]
    table = Table(title=f"rlbalance plan: {cal['workload']['env']} with {cal['workload']['model']}, {k} envs per "
                        "actor group (all modeled)")
    for col in ("system", "FPS", "FPS range", "verdict", "FPS/W", "$ per 1e9 frames", "actor threads/GPU wanted",
                "has"):
        table.add_column(col, justify="right")
    results = []
    for m in machines:
        speed = speed_for(cal, m, gpu_cals)
        p = predict(cal, m, speed=speed, envs_per_actor=args.envs_per_actor)
        r = best_ratios(cal, m, speed, envs_per_actor=args.envs_per_actor)
        results.append({"machine": m.name, "prediction": p, "ratios": {k: v for k, v in r.items() if k != "curve"},
                        "curve": [(c["actor_threads"], c["fps"], c["fps_per_watt"], *c["fps_range"])
                                  for c in r["curve"]]})
        cost = f"{p['cost_per_billion_frames']:,.2f}" if p["cost_per_billion_frames"] else "n/a"
        lo, hi = p["fps_range"]
        table.add_row(m.name + (" *" if p["extrapolated"] else ""), f"{p['fps']:,.0f}", f"{lo:,.0f}-{hi:,.0f}",
                      p["verdict"], f"{p['fps_per_watt']:,.1f}", cost, f"{r['throughput_optimal_R']:g}",
                      f"{r['has_R']:g}")
    Console().print(table)
    flagged = [(x["machine"], x["prediction"]["extrapolation"]) for x in results if x["prediction"]["extrapolated"]]
    if flagged:
        print("* extrapolated past what the calibration measured (the range spans the ways it can go on):")
        for name, why in flagged:
            print(f"  {name}: " + "; ".join(why))
    if args.out:
        from pathlib import Path

        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "plan.json").write_text(strict_dumps(results, indent=2))
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4))
        for r in results:
            acc = max(next(m for m in machines if m.name == r["machine"]).gpus, 1)
            xs = [c[0] / acc for c in r["curve"]]
            line, = ax.plot(xs, [c[1] / acc for c in r["curve"]], label=r["machine"])
            ax.fill_between(xs, [c[3] / acc for c in r["curve"]], [c[4] / acc for c in r["curve"]],
                            color=line.get_color(), alpha=0.12, lw=0)
        ax.set_xlabel("actor threads per accelerator (R)")
        ax.set_ylabel("predicted FPS per accelerator (modeled)")
        ax.set_title(f"{cal['workload']['env']}: predicted FPS per accelerator (bands: the FPS range)", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "plan.png", dpi=100)
        plt.close(fig)
        print(f"wrote {out / 'plan.json'} and {out / 'plan.png'}")
    return 0
