"""The CPU/GPU ratio from a sweep: R per point, FPS per accelerator, FPS per watt of the node, the
throughput-optimal ratio (the knee), the efficiency-optimal ratio, and the Pareto front of FPS
against power. Definitions are those of docs/design.md (after DESIGN.md section 4):

- R = CPU hardware threads given to actors / learner accelerators (with no GPU the learner device is
  the CPU and R is actor cores per learner core set);
- throughput-optimal R: the smallest R whose FPS per accelerator is within 5% of the best measured;
- efficiency-optimal R: the R with the highest FPS per watt of the whole node.
"""

from __future__ import annotations

from .rundir import dumps as strict_dumps

import csv
import html
import json
from pathlib import Path

KNEE_TOLERANCE = 0.05


def analyse(rows: list[dict]) -> dict:
    if not rows:
        raise ValueError("no finished sweep points to analyse")
    pts = []
    for r in rows:
        R = r["actor_cores"] / max(r["accelerators"], 1)
        pts.append({**r, "R": R, "fps_per_accelerator": r["fps"] / max(r["accelerators"], 1)})
    by_r: dict[float, dict] = {}
    for p in pts:  # at each R, the best configuration found
        if p["R"] not in by_r or p["fps_per_accelerator"] > by_r[p["R"]]["fps_per_accelerator"]:
            by_r[p["R"]] = p
    best_fps = max(p["fps_per_accelerator"] for p in by_r.values())
    knee = min(R for R, p in by_r.items() if p["fps_per_accelerator"] >= (1 - KNEE_TOLERANCE) * best_fps)
    with_power = [p for p in pts if p.get("fps_per_watt")]
    eff = max(with_power, key=lambda p: p["fps_per_watt"]) if with_power else None
    pareto = []
    for p in sorted(with_power, key=lambda p: (p["node_power_w"], -p["fps"])):
        if not pareto or p["fps"] > pareto[-1]["fps"]:
            pareto.append(p)
    cuda = any(str(p["device"]).startswith("cuda") for p in pts)
    return {
        "points": pts,
        "curve": [{"R": R, "fps_per_accelerator": p["fps_per_accelerator"], "verdict": p["verdict"],
                   "fps_per_watt": p.get("fps_per_watt"), "key": p["key"]} for R, p in sorted(by_r.items())],
        "throughput_optimal_R": knee,
        "knee_verdict": by_r[knee]["verdict"],
        "efficiency_optimal_R": eff["R"] if eff else None,
        "power_source": eff["power_source"] if eff else None,
        "pareto": [{"R": p["R"], "fps": p["fps"], "node_power_w": p["node_power_w"], "key": p["key"]} for p in pareto],
        "accelerator": "GPU" if cuda else "CPU learner core set (no GPU: R is actor cores per learner core set)",
    }


def _verdict_legend(ax, colors: dict) -> None:
    for v, col in colors.items():
        ax.scatter([], [], color=col, label=v)
    ax.legend(fontsize=7)


def _plots(a: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"actor-bound": "tab:blue", "inference-bound": "tab:orange", "learner-bound": "tab:red",
              "transfer-bound": "tab:purple"}
    paths = []
    c = a["curve"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, key, label in ((axes[0], "fps_per_accelerator", "FPS per accelerator"),
                           (axes[1], "fps_per_watt", f"FPS per watt of the node ({a['power_source']})")):
        xs = [p["R"] for p in c if p.get(key) is not None]
        ys = [p[key] for p in c if p.get(key) is not None]
        ax.plot(xs, ys, "-", color="0.6")
        for p in c:
            if p.get(key) is not None:
                ax.scatter(p["R"], p[key], color=colors.get(p["verdict"], "k"), s=50, zorder=3)
        ax.set_xlabel("R = actor cores / accelerator")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].axvline(a["throughput_optimal_R"], ls="--", color="tab:green", label="throughput-optimal R")
    if a["efficiency_optimal_R"] is not None:
        axes[1].axvline(a["efficiency_optimal_R"], ls="--", color="tab:green", label="efficiency-optimal R")
        axes[1].legend(fontsize=7)
    _verdict_legend(axes[0], colors)
    fig.tight_layout()
    paths.append(out / "ratio.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    by_actors = sorted((json.loads(p["config"])["actors"]["num_actors"], p["fps"], p.get("fps_per_watt"), p["verdict"])
                       for p in a["points"])
    for ax, col, label in ((axes[0], 1, "FPS"), (axes[1], 2, f"FPS per watt of the node ({a['power_source']})")):
        pts = [(row[0], row[col], row[3]) for row in by_actors if row[col] is not None]
        ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], "-", color="0.6")
        for x, y, verdict in pts:
            ax.scatter(x, y, color=colors.get(verdict, "k"), s=50, zorder=3)
        ax.set_xlabel("actor processes")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
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
    fields = ["key", "R", "actor_cores", "accelerators", "device", "fps", "fps_per_accelerator", "sps",
              "node_power_w", "power_source", "fps_per_watt", "verdict", "policy_lag", "episode_return", "point"]
    with open(out / "ratio.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for p in a["points"]:
            w.writerow({**p, "point": json.dumps(p["point"])})
    (out / "ratio.json").write_text(strict_dumps({k: v for k, v in a.items() if k != "points"}, indent=2))
    imgs = "".join(f'<figure><img alt="{p.stem}" src="data:image/png;base64,'
                   f'{base64.b64encode(p.read_bytes()).decode()}"></figure>' for p in _plots(a, out))
    rows = "".join(f"<tr><td>{p['R']:g}</td><td>{html.escape(json.dumps(p['point']))}</td><td>{p['fps']:,.0f}</td>"
                   f"<td>{(p.get('fps_per_watt') or 0):,.1f}</td><td>{html.escape(str(p['verdict']))}</td></tr>"
                   for p in sorted(a["points"], key=lambda p: p["R"]))
    page = f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>rlbalance CPU/GPU ratio</title>
<style>body {{ font-family: system-ui, sans-serif; max-width: 1000px; margin: 2em auto; }}
td, th {{ padding: 2px 10px; border-bottom: 1px solid #ddd; text-align: left; }} img {{ max-width: 100%; }}</style>
</head><body><h1>CPU/GPU ratio</h1>
<p>Accelerator: {html.escape(a['accelerator'])}.</p>
<ul><li>Throughput-optimal R (smallest R within {KNEE_TOLERANCE:.0%} of the best FPS per accelerator):
<b id="knee">{a['throughput_optimal_R']:g}</b> (verdict there: {html.escape(a['knee_verdict'])})</li>
<li>Efficiency-optimal R (highest FPS per watt of the node, power {html.escape(str(a['power_source']))}):
<b id="eff">{a['efficiency_optimal_R'] if a['efficiency_optimal_R'] is not None else 'n/a'}</b></li></ul>
{imgs}
<table><tr><th>R</th><th>point</th><th>FPS</th><th>FPS/W</th><th>verdict</th></tr>{rows}</table>
</body></html>"""
    (out / "ratio.html").write_text(page)
    return out / "ratio.html"
