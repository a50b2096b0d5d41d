"""A self-contained HTML report per run (plots embedded as PNG), plus CSV of the same data."""

from __future__ import annotations

import base64
import csv
import html
import io
import json
from pathlib import Path


def _load(run: Path) -> dict:
    d = {"metrics": [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]}
    for name in ("summary", "telemetry", "config", "meta", "profile", "eval"):
        p = run / f"{name}.json"
        d[name] = json.loads(p.read_text()) if p.is_file() else {}
    return d


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _plots(d: dict) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = []
    m = d["metrics"]
    steps = [r["steps"] for r in m]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot(steps, [r["fps"] for r in m], color="tab:blue")
    ax.set_xlabel("env steps")
    ax.set_ylabel("FPS", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(steps, [r.get("episode_return") if r.get("episode_return") is not None else float("nan") for r in m],
             color="tab:green")
    ax2.set_ylabel("mean return (last 100)", color="tab:green")
    ax.set_title("Throughput and return")
    fig.tight_layout()
    plots.append(("Throughput and return", _png(fig)))

    node_keys = sorted({k for r in m for k in r if k.startswith("ray/node") and k.endswith("_cpu_util")})
    if node_keys:  # Ray actors: each node's CPU utilisation, as its actors report it
        fig, ax = plt.subplots(figsize=(7, 3.0))
        for k in node_keys:
            pts = [(r["steps"], r[k]) for r in m if k in r]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=k.removeprefix("ray/").removesuffix("_cpu_util"))
        ax.set_xlabel("env steps")
        ax.set_ylabel("node CPU utilisation")
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize=7)
        ax.set_title("Ray nodes: CPU utilisation")
        fig.tight_layout()
        plots.append(("Ray nodes: CPU utilisation", _png(fig)))

    shares = d["telemetry"].get("stage_shares", {})
    if shares:
        fig, ax = plt.subplots(figsize=(7, 0.6 + 0.7 * len(shares)))
        roles = sorted(shares)
        for i, role in enumerate(roles):
            left = 0.0
            for stage, v in sorted(shares[role].items(), key=lambda kv: -kv[1]):
                ax.barh(i, v, left=left, edgecolor="white")
                if v > 0.04:
                    ax.text(left + v / 2, i, f"{stage}\n{v:.0%}", ha="center", va="center", fontsize=7)
                left += v
        ax.set_yticks(range(len(roles)), roles)
        ax.set_xlim(0, 1.05)
        ax.set_xlabel("share of the role's wall time (after warm-up)")
        ax.set_title("Stage breakdown per role")
        fig.tight_layout()
        plots.append(("Stage breakdown", _png(fig)))

    tl = d["telemetry"].get("hardware_timeline", [])
    if tl:
        t = [s["t"] for s in tl]
        fig, ax = plt.subplots(figsize=(7, 3.2))
        ncores = len(tl[0]["cpu_per_core"])
        for c in range(ncores):
            ax.plot(t, [s["cpu_per_core"][c] for s in tl], lw=0.8, alpha=0.6, label=f"core {c}" if ncores <= 8 else None)
        for role in sorted({r for s in tl for r in s["proc_cpu"]}):
            ax.plot(t, [s["proc_cpu"].get(role, 0.0) for s in tl], lw=2, label=f"{role} (cores used)")
        if any(s["gpu_util"] for s in tl):
            ax.plot(t, [sum(s["gpu_util"]) / max(len(s["gpu_util"]), 1) for s in tl], lw=2, ls="--", label="GPU util")
        ax.set_xlabel("seconds")
        ax.set_ylabel("utilization / cores")
        ax.legend(fontsize=7, ncol=3)
        ax.set_title("Utilization over time (measured)")
        fig.tight_layout()
        plots.append(("Utilization over time", _png(fig)))

        fig, ax = plt.subplots(figsize=(7, 3.0))
        ax.plot(t, [s["cpu_power_w"] for s in tl], label=f"CPU ({tl[-1]['cpu_power_source']})")
        ax.plot(t, [s["gpu_power_w"] for s in tl], label=f"GPU ({tl[-1]['gpu_power_source']})")
        ax.set_xlabel("seconds")
        ax.set_ylabel("watts")
        ax.legend(fontsize=8)
        ax.set_title("Power over time")
        fig.tight_layout()
        plots.append(("Power over time", _png(fig)))

    hist = d["telemetry"].get("inference_batch_sizes", {})
    if hist:
        fig, ax = plt.subplots(figsize=(7, 2.8))
        ax.bar([int(k) for k in hist], list(hist.values()), width=max(1, min(int(k) for k in hist) * 0.8))
        ax.set_xlabel("envs per forward pass")
        ax.set_ylabel("forward passes")
        ax.set_title("Inference batch sizes")
        fig.tight_layout()
        plots.append(("Inference batch sizes", _png(fig)))

    kernels = d["profile"].get("phases", {})
    if kernels:
        fig, ax = plt.subplots(figsize=(7, 3.0))
        phases = sorted(kernels)
        kinds = sorted({k for p in phases for k in kernels[p]["by_kind_ms"]})
        for j, kind in enumerate(kinds):
            ax.bar([i + j * 0.8 / len(kinds) for i in range(len(phases))],
                   [kernels[p]["by_kind_ms"].get(kind, 0.0) for p in phases], width=0.8 / len(kinds), label=kind)
        ax.set_xticks([i + 0.4 for i in range(len(phases))], phases)
        ax.set_ylabel("ms per step")
        ax.legend(fontsize=7, ncol=3)
        ax.set_title("Kernel time by operator kind")
        fig.tight_layout()
        plots.append(("Kernel breakdown", _png(fig)))
    return plots


def _fmt(v) -> str:
    if isinstance(v, dict) and "value" in v:
        return f"{_fmt(v['value'])} <span class=src>{html.escape(v.get('source', ''))}</span>"
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return html.escape(str(v))


def write_csv(run: Path, d: dict | None = None) -> None:
    d = d or _load(run)
    with open(run / "stage_shares.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["role", "stage", "share"])
        for role, st in sorted(d["telemetry"].get("stage_shares", {}).items()):
            for stage, v in sorted(st.items()):
                w.writerow([role, stage, f"{v:.6f}"])
    tl = d["telemetry"].get("hardware_timeline", [])
    with open(run / "hardware.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s", "cpu_util_mean", "cpu_power_w", "cpu_power_source", "gpu_power_w", "gpu_power_source"])
        for s in tl:
            w.writerow([f"{s['t']:.3f}", f"{sum(s['cpu_per_core']) / len(s['cpu_per_core']):.4f}",
                        f"{s['cpu_power_w']:.2f}", s["cpu_power_source"], f"{s['gpu_power_w']:.2f}",
                        s["gpu_power_source"]])


def write_report(run: str | Path) -> Path:
    run = Path(run)
    d = _load(run)
    write_csv(run, d)
    s, tel, hw = d["summary"], d["telemetry"], d["meta"].get("hardware", {})
    v = tel.get("verdict", {})
    rows = [("outcome", s.get("outcome")), ("env", s.get("env")), ("mode", f"{s.get('mode')}, {s.get('inference')} inference"),
            ("model / device", f"{s.get('model')} on {s.get('device')}"), ("env steps", s.get("steps")),
            ("sustained FPS", s.get("fps_sustained")), ("sustained SPS", s.get("sps_sustained")),
            ("mean return (last 100)", s.get("episode_return_last100")), ("CPU utilization (mean)", s.get("cpu_util_mean")),
            ("node power", s.get("node_power_w")), ("FPS per watt", s.get("fps_per_watt")),
            ("actor restarts", s.get("actor_restarts")), ("actor-seconds lost", s.get("actor_seconds_lost"))]
    if s.get("actors_on") == "ray":
        rows.append(("actors on", "Ray"))
        for node, n in (s.get("nodes") or {}).items():
            util = n.get("node_cpu_util_mean")
            rows.append((f"Ray node {node}", f"actors {n['actors']}, actor CPU {n['actor_cpu_seconds']:.1f} s"
                         + (f", node CPU {util:.0%} (mean)" if util is not None else "")))
    e = d["eval"]
    if e and e.get("episodes"):
        rows.append((f"evaluation ({e['policy']} policy, checkpoint at {e['checkpoint_steps']:,} steps)",
                     f"return {e['return_mean']:.1f} +- {e['return_std']:.1f} over {e['episodes']} games "
                     f"(min {e['return_min']:.1f}, max {e['return_max']:.1f}): rlbalance eval"))
    for ev in s.get("actor_faults", []):
        rows.append((f"actor {ev['actor']} fault at {ev['at']}", ev["reason"]))
    for key, val in tel.get("latency_ms", {}).items():
        if val is not None:
            rows.append((key.replace("_", " "), val))
    if tel.get("transport"):
        rows.append(("shared-memory transport, bytes/s", {"value": tel["transport"]["bytes_per_s"],
                                                           "source": "derived"}))
    for key in ("cpu_power_w", "gpu_power_w", "base_power_w", "energy_cpu_j", "energy_gpu_j"):
        if key in tel.get("hardware", {}):
            rows.append((key.replace("_", " "), tel["hardware"][key]))
    table = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{_fmt(val)}</td></tr>" for k, val in rows if val is not None)
    figs = "\n".join(f'<figure><img alt="{html.escape(t)}" src="data:image/png;base64,{b}"><figcaption>'
                     f"{html.escape(t)}</figcaption></figure>" for t, b in _plots(d))
    evidence = "".join(f"<li>{html.escape(k)}: {_fmt(val)}</li>" for k, val in v.get("figures", {}).items())
    machine = (f"{html.escape(str(hw.get('cpu_model', '?')))}, {hw.get('physical_cores', '?')} cores / "
               f"{hw.get('logical_cpus', '?')} threads, GPUs: {html.escape(str([g['name'] for g in hw.get('gpus', [])] or 'none'))}, "
               f"commit {html.escape(str(hw.get('git_commit', '?')))}")
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>rlbalance report: {html.escape(str(s.get('env')))}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 960px; margin: 2em auto; color: #222; }}
table {{ border-collapse: collapse; }} th, td {{ text-align: left; padding: 2px 12px; border-bottom: 1px solid #ddd; }}
.verdict {{ background: #f4f6fb; border-left: 6px solid #3366cc; padding: 0.6em 1em; }}
.src {{ font-size: 75%; color: #fff; background: #888; border-radius: 3px; padding: 0 4px; }}
figure {{ margin: 1em 0; }} img {{ max-width: 100%; }}
</style></head><body>
<h1>rlbalance run report</h1>
<p>{machine}</p>
<div class="verdict" id="verdict"><h2>Bottleneck: {html.escape(str(v.get('verdict', 'n/a')))}</h2>
<p><b>Evidence:</b> {html.escape(str(v.get('evidence', '')))}</p>
<p><b>What to change:</b> {html.escape(str(v.get('advice', '')))}</p>
<ul>{evidence}</ul></div>
<h2>Summary</h2><table id="summary">{table}</table>
<p>Figures marked <span class=src>measured</span> were read from counters (psutil, NVML, RAPL);
<span class=src>modeled</span> ones come from the power model in the run's config (telemetry.*_watts).</p>
<h2>Plots</h2>
{figs}
<p>Data: metrics.jsonl, telemetry.json, stage_shares.csv, hardware.csv in this folder.</p>
<script>
window.addEventListener("load", function () {{
  var imgs = Array.prototype.slice.call(document.images);
  document.body.dataset.plots = imgs.length;
  document.body.dataset.plotsLoaded = imgs.every(function (i) {{ return i.complete && i.naturalWidth > 0; }});
}});
</script>
</body></html>
"""
    out = run / "report.html"
    out.write_text(page)
    return out
