"""A run that balances itself against the best static layout (``rlbalance bench balance``).

For one workload: a static sweep over the knobs the balancer moves (actors x envs per actor, and the inference wait
at the sweep's best), each point a real training run measured after warm-up; then run.balance=auto runs from
deliberately bad starts and from the sweep's best, each measured over its second half (the steps trained between the
middle and the end of the run, over that time), and beside each the same start with GA3C's method (run.balance=ga3c,
the anchor's random one-step moves every 20 s). Writes ``balance/balance-WORKLOAD.{json,md,png}``: each run's
second-half throughput against the best static point's, how soon it ran within 5% of it (``time_to``), when it
settled (its last kept move) and where.
"""

from __future__ import annotations

import itertools
import json
import statistics
import tempfile
import time
from pathlib import Path

from rlbalance import config as C
from rlbalance.core.jsonio import atomic_write_json
from rlbalance.runtime.rundir import hardware_stamp

WORKLOADS = {
    "cartpole": {"env": {"id": "CartPole-v1"}},
    "synthetic": {"env": {"id": "synthetic", "synthetic_step_us": 100.0}},
    "pong": {"env": {"id": "ALE/Pong-v5"}},
}
# the bad starts of issue 46: one actor of one env; more actors than cores with tiny inference batches; every core to
# actors where the learner is the bottleneck
STARTS = {"one-env": {"actors": 1, "envs": 1}, "oversubscribed-tiny": {"actors": 4, "envs": 2},
          "actor-heavy": {"actors": 4, "envs": 16}}


def _layout_cfg(base: dict, lay: dict, extra: dict) -> dict:
    return C.merge(base, {"actors": {"num_actors": lay["actors"], "envs_per_actor": lay["envs"]},
                          "inference": {"max_wait_ms": lay.get("wait_ms", 0.0)}}, extra)


def _second_half(run_dir: str) -> dict:
    recs = [json.loads(line) for line in open(Path(run_dir) / "metrics.jsonl")]
    recs = [r for r in recs if "time_s" in r and r.get("steps")]
    end = recs[-1]
    mid_t = recs[0]["time_s"] + (end["time_s"] - recs[0]["time_s"]) / 2
    mid = min(recs, key=lambda r: abs(r["time_s"] - mid_t))
    curve = [(r["time_s"] - recs[0]["time_s"], r.get("sps")) for r in recs]
    return {"sps": (end["steps"] - mid["steps"]) / max(end["time_s"] - mid["time_s"], 1e-9), "curve": curve}


def time_to(curve: list[tuple[float, float | None]], target: float, span_s: float = 30.0) -> float | None:
    """The first time ``t`` of a run's throughput curve [(seconds, steps/s)] at which it is at least ``target`` and
    stays there in the median of the next ``span_s`` seconds (the records in [t, t + span_s], a whole span measured):
    robust to one noisy record either way; None if never."""
    import statistics as st

    pts = [(t, v) for t, v in curve if v is not None]
    for t, v in pts:
        if t + span_s > pts[-1][0]:
            break
        if v >= target and st.median(u for w, u in pts if t <= w <= t + span_s) >= target:
            return t
    return None


def _train(cfg: dict, tmp: str, name: str) -> dict:
    from rlbalance.runtime.train import train

    over = {"run": {"out_dir": tmp, "name": name, "total_steps": 10**10},
            "telemetry": {"progress": False, "report": False, "tensorboard": False}}
    s = train(C.build(C.merge(cfg, over)))
    return s


def run_balance_bench(out: Path, workload: str = "cartpole", seconds: float = 150.0, static_seconds: float = 30.0,
                      repeats: int = 1, actors: tuple[int, ...] = (1, 2, 3), envs: tuple[int, ...] = (4, 8, 16),
                      starts: dict | None = None, extra: dict | None = None,
                      methods: tuple[str, ...] = ("auto", "ga3c")) -> dict:
    base, extra = WORKLOADS[workload], extra or {}
    starts = dict(starts or STARTS)
    res: dict = {"workload": workload, "config": base, "extra": extra, "hardware": hardware_stamp(),
                 "seconds_auto": seconds, "seconds_static": static_seconds, "repeats": repeats, "methods": methods,
                 "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "static": [], "auto": []}
    with tempfile.TemporaryDirectory(prefix="rlbalance-bench-balance-") as tmp:
        grid = [{"actors": a, "envs": k, "wait_ms": 0.0} for a, k in itertools.product(actors, envs)]
        for i, lay in enumerate(grid):
            runs = []
            for r in range(repeats):
                s = _train(C.merge(_layout_cfg(base, lay, extra), {"run": {"max_seconds": static_seconds}}), tmp,
                           f"static-{i}-{r}")
                runs.append(s["sps_sustained"])
                print(f"static {lay}: {s['sps_sustained']:,.0f} steps/s", flush=True)
            res["static"].append({**lay, "sps": runs, "median": statistics.median(runs)})
        best = max(res["static"], key=lambda p: p["median"])
        waited = {**{k: best[k] for k in ("actors", "envs")}, "wait_ms": 1.0}
        runs = [_train(C.merge(_layout_cfg(base, waited, extra), {"run": {"max_seconds": static_seconds}}), tmp,
                       f"static-wait-{r}")["sps_sustained"] for r in range(repeats)]
        res["static"].append({**waited, "sps": runs, "median": statistics.median(runs)})
        best = max(res["static"], key=lambda p: p["median"])
        res["best_static"] = best
        starts["best-static"] = {k: best[k] for k in ("actors", "envs", "wait_ms")}
        for name, lay in starts.items():
            for method in methods:
                cfg = C.merge(_layout_cfg(base, lay, extra), {"run": {"balance": method, "max_seconds": seconds}})
                s = _train(cfg, tmp, f"{method}-{name}")
                half = _second_half(s["run_dir"])
                b = s["balance"]
                kept = [m for m in b["moves"] if m.get("outcome") == "kept"]
                reached = time_to(half["curve"], 0.95 * best["median"])
                window = C.build(cfg).run.balance_window_s  # (both methods' windows in one unit)
                res["auto"].append({"method": method, "start_name": name, "start": b["start"], "final": b["final"],
                                    "second_half_sps": half["sps"], "of_best_static": half["sps"] / best["median"],
                                    "to_95_s": reached, "to_95_windows": None if reached is None else
                                    round(reached / window),
                                    "settled_s": kept[-1]["judged_t"] if kept else 0.0,
                                    "moves": len([m for m in b["moves"] if m.get("event") == "move"]),
                                    "kept": len(kept), "curve": half["curve"], "balance": b})
                print(f"{method} from {name} {lay}: second half {half['sps']:,.0f} steps/s = "
                      f"{half['sps'] / best['median']:.0%} of the best static; within 5% from "
                      f"{'never' if reached is None else f'{reached:.0f} s'}; final {b['final']}", flush=True)
    res["ended"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    folder = out / "balance"
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / f"balance-{workload}.json", res)
    (folder / f"balance-{workload}.md").write_text(_table(res))
    _plot(res, folder / f"balance-{workload}.png")
    return res


def _table(res: dict) -> str:
    hw = res["hardware"]
    best = res["best_static"]
    lines = [f"# run.balance=auto against the best static layout: {res['workload']}", "",
             f"{hw.get('cpu_model')} ({hw.get('usable_cpus')} usable CPUs), commit {hw.get('git_commit')}, "
             f"{res['started']}. Static points: {res['seconds_static']:g} s of training each, {res['repeats']} "
             f"run(s) a point, sustained steps/s after warm-up; balanced runs: {res['seconds_auto']:g} s, measured "
             "over their second half; *within 5% from*: the first time the run was at 95% of the best static median "
             "or more, and the median of its next 30 s too (in balance windows, run.balance_window_s); auto = ours, "
             "ga3c = GA3C's random one-step moves every 20 s.", "",
             "| static layout (actors x envs, wait) | steps/s (median) |", "|---|---:|"]
    for p in sorted(res["static"], key=lambda p: -p["median"]):
        lines.append(f"| {p['actors']} x {p['envs']}, {p['wait_ms']:g} ms | {p['median']:,.0f} |")
    lines += ["", f"Best static: {best['actors']} actors x {best['envs']} envs, wait {best['wait_ms']:g} ms: "
              f"{best['median']:,.0f} steps/s.", "",
              "| from | method | start | found | second half, steps/s | of best static | within 5% from (windows) "
              "| moves (kept) | last kept move at |",
              "|---|---|---|---|---:|---:|---:|---:|---:|"]
    for a in res["auto"]:
        def lay(d):
            return f"{d['actors']} x {d['envs']}, {d['threads']} thr, {d['wait_ms']:g} ms"
        to = "never" if a.get("to_95_s") is None else f"{a['to_95_s']:.0f} s ({a['to_95_windows']})"
        lines.append(f"| {a['start_name']} | {a.get('method', 'auto')} | {lay(a['start'])} | {lay(a['final'])} | "
                     f"{a['second_half_sps']:,.0f} | {a['of_best_static']:.0%} | {to} | {a['moves']} ({a['kept']}) | "
                     f"{a['settled_s']:.0f} s |")
    return "\n".join(lines) + "\n"


def _plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    for i, a in enumerate(res["auto"]):
        method = a.get("method", "auto")
        ax.plot([t for t, _ in a["curve"]], [v for _, v in a["curve"]], label=f"{method} from {a['start_name']}",
                ls="-" if method == "auto" else ":", color=f"C{i // len(res.get('methods', ('auto',)))}")
    ax.axhline(res["best_static"]["median"], color="k", ls="--", lw=1, label="best static (median)")
    ax.set_xlabel("seconds of training")
    ax.set_ylabel("steps/s")
    ax.set_ylim(bottom=0)
    ax.set_title(f"run.balance=auto (solid) and ga3c (dotted): {res['workload']} ({res['hardware'].get('cpu_model')})",
                 fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
