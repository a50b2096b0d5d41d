"""Planner validation over workloads of different shapes, as a user meets the planner: each workload is calibrated
once on this machine (``rlbalance calibrate``), then swept over actors 1..N in real training runs it never saw
(``rlbalance sweep``), and each point's measured FPS is compared with the prediction (``rlbalance plan
--validate``). Writes planner/planner-validation.md/.json/.png; the calibrations, the sweep database and the runs
stay beside them, and a killed bench resumes (finished calibrations and sweep runs are kept).

No constant of the model is fitted across workloads (every term comes from the workload's own calibration; the
roofline constants apply only to GPUs), so there is nothing to leave one workload out of: each workload's error is
already out of sample."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from rlbalance import config as C
from rlbalance.analysis.calibrate import load, run_calibration, save
from rlbalance.analysis.planner import validate
from rlbalance.analysis.sweep import load_rows, parse_axes, run_sweep, sweep_names
from rlbalance.core.jsonio import dumps

# Shapes the planner must carry over to: cheap and expensive envs, vector and pixel observations, small and large
# models, central and actor-side inference, discrete and continuous actions, the synthetic env at several costs.
WORKLOADS: dict[str, dict] = {
    "cartpole": {"env": {"id": "CartPole-v1"}},
    "acrobot": {"env": {"id": "Acrobot-v1"}},  # a Python env about 10x CartPole's cost per step, never tuned on
    "acrobot-actor-inference": {"env": {"id": "Acrobot-v1"}, "inference": {"mode": "actor"}},
    "cartpole-large-model": {"env": {"id": "CartPole-v1"}, "learner": {"hidden_sizes": [512, 512]}},
    "pendulum": {"env": {"id": "Pendulum-v1"}},  # continuous actions (the continuous preset)
    "synthetic-20us": {"env": {"id": "synthetic", "synthetic_step_us": 20.0}},
    "synthetic-300us": {"env": {"id": "synthetic", "synthetic_step_us": 300.0}},
    "pong": {"env": {"id": "ALE/Pong-v5"}},  # pixels, the Nature CNN
    # envs per actor swept instead of actors (2 actors): calibrated at the preset's K, predicted at others
    "cartpole-envs": {"env": {"id": "CartPole-v1"}},
    "acrobot-envs": {"env": {"id": "Acrobot-v1"}},
    "pong-envs": {"env": {"id": "ALE/Pong-v5"}},
}
# the axis a workload is swept over, where it is not actors 1..N; a K must divide learner.batch_size (16; Pong 32)
AXES: dict[str, str] = {"cartpole-envs": "actors.envs_per_actor=1,2,4,16",
                        "acrobot-envs": "actors.envs_per_actor=1,2,4,16",
                        "pong-envs": "actors.envs_per_actor=4,8,32"}
DEFAULT_WORKLOADS = tuple(WORKLOADS)
TARGET_MEDIAN, TARGET_WORST = 0.10, 0.25


def workload(name: str) -> dict:
    """A named workload's config overrides; any other name is an env id with its family's preset."""
    return WORKLOADS.get(name, {"env": {"id": name}})


def _slug(name: str) -> str:  # an env id as a file and run name (ALE/Pong-v5 -> ALE_Pong-v5)
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def parse_workloads(text: str) -> list[str]:
    """The workloads named (default: all of WORKLOADS): a planner workload, or any env id (its family's preset),
    which is made once here so that a wrong id is named before anything runs."""
    from rlbalance.envs.batch import probe_spec

    names = [w for w in text.split(",") if w] or list(DEFAULT_WORKLOADS)
    for w in names:
        if w in WORKLOADS:
            continue
        try:
            probe_spec(C.build(workload(w)).env)
        except C.ConfigError as e:
            raise C.ConfigError(f"--workloads: {w!r} is neither a planner workload ({', '.join(sorted(WORKLOADS))}) "
                                f"nor an env that can be made: {e}") from None
    return names


def run_validation(out: Path, actors: list[int], seconds: float, workloads: list[str] | tuple[str, ...] =
                   DEFAULT_WORKLOADS, repeats: int = 1, quick: bool = False) -> dict:
    """Calibrate each workload (once: a calibration file already in ``out`` is reused), sweep it over ``actors``
    with runs of ``seconds`` each (``repeats`` per point), and validate. ``quick``: the short calibration."""
    out = Path(out) / "planner"
    out.mkdir(parents=True, exist_ok=True)
    for w in workloads:  # every workload's config is checked before anything runs
        C.build(workload(w))
    results = {}
    for w in workloads:
        cal_path = out / f"calibration-{_slug(w)}.json"
        if cal_path.is_file():
            cal = load(cal_path)
            print(f"[{w}] calibration kept from {cal_path}", flush=True)
        else:
            cal = run_calibration(C.build(workload(w)), quick=quick,
                                  progress=lambda s, w=w: print(f"[{w}] calibrate: {s}", flush=True))
            save(cal, cal_path)
        base = C.merge(workload(w), {"run": {"max_seconds": seconds}})
        axis = AXES.get(w, f"actors.num_actors={','.join(map(str, actors))}")
        rows = run_sweep(f"validate-{_slug(w)}", base, parse_axes([axis]),
                         10**12, out / "sweep.db", str(out / "runs"), repeats=repeats,
                         progress=lambda i, n, label, w=w: print(f"[{w}] sweep {i}/{n} {label}", flush=True))
        results[w] = validate(cal, rows)
    # workloads validated in this folder before (a calibration and a sweep here): in the report as well
    done = {_slug(w) for w in results}
    for name in sweep_names(out / "sweep.db"):
        slug = name.removeprefix("validate-")
        if name.startswith("validate-") and slug not in done and (out / f"calibration-{slug}.json").is_file():
            results[slug] = validate(load(out / f"calibration-{slug}.json"), load_rows(out / "sweep.db", name))
    order = {w: i for i, w in enumerate(WORKLOADS)}
    results = dict(sorted(results.items(), key=lambda kv: order.get(kv[0], len(order))))
    return write_report(out, results, {"actors": actors, "seconds_per_run": seconds, "repeats": repeats,
                                       "quick_calibration": quick})


def summarise(results: dict) -> dict:
    """Per workload (``planner.validate``'s results, with their median and worst absolute error): how many measured
    points fell inside the predicted range; overall: the median, 90th percentile and worst error over every point
    (the median of an even count is the mean of the middle two), the worst workload median, and whether the targets
    are met."""
    for v in results.values():
        v["points_in_range"] = sum(bool(p.get("in_range")) for p in v["points"])
    every = [p["error"] for v in results.values() for p in v["points"]]
    medians = [v["median_abs_error"] for v in results.values()]
    p90 = statistics.quantiles(every, n=10)[-1] if len(every) > 1 else every[0]
    return {"workloads": len(results), "points": len(every), "median_abs_error": statistics.median(every),
            "worst_abs_error": max(every), "p90_abs_error": p90, "worst_workload_median": max(medians),
            "points_in_range": sum(v["points_in_range"] for v in results.values()),
            "targets": {"median_per_workload": TARGET_MEDIAN, "worst_overall": TARGET_WORST},
            "met": max(medians) <= TARGET_MEDIAN and max(every) <= TARGET_WORST}


def write_report(out: Path, results: dict, settings: dict | None = None) -> dict:
    """planner-validation.md/.json/.png from the per-workload validation results."""
    overall = summarise(results)
    s = settings or {}
    lines = ["# Planner validation", "",
             "Each workload calibrated once on this machine (`rlbalance calibrate`), then predicted for sweep points "
             "it was not fitted on (actors " + ",".join(map(str, s.get("actors", []))) + "; the *-envs workloads: "
             "2 actors, envs per actor as in each point, against a calibration at the preset's; real training runs of "
             f"{s.get('seconds_per_run', '?')} s each, {s.get('repeats', 1)} per point; a point's FPS is the median "
             "of its runs). Predictions are modeled; FPS measured. No model constant is fitted across workloads, so "
             "every error is out of sample. The range is the planner's FPS range (see rlbalance/planner.py).", "",
             "| workload | points | median abs error | worst | measured inside the range |", "|---|---|---|---|---|"]
    for w, v in results.items():
        lines.append(f"| {w} | {len(v['points'])} | {v['median_abs_error']:.1%} | {v['worst_abs_error']:.1%} | "
                     f"{v['points_in_range']}/{len(v['points'])} |")
    lines += ["", f"Overall: {overall['points']} points over {overall['workloads']} workloads, median "
              f"{overall['median_abs_error']:.1%}, 90th percentile {overall['p90_abs_error']:.1%} (the planner's "
              f"band, VALIDATED_ERROR), worst {overall['worst_abs_error']:.1%}; the worst workload median "
              f"{overall['worst_workload_median']:.1%}. Targets (median <= {TARGET_MEDIAN:.0%} on each workload, worst "
              f"<= {TARGET_WORST:.0%} overall): {'met' if overall['met'] else 'NOT met'}.", ""]
    for w, v in results.items():
        lines += [f"## {w}", "", "| point | measured FPS (min-max) | predicted FPS | range | error | "
                  "verdict measured / predicted |", "|---|---|---|---|---|---|"]
        for p in v["points"]:
            lo, hi = p.get("predicted_fps_range") or (p["predicted_fps"], p["predicted_fps"])
            spread = (f" ({p['measured_fps_min']:,.0f}-{p['measured_fps_max']:,.0f})" if p.get("runs", 1) > 1 else "")
            lines.append(f"| {json.dumps(p['point'])} | {p['measured_fps']:,.0f}{spread} | {p['predicted_fps']:,.0f}"
                         f"{' *' if p.get('extrapolated') else ''} | {lo:,.0f}-{hi:,.0f} | {p['error']:.0%} | "
                         f"{p['measured_verdict']} / {p['predicted_verdict']} |")
        lines.append("")
    lines.append("`*`: the prediction extrapolates past what the calibration measured.")
    (out / "planner-validation.md").write_text("\n".join(lines) + "\n")
    (out / "planner-validation.json").write_text(dumps({"settings": s, "overall": overall, "workloads": results},
                                                       indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5))
    for w, v in results.items():  # points with the measured runs' spread (min to max) as horizontal bars
        xs, ys = [p["measured_fps"] for p in v["points"]], [p["predicted_fps"] for p in v["points"]]
        spread = [[p["measured_fps"] - p.get("measured_fps_min", p["measured_fps"]) for p in v["points"]],
                  [p.get("measured_fps_max", p["measured_fps"]) - p["measured_fps"] for p in v["points"]]]
        ax.errorbar(xs, ys, xerr=spread, fmt="o", ms=4, lw=1, capsize=2, label=w, zorder=3)
    vals = [x for v in results.values() for p in v["points"] for x in (p["measured_fps"], p["predicted_fps"])]
    lo, hi = min(vals) / 1.5, max(vals) * 1.5
    ax.plot([lo, hi], [lo, hi], "k:", lw=1, zorder=2)
    ax.fill_between([lo, hi], [lo * (1 - TARGET_WORST), hi * (1 - TARGET_WORST)],
                    [lo * (1 + TARGET_WORST), hi * (1 + TARGET_WORST)], color="0.9", lw=0, label="+-25%", zorder=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured FPS")
    ax.set_ylabel("predicted FPS (modeled)")
    ax.set_title(f"Planner validation: median {overall['median_abs_error']:.0%}, worst "
                 f"{overall['worst_abs_error']:.0%} over {overall['workloads']} workloads", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "planner-validation.png", dpi=100)
    plt.close(fig)
    return overall
