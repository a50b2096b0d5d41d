"""Ray actors against shared-memory actors on this machine, in one bench run.

The same workload, actor count and config twice: actors as local processes over shared memory, and as
Ray actors on a private Ray on 127.0.0.1 (started once for the whole bench, so its start-up is not in
the figures; warm-up is excluded from both as in every run). Runs alternate between the two transports.
The overhead per env step is 1/SPS(ray) - 1/SPS(shm); one message carries K envs, so the overhead per
message is K times that.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

from rlbalance import config as C
from rlbalance.core.jsonio import dumps

WORKLOADS = {
    "cartpole": {"env": {"id": "CartPole-v1"}},
    "synthetic": {"env": {"id": "synthetic", "synthetic_step_us": 50.0}},
}


def run_ray_overhead(out: Path, workloads: list[str], actor_counts: list[int], steps: int,
                     envs_per_message: tuple[int, ...] = (8, 32), progress=print) -> Path:
    import os

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray

    from rlbalance.runtime.train import train

    ray.init(address="local", include_dashboard=False, object_store_memory=256 * 2**20,
             _node_ip_address="127.0.0.1", logging_level="WARNING",
             runtime_env={"env_vars": {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}})
    rows = []
    try:
        for w, k, n in itertools.product(workloads, envs_per_message, actor_counts):
            pair = {}
            order = ("shm", "ray") if n % 2 else ("ray", "shm")
            for transport in order:
                over = C.merge(WORKLOADS[w], {
                    "actors": {"num_actors": n, "envs_per_actor": k},
                    "learner": {"batch_size": max(16, k)},
                    "run": {"total_steps": steps, "out_dir": str(out / "runs"),
                            "name": f"ray-overhead-{w}-k{k}-{n}-{transport}-{time.time_ns()}"},
                    "telemetry": {"progress": False, "report": False, "tensorboard": False},
                    "ray": {"address": "local" if transport == "ray" else ""}})
                s = train(C.build(over))
                pair[transport] = s
                progress(f"[{w} K={k} {n} actors {transport}] {s['sps_sustained']:,.0f} SPS")
            shm, ry = pair["shm"]["sps_sustained"], pair["ray"]["sps_sustained"]
            per_step_us = 1e6 / ry - 1e6 / shm
            rows.append({"workload": w, "actors": n, "envs_per_message": k, "sps_shm": shm, "sps_ray": ry,
                         "ray_over_shm": ry / shm, "overhead_us_per_step": per_step_us,
                         "overhead_us_per_message": per_step_us * k,
                         "verdict_shm": pair["shm"]["verdict"], "verdict_ray": pair["ray"]["verdict"],
                         "return_shm": pair["shm"]["episode_return_last100"],
                         "return_ray": pair["ray"]["episode_return_last100"]})
    finally:
        ray.shutdown()
    return write(out, rows, steps)


def write(out: Path, rows: list[dict], steps: int) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    (out / "ray-overhead.json").write_text(dumps({"steps_per_run": steps, "rows": rows}))
    lines = ["# Ray actors against shared-memory actors", "",
             f"One bench run on this machine; {steps:,} env steps per run, warm-up excluded, a private Ray on "
             "127.0.0.1 started once; central inference, the default config otherwise; K envs per message (batch B = max(16, K)).", "",
             "| workload | actors | K | shm SPS | Ray SPS | Ray/shm | overhead per step | per message | "
             "verdict shm / Ray |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['actors']} | {r['envs_per_message']} | {r['sps_shm']:,.0f} | "
                     f"{r['sps_ray']:,.0f} | {r['ray_over_shm']:.2f} | {r['overhead_us_per_step']:,.0f} us | "
                     f"{r['overhead_us_per_message']:,.0f} us | {r['verdict_shm']} / {r['verdict_ray']} |")
    (out / "ray-overhead.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for w, k in sorted({(r["workload"], r["envs_per_message"]) for r in rows}):
        rs = [r for r in rows if r["workload"] == w and r["envs_per_message"] == k]
        ax.plot([r["actors"] for r in rs], [r["sps_shm"] for r in rs], "o-", label=f"{w} K={k}: shared memory")
        ax.plot([r["actors"] for r in rs], [r["sps_ray"] for r in rs], "s--", label=f"{w} K={k}: Ray actors")
    ax.set_xlabel("actors")
    ax.set_ylabel("sustained SPS")
    ax.set_yscale("log")
    ax.set_title("Ray against shared-memory actors (one run)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "ray-overhead.png", dpi=100)
    plt.close(fig)
    return out / "ray-overhead.md"
