"""Benchmark sweep: actors 1..N on CartPole and Pong (and any trainer workload, such as halfcheetah) on this machine, into bench/results/sweep/, with the
CPU/GPU ratio analysis (knee, efficiency optimum, Pareto front) of each workload."""

from __future__ import annotations

import json
from pathlib import Path

from rlbalance.analysis.ratio import analyse, write_outputs
from rlbalance.analysis.sweep import parse_axes, run_sweep
from rlbalance.bench.trainer import DEFAULT_STEPS, WORKLOADS


def run_bench_sweep(out: Path, actors: list[int], steps: int, workloads: str) -> dict:
    out = Path(out) / "sweep"
    out.mkdir(parents=True, exist_ok=True)
    db = out / "sweep.db"
    results = {}
    for w in [w for w in workloads.split(",") if w]:
        n = steps or DEFAULT_STEPS.get(w, 300_000)
        rows = run_sweep(f"bench-{w}", WORKLOADS[w], parse_axes([f"actors.num_actors={','.join(map(str, actors))}"]),
                         n, db, str(out / "runs"),
                         progress=lambda i, total, label: print(f"[sweep {w}] {i}/{total} {label}", flush=True))
        a = analyse(rows)
        write_outputs(a, out / w)
        results[w] = {"throughput_optimal_R": a["throughput_optimal_R"], "knee_bracketed": a["knee_bracketed"],
                      "best_R_swept": a["best_R_swept"], "warnings": a["warnings"], "knee_verdict": a["knee_verdict"],
                      "efficiency_optimal_R": a["efficiency_optimal_R"], "power_source": a["power_source"],
                      "accelerator": a["accelerator"], "curve": a["curve"]}
    path = out / "ratios.json"  # workloads swept in earlier runs keep their entries
    earlier = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**earlier, **results}, indent=2, allow_nan=False))
    return {w: {k: v for k, v in r.items() if k != "curve"} for w, r in results.items()}
