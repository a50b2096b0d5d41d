"""Time to a score on CartPole: ours (the classic preset, 2 actors, central inference) against the CleanRL-style
PPO on EnvPool (rlbalance/bench/ppo_envpool.py), seed by seed, alternating, in one window.

  python -m rlbalance.bench.cartpole_race --seeds 4 --steps 300000 --target 475

For each run: the wall time and env steps at which the mean return of the last 100 episodes first reached the
target, counted from the start of training (ours: the session's start, the actor processes' start-up included;
the peer: its envs' creation), and the curve. Writes race.json, race.md and race.png. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path


def ours(seed: int, steps: int, target: float) -> dict:
    from rlbalance import config as C
    from rlbalance.runtime.train import train

    with tempfile.TemporaryDirectory() as tmp:
        cfg = C.build({"env": {"id": "CartPole-v1"}, "run": {"total_steps": steps, "seed": seed, "out_dir": tmp},
                       "telemetry": {"progress": False, "tensorboard": False, "report": False,
                                     "log_interval_s": 0.5}})
        cfg = replace(cfg, run=replace(cfg.run, name=f"race-{seed}"))
        s = train(cfg)
        recs = [json.loads(x) for x in (Path(s["run_dir"]) / "metrics.jsonl").read_text().splitlines() if x]
    curve = [(r["time_s"], r["steps"], r["episode_return"]) for r in recs if r.get("episode_return") is not None
             and r["episode_return"] == r["episode_return"]]
    hit = next((c for c in curve if c[2] >= target), None)
    return {"sps": s["sps_sustained"], "steps": s["steps"], "return_last100": s["episode_return_last100"],
            "seconds_to_target": hit[0] if hit else None, "steps_to_target": hit[1] if hit else None, "curve": curve}


def run(seeds: int, steps: int, target: float, out: Path, progress=print) -> dict:
    from rlbalance.bench.ppo_envpool import ppo_envpool_sps
    from rlbalance.core.jsonio import atomic_write_json
    from rlbalance.runtime.rundir import hardware_stamp

    runs: dict[str, list[dict]] = {"rlbalance": [], "ppo_envpool": []}
    for seed in range(seeds):
        progress(f"seed {seed}: rlbalance ...")
        runs["rlbalance"].append({"seed": seed, **ours(seed, steps, target)})
        progress(f"  {runs['rlbalance'][-1]['seconds_to_target']} s to {target:g}")
        progress(f"seed {seed}: PPO on EnvPool ...")
        runs["ppo_envpool"].append({"seed": seed, **ppo_envpool_sps(steps, seed=seed, target=target)})
        progress(f"  {runs['ppo_envpool'][-1]['seconds_to_target']} s to {target:g}")
    summary = {}
    for name, rs in runs.items():
        hits = [r["seconds_to_target"] for r in rs if r["seconds_to_target"] is not None]
        summary[name] = {"reached": len(hits), "seeds": len(rs), "median_seconds": statistics.median(hits) if hits
                         else None, "median_sps": statistics.median(r["sps"] for r in rs),
                         "median_steps_to_target": statistics.median(r["steps_to_target"] for r in rs
                                                                     if r["steps_to_target"]) if hits else None}
    a, b = summary["rlbalance"]["median_seconds"], summary["ppo_envpool"]["median_seconds"]
    stamp = hardware_stamp()
    doc = {"benchmark": "cartpole-race", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "hardware": stamp,
           "target": target, "steps": steps, "summary": summary, "peer_over_ours": (b / a) if a and b else None,
           "runs": runs}
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "race.json", doc)
    lines = [f"# CartPole: time to a mean of {target:g} ({doc['date']})", "",
             f"Machine: {stamp['cpu_model']}, {stamp['usable_cpus']} usable CPUs; commit {stamp['git_commit']}. "
             f"{seeds} seeds each, alternating, {steps:,} env steps per run, nothing else running.", "",
             "| trainer | reached | median seconds to target | median env steps to target | median SPS |",
             "|---|---|---|---|---|"]
    for name, sm in summary.items():
        sec = f"{sm['median_seconds']:.1f}" if sm["median_seconds"] else "-"
        st = f"{sm['median_steps_to_target']:,.0f}" if sm["median_steps_to_target"] else "-"
        lines.append(f"| {name} | {sm['reached']}/{sm['seeds']} | {sec} | {st} | {sm['median_sps']:,.0f} |")
    if doc["peer_over_ours"]:
        lines += ["", f"The peer takes {doc['peer_over_ours']:.2f}x our median time to {target:g}."]
    lines += ["", "| trainer | seed | seconds to target | steps to target | SPS | final mean |", "|---|---|---|---|---|---|"]
    for name, rs in runs.items():
        for r in rs:
            sec = f"{r['seconds_to_target']:.1f}" if r["seconds_to_target"] is not None else "-"
            st = f"{r['steps_to_target']:,}" if r["steps_to_target"] else "-"
            lines.append(f"| {name} | {r['seed']} | {sec} | {st} | {r['sps']:,.0f} | {r['return_last100']:.1f} |")
    (out / "race.md").write_text("\n".join(lines) + "\n")
    _plot(runs, target, out / "race.png", stamp["cpu_model"])
    return doc


def _plot(runs: dict, target: float, path: Path, cpu: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    for name, color in (("rlbalance", "tab:blue"), ("ppo_envpool", "tab:orange")):
        for i, r in enumerate(runs[name]):
            ax.plot([c[0] for c in r["curve"]], [c[2] for c in r["curve"]], color=color, lw=1, alpha=0.8,
                    label=name.replace("_", " on ").replace("ppo", "PPO").replace("envpool", "EnvPool") if i == 0
                    else None)
    ax.axhline(target, color="grey", ls=":", lw=1)
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("mean return, last 100 episodes")
    ax.set_title(f"CartPole-v1: time to {target:g}, one line per seed\n{cpu}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlbalance.bench.cartpole_race", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--steps", type=int, default=300_000)
    p.add_argument("--target", type=float, default=475.0)
    p.add_argument("--out", type=Path, default=Path("bench/results/cartpole-race"))
    a = p.parse_args(argv)
    doc = run(a.seeds, a.steps, a.target, a.out)
    print(json.dumps(doc["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
