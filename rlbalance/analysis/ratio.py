"""The CPU/GPU ratio from a sweep: R per point, FPS per accelerator, FPS per watt of the node, the
throughput-optimal ratio (the knee), the efficiency-optimal ratio, and the Pareto front of FPS
against power. Definitions are those of docs/design.md (after DESIGN.md section 4):

- R = CPU hardware threads given to actors / learner accelerators (with no GPU the learner device is
  the CPU and R is actor cores per learner core set);
- throughput-optimal R: the smallest R whose FPS per accelerator is within 5% of the best measured, reported
  only where the sweep brackets it (a warning says how to extend a sweep that does not);
- efficiency-optimal R: the R with the highest FPS per watt of the whole node.

A point run several times (``rlbalance sweep --repeats N``) counts with the median of its runs; the plots draw
the spread (min to max) as error bars.
"""

from __future__ import annotations

import csv
import html
import json
from pathlib import Path

from rlbalance.analysis.sweep import combine_repeats
from rlbalance.core.jsonio import dumps as strict_dumps

KNEE_TOLERANCE = 0.05


def _points(rows: list[dict]) -> list[dict]:
    """One entry per sweep point (its runs combined, see ``sweep.combine_repeats``) with its R and FPS per
    accelerator."""
    pts = []
    for p in combine_repeats(rows):
        acc = max(p["accelerators"], 1)
        pts.append({**p, "R": p["actor_cores"] / acc, "fps_per_accelerator": p["fps"] / acc})
    return pts


def analyse(rows: list[dict]) -> dict:
    """The ratio analysis of one sweep's rows (one per run; a point's repeats are combined by their median).

    The knee is reported only where the sweep brackets it: a point past it shows FPS per accelerator no longer
    rising, and, when the smallest R swept is above one actor core per accelerator, the knee is not the smallest
    R. Otherwise ``throughput_optimal_R`` is None, ``knee_bracketed`` False, and a warning says which way to
    extend the sweep; an efficiency optimum at an edge of the sweep gets a warning too."""
    if not rows:
        raise ValueError("no finished sweep points to analyse")
    pts = _points(rows)
    by_r: dict[float, dict] = {}
    for p in pts:  # at each R, the best configuration found
        if p["R"] not in by_r or p["fps_per_accelerator"] > by_r[p["R"]]["fps_per_accelerator"]:
            by_r[p["R"]] = p
    rs = sorted(by_r)
    best_fps = max(p["fps_per_accelerator"] for p in by_r.values())
    knee = min(R for R, p in by_r.items() if p["fps_per_accelerator"] >= (1 - KNEE_TOLERANCE) * best_fps)
    warnings = []
    if len(rs) < 2:
        warnings.append(f"only one R was swept (R={rs[0]:g}): no knee can be found; sweep at least three values "
                        f"around it, e.g. --axis actors.num_actors=1,2,4")
        bracketed = False
    elif knee == rs[-1]:
        warnings.append(f"FPS per accelerator is still rising at the largest R swept (R={knee:g}): the "
                        f"throughput-optimal R is at least {knee:g}; extend the sweep to R > {knee:g}")
        bracketed = False
    elif knee == rs[0] and rs[0] > 1:
        warnings.append(f"the smallest R swept (R={knee:g}) is already within {KNEE_TOLERANCE:.0%} of the best "
                        f"FPS per accelerator: the throughput-optimal R is at most {knee:g}; extend the sweep to "
                        f"R < {knee:g}")
        bracketed = False
    else:
        bracketed = True
    with_power = [p for p in pts if p.get("fps_per_watt")]
    eff = max(with_power, key=lambda p: p["fps_per_watt"]) if with_power else None
    powered_rs = sorted({p["R"] for p in with_power})
    if eff is not None and len(powered_rs) > 1 and eff["R"] in (powered_rs[0], powered_rs[-1]) and not (
            eff["R"] == powered_rs[0] and eff["R"] <= 1):
        side = ">" if eff["R"] == powered_rs[-1] else "<"
        warnings.append(f"the highest FPS per watt is at an edge of the sweep (R={eff['R']:g}): the "
                        f"efficiency-optimal R may lie beyond it; extend the sweep to R {side} {eff['R']:g}")
    pareto = []
    for p in sorted(with_power, key=lambda p: (p["node_power_w"], -p["fps"])):
        if not pareto or p["fps"] > pareto[-1]["fps"]:
            pareto.append(p)
    cuda = any(str(p["device"]).startswith("cuda") for p in pts)
    return {
        "points": pts,
        "curve": [{"R": R, "fps_per_accelerator": p["fps_per_accelerator"],
                   "fps_per_accelerator_min": p["fps_min"] / max(p["accelerators"], 1),
                   "fps_per_accelerator_max": p["fps_max"] / max(p["accelerators"], 1), "runs": p["runs"],
                   "verdict": p["verdict"], "fps_per_watt": p.get("fps_per_watt"), "key": p["key"]}
                  for R, p in sorted(by_r.items())],
        "throughput_optimal_R": knee if bracketed else None,
        "knee_bracketed": bracketed,
        "best_R_swept": knee,
        "knee_verdict": by_r[knee]["verdict"] if bracketed else None,
        "efficiency_optimal_R": eff["R"] if eff else None,
        "power_source": eff["power_source"] if eff else None,
        "pareto": [{"R": p["R"], "fps": p["fps"], "node_power_w": p["node_power_w"], "key": p["key"]} for p in pareto],
        "accelerator": "GPU" if cuda else "CPU learner core set (no GPU: R is actor cores per learner core set)",
        "r_label": "R = actor cores per GPU" if cuda else "R = actor cores per learner core set (no GPU)",
        "repeats": max(p["runs"] for p in pts),
        "warnings": warnings,
    }


def _verdict_legend(ax, colors: dict) -> None:
    for v, col in colors.items():
        ax.scatter([], [], color=col, label=v)
    ax.legend(fontsize=7)


def _integer_ticks(ax, values) -> None:
    """Whole-number ticks on the x axis where every value on it is a whole number."""
    from matplotlib.ticker import MaxNLocator

    if values and all(float(v).is_integer() for v in values):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


COLORS = {"actor-bound": "tab:blue", "inference-bound": "tab:orange", "learner-bound": "tab:red",
          "transfer-bound": "tab:purple"}


def _spread_note(a: dict) -> str:
    return f", median of {a['repeats']} runs per point (bars: min to max)" if a["repeats"] > 1 else ""


def ratio_figure(a: dict):
    """FPS per accelerator and FPS per watt of the node against R (the spread of repeated points as error bars,
    the knee or, where the sweep does not bracket it, the best R swept)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = a["curve"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    colors = COLORS
    spread = _spread_note(a)
    for ax, key, label in ((axes[0], "fps_per_accelerator", "FPS per accelerator"),
                           (axes[1], "fps_per_watt", f"FPS per watt of the node ({a['power_source']})")):
        shown = [p for p in c if p.get(key) is not None]
        ax.plot([p["R"] for p in shown], [p[key] for p in shown], "-", color="0.6")
        for p in shown:
            ax.scatter(p["R"], p[key], color=colors.get(p["verdict"], "k"), s=50, zorder=3)
        if key == "fps_per_accelerator" and a["repeats"] > 1:
            ax.errorbar([p["R"] for p in shown], [p[key] for p in shown],
                        yerr=[[p[key] - p["fps_per_accelerator_min"] for p in shown],
                              [p["fps_per_accelerator_max"] - p[key] for p in shown]],
                        fmt="none", ecolor="0.3", capsize=4, zorder=2)
        ax.set_xlabel(a["r_label"])
        ax.set_ylabel(label)
        _integer_ticks(ax, [p["R"] for p in shown])
        ax.grid(alpha=0.3)
    axes[0].set_title("Throughput per accelerator" + spread, fontsize=9)
    axes[1].set_title("Power efficiency of the node", fontsize=9)
    if a["throughput_optimal_R"] is not None:
        axes[0].axvline(a["throughput_optimal_R"], ls="--", color="tab:green", label="throughput-optimal R")
    else:
        axes[0].axvline(a["best_R_swept"], ls=":", color="tab:gray", label="best R swept (knee not bracketed)")
    if a["efficiency_optimal_R"] is not None:
        axes[1].axvline(a["efficiency_optimal_R"], ls="--", color="tab:green", label="efficiency-optimal R")
        axes[1].legend(fontsize=7)
    _verdict_legend(axes[0], colors)
    fig.tight_layout()
    return fig


def _plots(a: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = COLORS
    spread = _spread_note(a)
    paths = []
    fig = ratio_figure(a)
    paths.append(out / "ratio.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    by_actors = sorted((json.loads(p["config"])["actors"]["num_actors"], p["fps"], p.get("fps_per_watt"), p["verdict"],
                        p["fps_min"], p["fps_max"]) for p in a["points"])
    for ax, col, label in ((axes[0], 1, "FPS"), (axes[1], 2, f"FPS per watt of the node ({a['power_source']})")):
        pts = [row for row in by_actors if row[col] is not None]
        ax.plot([row[0] for row in pts], [row[col] for row in pts], "-", color="0.6")
        for row in pts:
            ax.scatter(row[0], row[col], color=colors.get(row[3], "k"), s=50, zorder=3)
        if col == 1 and a["repeats"] > 1:
            ax.errorbar([row[0] for row in pts], [row[1] for row in pts],
                        yerr=[[row[1] - row[4] for row in pts], [row[5] - row[1] for row in pts]],
                        fmt="none", ecolor="0.3", capsize=4, zorder=2)
        ax.set_xlabel("actor processes")
        ax.set_ylabel(label)
        _integer_ticks(ax, [row[0] for row in pts])
        ax.grid(alpha=0.3)
    axes[0].set_title("End-to-end FPS against actor processes" + spread, fontsize=9)
    axes[1].set_title("FPS per watt against actor processes", fontsize=9)
    _verdict_legend(axes[0], colors)
    fig.tight_layout()
    paths.append(out / "fps_vs_actors.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 3.8))
    pts = [p for p in a["points"] if p.get("node_power_w")]
    ax.scatter([p["node_power_w"] for p in pts], [p["fps"] for p in pts], color="0.6", label="points")
    ax.plot([p["node_power_w"] for p in a["pareto"]], [p["fps"] for p in a["pareto"]], "o-", color="tab:red",
            label="Pareto front")
    ax.set_xlabel(f"node power, W ({a['power_source']})")
    ax.set_ylabel("FPS")
    ax.set_title("FPS against node power: the Pareto front", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths.append(out / "pareto.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths


def write_outputs(a: dict, out: str | Path) -> Path:
    import base64

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fields = ["key", "R", "actor_cores", "accelerators", "device", "fps", "fps_min", "fps_max", "runs",
              "fps_per_accelerator", "sps", "node_power_w", "power_source", "fps_per_watt", "verdict", "policy_lag",
              "episode_return", "point", "stage_shares"]
    with open(out / "ratio.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for p in a["points"]:
            w.writerow({**p, "point": json.dumps(p["point"]), "stage_shares": json.dumps(p.get("stage_shares") or {})})
    (out / "ratio.json").write_text(strict_dumps({k: v for k, v in a.items() if k != "points"}, indent=2))
    imgs = "".join(f'<figure><img alt="{p.stem}" src="data:image/png;base64,'
                   f'{base64.b64encode(p.read_bytes()).decode()}"></figure>' for p in _plots(a, out))
    rows = "".join(f"<tr><td>{p['R']:g}</td><td>{html.escape(json.dumps(p['point']))}</td><td>{p['fps']:,.0f}</td>"
                   f"<td>{p['fps_min']:,.0f} to {p['fps_max']:,.0f} ({p['runs']} run{'s' if p['runs'] > 1 else ''})"
                   f"</td><td>{(p.get('fps_per_watt') or 0):,.1f}</td><td>{html.escape(str(p['verdict']))}</td></tr>"
                   for p in sorted(a["points"], key=lambda p: p["R"]))
    if a["throughput_optimal_R"] is not None:
        knee = (f'<b id="knee">{a["throughput_optimal_R"]:g}</b> (verdict there: '
                f'{html.escape(str(a["knee_verdict"]))})')
    else:
        knee = (f'<b id="knee">not bracketed</b> (the best FPS per accelerator swept is at R={a["best_R_swept"]:g}, '
                f'an edge of the sweep)')
    warnings = "".join(f'<p class="warning" id="edge-warning-{i}"><b>Warning:</b> {html.escape(w)}</p>'
                       for i, w in enumerate(a["warnings"]))
    page = f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>rlbalance CPU/GPU ratio</title>
<style>body {{ font-family: system-ui, sans-serif; max-width: 1000px; margin: 2em auto; }}
td, th {{ padding: 2px 10px; border-bottom: 1px solid #ddd; text-align: left; }} img {{ max-width: 100%; }}
.warning {{ background: #fff3cd; border-left: 4px solid #d39e00; padding: 6px 10px; }}</style>
</head><body><h1>CPU/GPU ratio</h1>
<p>Accelerator: {html.escape(a['accelerator'])}. {html.escape(a['r_label'])}.</p>
{warnings}
<ul><li>Throughput-optimal R (smallest R within {KNEE_TOLERANCE:.0%} of the best FPS per accelerator):
{knee}</li>
<li>Efficiency-optimal R (highest FPS per watt of the node, power {html.escape(str(a['power_source']))}):
<b id="eff">{a['efficiency_optimal_R'] if a['efficiency_optimal_R'] is not None else 'n/a'}</b></li></ul>
{imgs}
<table><tr><th>R</th><th>point</th><th>FPS (median)</th><th>spread</th><th>FPS/W</th><th>verdict</th></tr>{rows}</table>
</body></html>"""
    (out / "ratio.html").write_text(page)
    return out / "ratio.html"
