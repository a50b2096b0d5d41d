"""A task that needs memory: CartPole with its velocities hidden (rlbalance/CartPoleNoVelocity-v1), trained with an
LSTM core and with the same network without one, same settings (the env's preset), same seeds, serial runner.

Writes memory.json (per run: best and final last-100 mean, SPS, the curve), memory.md and memory.png (every
curve, mean return of the last 100 episodes against env steps)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rlbalance import config as C
from rlbalance.bench.seeds import learning_curve

ENV = "rlbalance/CartPoleNoVelocity-v1"
CORES = ("lstm", "none")


def run_memory(out: Path, seeds: int = 2, steps: int = 150_000, core_size: int = 64, progress=print,
               agent: str = "vtrace") -> dict:
    from rlbalance.runtime.train import train

    runs = []
    for seed in range(1, seeds + 1):
        for core in CORES:
            cfg = C.build({"env": {"id": ENV}, "learner": {"agent": agent, "core": core, "core_size": core_size},
                           "run": {"mode": "serial", "seed": seed, "total_steps": steps, "out_dir": str(out / "runs"),
                                   "name": f"memory-{core}-{seed}-{time.time_ns()}"},
                           "telemetry": {"progress": False, "report": False, "tensorboard": False,
                                         "log_interval_s": 1.0}})
            t0 = time.perf_counter()
            s = train(cfg)
            curve = learning_curve(s["run_dir"])
            run = {"core": core, "seed": seed, "best_last100": s["episode_return_best100"],
                   "final_last100": s["episode_return_last100"], "sps": s["sps_sustained"],
                   "minutes": round((time.perf_counter() - t0) / 60, 2), "curve": curve}
            runs.append(run)
            progress(f"[memory] {core} seed {seed}: best {run['best_last100']:.0f}, final {run['final_last100']:.0f}")
    from dataclasses import asdict

    base = C.build({"env": {"id": ENV}, "learner": {"agent": agent}})
    learner = {k: v for k, v in asdict(base.learner).items()
               if k not in ("core", "core_size")}  # (those two: per run, and core_size below)
    result = {"env": ENV, "agent": agent, "steps_per_run": steps, "runner": "serial", "core_size": core_size,
              "learner_settings": learner, **({"r2d2_settings": asdict(base.r2d2)} if agent == "r2d2" else {}),
              "runs": runs}
    out.mkdir(parents=True, exist_ok=True)
    (out / "memory.json").write_text(json.dumps(result, indent=1, allow_nan=False))
    lines = ["# A task that needs memory: CartPole without velocities", "",
             f"`rlbalance bench memory`: {ENV}, agent {agent}, {steps:,} env steps per run, serial runner, the env's preset "
             f"(learner settings in memory.json), LSTM core of {core_size} units against the same network "
             "without it. Return: mean of the last 100 episodes.", "",
             "| core | seed | best | final | SPS |", "|---|---|---|---|---|"]
    lines += [f"| {r['core']} | {r['seed']} | {r['best_last100']:.1f} | {r['final_last100']:.1f} | {r['sps']:,.0f} |"
              for r in runs]
    (out / "memory.md").write_text("\n".join(lines) + "\n")
    _plot(runs, out / "memory.png", steps, agent)
    return {k: v for k, v in result.items() if k != "runs"} | {
        "best": {f"{r['core']}-{r['seed']}": r["best_last100"] for r in runs}}


def _plot(runs: list[dict], path: Path, steps: int, agent: str = "vtrace") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in runs:
        xs, ys = zip(*r["curve"]) if r["curve"] else ((), ())
        ax.plot(xs, ys, color="tab:blue" if r["core"] == "lstm" else "tab:gray",
                linestyle="-" if r["seed"] == 1 else "--", label=f"{r['core']} seed {r['seed']}")
    ax.set_xlabel("env steps")
    ax.set_ylabel("mean return, last 100 episodes")
    ax.set_title(f"CartPole without velocities ({agent}): LSTM core against feed-forward ({steps:,} steps)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
