"""Learning reliability over seeds: the default CartPole config trained with N seeds (parallel actors,
central and/or actor-side inference), each run's curve of the mean return over the last 100 episodes.

Per run: best and final mean return, the env steps at which the mean first reached 400 and 475, sustained
SPS. Per mode: how many seeds reached 400 and 475, the median final return. Writes seeds.json, seeds.md,
seeds.csv (every curve) and seeds.png."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from rlbalance import config as C
from rlbalance.core.jsonio import dumps

THRESHOLDS = (400, 475)


def learning_curve(run_dir: str, key: str = "episode_return") -> list[tuple[int, float]]:
    """(env steps, mean return over the last 100 episodes) of every metrics record that has a return (``key``:
    episode_return_greedy for R2D2's least-exploring envs)."""
    recs = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [(r["steps"], r[key]) for r in recs if r.get(key) is not None]


def _first_reach(curve: list[tuple[int, float]], level: float) -> int | None:
    return next((s for s, r in curve if r >= level), None)


def run_seeds(out: Path, seeds: int, steps: int, modes: list[str], progress=print, extra: dict | None = None) -> dict:
    """``extra``: config overrides on top of the defaults (e.g. {"learner": {"max_grad_norm": 2.0}})."""
    from rlbalance.runtime.train import train

    runs = []
    for mode in modes:
        for seed in range(seeds):
            cfg = C.build(C.merge(extra or {}, {"inference": {"mode": mode}, "run": {
                "seed": seed, "total_steps": steps, "out_dir": str(out / "runs"),
                "name": f"seeds-{mode}-{seed}-{time.time_ns()}"},
                "telemetry": {"progress": False, "report": False, "tensorboard": False, "log_interval_s": 1.0}}))
            s = train(cfg)
            curve = learning_curve(s["run_dir"])
            run = {"mode": mode, "seed": seed, "best": max((r for _, r in curve), default=None),
                   "final": curve[-1][1] if curve else None, "sps": s["sps_sustained"],
                   **{f"steps_to_{lv}": _first_reach(curve, lv) for lv in THRESHOLDS}, "curve": curve}
            greedy = learning_curve(s["run_dir"], "episode_return_greedy")  # R2D2: the envs at epsilon <= 0.01
            if greedy:
                run.update(greedy_best=max(r for _, r in greedy), greedy_final=greedy[-1][1], greedy_curve=greedy)
            runs.append(run)
            progress(f"[seeds {mode}] seed {seed}: best {run['best']:.0f}, final {run['final']:.0f}, "
                     f"{run['sps']:,.0f} SPS")
    return write_results(out, runs, modes, steps, extra)


def write_results(out: Path, runs: list[dict], modes: list[str], steps: int, extra: dict | None = None) -> dict:
    """seeds.json, .csv, .md and .png in ``out`` for ``runs`` (each mode's seeds, from run_seeds, or merged from two
    of its results: ``merge``); returns the summary per mode."""
    summary = {}
    for mode in modes:
        rs = [r for r in runs if r["mode"] == mode]
        summary[mode] = {"seeds": len(rs), "median_final": statistics.median(r["final"] for r in rs),
                         "median_best": statistics.median(r["best"] for r in rs),
                         **{f"reached_{lv}": sum(r[f"steps_to_{lv}"] is not None for r in rs) for lv in THRESHOLDS}}
        if all("greedy_best" in r for r in rs):
            summary[mode].update(median_greedy_best=statistics.median(r["greedy_best"] for r in rs),
                                 median_greedy_final=statistics.median(r["greedy_final"] for r in rs),
                                 greedy_reached_475=sum(r["greedy_best"] >= 475 for r in rs))
    result = {"env": "CartPole-v1", "steps_per_run": steps, "config": "defaults (rlbalance train --help)",
              "overrides": extra or {},
              "summary": summary, "runs": runs}
    out.mkdir(parents=True, exist_ok=True)
    (out / "seeds.json").write_text(dumps(result))
    (out / "seeds.csv").write_text("mode,seed,steps,mean_return_last100\n" + "".join(
        f"{r['mode']},{r['seed']},{s},{v}\n" for r in runs for s, v in r["curve"]))
    _write_md(out / "seeds.md", result)
    _plot(out / "seeds.png", runs, modes, steps)
    return summary


def merge(parts: list[Path], out: Path) -> dict:
    """One result from results of the same config written apart (e.g. ``--modes central`` and ``--modes actor``
    runs, one after the other): their runs together, summarised and written to ``out``."""
    docs = [json.loads((p / "seeds.json").read_text()) for p in parts]
    if len({(d["steps_per_run"], json.dumps(d["overrides"], sort_keys=True)) for d in docs}) != 1:
        raise ValueError("the results to merge differ in steps per run or overrides")
    runs = [r for d in docs for r in d["runs"]]
    modes = list(dict.fromkeys(r["mode"] for r in runs))
    return write_results(out, runs, modes, docs[0]["steps_per_run"], docs[0]["overrides"] or None)


def _fmt(x) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _write_md(path: Path, result: dict) -> None:
    lines = ["# CartPole learning over seeds", "",
             f"The default config{' with ' + json.dumps(result['overrides']) if result['overrides'] else ''}, "
             f"{result['steps_per_run']:,} env steps per run, one run per seed and mode, "
             "parallel actors (this machine). Return = mean over the last 100 episodes.", "",
             "| mode | seeds | reached 400 | reached 475 | median best | median final |", "|---|---|---|---|---|---|"]
    for mode, s in result["summary"].items():
        lines.append(f"| {mode} | {s['seeds']} | {s['reached_400']} | {s['reached_475']} | {s['median_best']:.0f} | "
                     f"{s['median_final']:.0f} |")
    lines += ["", "| mode | seed | best | final | steps to 400 | steps to 475 | SPS |", "|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        lines.append(f"| {r['mode']} | {r['seed']} | {_fmt(r['best'])} | {_fmt(r['final'])} | "
                     f"{_fmt(r['steps_to_400'])} | {_fmt(r['steps_to_475'])} | {_fmt(r['sps'])} |")
    greedy = [r for r in result["runs"] if "greedy_best" in r]
    if greedy:
        lines += ["", "R2D2: the same runs' envs that explore least (ladder epsilon <= 0.01), whose returns are not "
                  "diluted by random actions (dashed in the plot):", "",
                  "| mode | seed | best | final |", "|---|---|---|---|"]
        lines += [f"| {r['mode']} | {r['seed']} | {_fmt(r['greedy_best'])} | {_fmt(r['greedy_final'])} |"
                  for r in greedy]
    path.write_text("\n".join(lines) + "\n")


def _plot(path: Path, runs: list[dict], modes: list[str], steps: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(modes), figsize=(5 * len(modes), 3.6), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        for r in (r for r in runs if r["mode"] == mode):
            line, = ax.plot([s for s, _ in r["curve"]], [v for _, v in r["curve"]], lw=1, label=f"seed {r['seed']}")
            if r.get("greedy_curve"):
                ax.plot([s for s, _ in r["greedy_curve"]], [v for _, v in r["greedy_curve"]], lw=1, ls="--",
                        color=line.get_color())
        for lv in THRESHOLDS:
            ax.axhline(lv, ls=":", color="0.5")
        ax.set_xlim(0, steps)
        ax.set_xlabel("env steps")
        ax.set_ylabel("mean return (last 100 episodes)")
        ax.set_title(f"CartPole-v1, {mode} inference")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
