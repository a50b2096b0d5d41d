"""A self-contained HTML report per run (plots embedded as PNG), plus CSV of the same data."""

from __future__ import annotations

import base64
import csv
import html
import io
import json
from pathlib import Path

from rlbalance.core.jsonio import open_nofollow
from rlbalance.core.thinned import Thinned
from rlbalance.telemetry.balance_report import balance_figure, balance_rows
from rlbalance.telemetry.metrics import with_gaps
from rlbalance.telemetry.verdict import VERDICTS, advise


#: metrics records a report reads at most: a day's run writes ~50 MB of them; read line by line and thinned evenly
#: beyond this (each session's first record kept, so its gap still shows), the report's memory is bounded
METRICS_CAP = 4096


def read_metrics(path: Path, cap: int = METRICS_CAP) -> list[dict]:
    """metrics.jsonl, one line at a time, in bounded memory: every record of a run up to ``cap``, then evenly
    thinned over the whole run (the last record and each session's first always kept)."""
    kept: Thinned[tuple[int, dict]] = Thinned(cap)
    firsts: list[tuple[int, dict]] = []
    session, raw = None, None
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            rec = json.loads(line)
            if rec.get("session", 0) != session or (raw is not None and rec["time_s"] < raw):
                firsts.append((i, rec))  # a session starts (with_gaps draws the gap before it)
            session, raw = rec.get("session", 0), rec["time_s"]
            kept.append((i, rec))
    return [rec for _, rec in sorted(dict([*kept.items(), *firsts]).items())]


def _load(run: Path) -> dict:
    d = {"metrics": read_metrics(run / "metrics.jsonl")}
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


# One colour per stage, the same in every report (tab20 has 20; the stages are fewer).
_STAGES = ("env_step", "wait_action", "wait_buffer", "reset", "batch_wait", "h2d", "forward", "d2h", "wait_data",
           "fwd_bwd", "optim", "other")


# Each stage in words, as the legend and the CSV's readers see it; on a machine without a GPU the "copies" are
# host-memory work (gathering a batch, handing back actions), so they are named for that.
_STAGE_WORDS = {
    "env_step": "stepping envs", "wait_action": "waiting for actions", "wait_buffer": "waiting for a free buffer",
    "reset": "resetting envs", "batch_wait": "waiting for requests", "forward": "forward pass",
    "wait_data": "waiting for unrolls", "fwd_bwd": "forward and backward pass", "optim": "optimizer step",
    "other": "other",
}
_COPY_WORDS = {True: {"h2d": "copying to the GPU", "d2h": "copying from the GPU"},
               False: {"h2d": "gathering the batch", "d2h": "handing back results"}}


def stage_words(stage: str, gpu: bool) -> str:
    """A stage's name for people: 'fwd_bwd' -> 'forward and backward pass', 'h2d' -> 'copying to the GPU' (or,
    without a GPU, 'gathering the batch')."""
    return _COPY_WORDS[gpu].get(stage) or _STAGE_WORDS.get(stage) or stage.replace("_", " ")


def stage_color(stage: str):
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    i = _STAGES.index(stage) if stage in _STAGES else len(_STAGES) + sum(map(ord, stage)) % (20 - len(_STAGES))
    return cmap(i % 20)


def _num(v):
    return float("nan") if v is None else v


def _has_gpu(d: dict) -> bool:
    return bool(d["meta"].get("hardware", {}).get("gpus")) or str(d["summary"].get("device", "")).startswith("cuda")


def _learning_figure(m: list[dict], frames: list[float], plt):
    """Return against frames and wall time, then losses, entropy, policy lag, gradient norm and learning
    rate against frames: what a researcher reads first."""
    panels = [("mean return (last 100)", "episode_return", "frames"), ("mean return (last 100)", "episode_return", "time"),
              ("policy entropy (nats)", "loss/entropy", "frames"), ("policy loss", "loss/pg_loss", "frames"),
              ("value loss", "loss/baseline_loss", "frames"), ("gradient norm (before clipping)", "loss/grad_norm", "frames"),
              ("learning rate", "loss/lr", "frames"), ("policy lag (updates)", "policy_lag", "frames")]
    fig, axes = plt.subplots(2, 4, figsize=(12, 5))
    minutes = [r["time_s"] / 60 for r in m]
    for ax, (label, key, x) in zip(axes.flat, panels):
        ys = [_num(r.get(key)) for r in m]  # (a gap record has none: NaN, no line drawn through it)
        xs = frames if x == "frames" else minutes
        ax.plot(xs, ys, color="tab:green" if key == "episode_return" else "tab:blue", lw=1.2,
                marker="." if len(m) < 20 else None)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("env frames" if x == "frames" else "wall time (minutes)", fontsize=8)
        ax.tick_params(labelsize=7)
        if key == "loss/lr":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    fig.suptitle("Learning", fontsize=11)
    fig.tight_layout()
    return fig


def _plots(d: dict) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    plots = []
    m = with_gaps(d["metrics"])
    fpstep = max(1, int(d["summary"].get("frames", 0) / d["summary"]["steps"])) if d["summary"].get("steps") else 1
    frames = [r.get("frames", r["steps"] * fpstep) for r in m]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot(frames, [_num(r.get("fps")) for r in m], color="tab:blue")
    ax.set_xlabel("env frames")
    ax.set_ylabel("FPS (frames/s)", color="tab:blue")
    ax2 = ax.twinx()
    ax2.plot(frames, [_num(r.get("episode_return")) for r in m], color="tab:green")
    ax2.set_ylabel("mean return (last 100 episodes)", color="tab:green")
    ax.set_title("Throughput and return")
    fig.tight_layout()
    plots.append(("Throughput and return", _png(fig)))
    if m:
        plots.append(("Learning", _png(_learning_figure(m, frames, plt))))
    fig = balance_figure(m, (d["summary"].get("balance") or {}).get("moves", []), plt)
    if fig is not None:
        plots.append(("Self-balancing: throughput and layout", _png(fig)))

    node_keys = sorted({k for r in m for k in r if k.startswith("ray/node") and k.endswith("_cpu_util")})
    if node_keys:  # Ray actors: each node's CPU utilisation, as its actors report it
        fig, ax = plt.subplots(figsize=(7, 3.0))
        for k in node_keys:
            pts = [(r["steps"], r.get(k, float("nan"))) for r in m if k in r or r.get("gap")]
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
        fig, ax = plt.subplots(figsize=(7.5, 1.2 + 0.7 * len(shares)))
        roles = sorted(shares)
        seen: dict[str, object] = {}
        for i, role in enumerate(roles):
            left = 0.0
            for stage, v in sorted(shares[role].items(), key=lambda kv: -kv[1]):
                bar = ax.barh(i, v, left=left, edgecolor="white", color=stage_color(stage))
                seen.setdefault(stage, bar)
                if v > 0.06:
                    ax.text(left + v / 2, i, f"{v:.0%}", ha="center", va="center", fontsize=7)
                left += v
        ax.set_yticks(range(len(roles)), roles)
        ax.set_xlim(0, 1.0)
        ax.set_xlabel("share of the role's wall time after warm-up (%)")
        ax.xaxis.set_major_formatter(PercentFormatter(1.0))
        gpu = _has_gpu(d)
        rows = -(-len(seen) // 3)  # the legend below the plot, in rows of three, with room kept for it
        height = 1.6 + 0.7 * len(shares) + 0.22 * rows
        fig.set_size_inches(7.5, height)
        fig.legend(list(seen.values()), [stage_words(k, gpu) for k in seen], fontsize=7, ncol=3,
                   loc="lower center", frameon=False)
        ax.set_title("Stage breakdown per role")
        fig.tight_layout(rect=(0, (0.22 * rows + 0.1) / height, 1, 1))
        plots.append(("Stage breakdown", _png(fig)))

    tl = d["telemetry"].get("hardware_timeline", [])[1:]  # the first sample has no interval behind it
    if tl:
        t = [s["t"] for s in tl]
        has_gpu = any(s["gpu_util"] for s in tl)
        fig, (ax, bx) = plt.subplots(2, 1, figsize=(7, 4.6), sharex=True)
        ncores = len(tl[0]["cpu_per_core"])
        for c in range(ncores):
            ax.plot(t, [s["cpu_per_core"][c] for s in tl], lw=0.8, alpha=0.7, label=f"core {c}" if ncores <= 8 else None)
        if has_gpu:
            ax.plot(t, [sum(s["gpu_util"]) / len(s["gpu_util"]) for s in tl], lw=2, ls="--", color="black",
                    label="GPU (mean)")
        ax.set_ylabel("busy (fraction)")
        ax.set_ylim(0, 1.05)
        ax.legend(fontsize=7, ncol=4)
        ax.set_title("Utilization over time (measured)")
        for role in sorted({r for s in tl for r in s["proc_cpu"]}):
            bx.plot(t, [s["proc_cpu"].get(role, 0.0) for s in tl], lw=2, label=role)
        bx.set_ylabel("CPU cores used")
        bx.set_xlabel("seconds since start")
        bx.set_ylim(bottom=0)
        bx.legend(fontsize=7, ncol=3)
        fig.tight_layout()
        plots.append(("Utilization over time", _png(fig)))

        fig, ax = plt.subplots(figsize=(7, 3.0))
        ax.plot(t, [s["cpu_power_w"] for s in tl], label=f"CPU ({tl[-1]['cpu_power_source']})")
        if has_gpu:  # nothing is drawn for a GPU the machine does not have
            ax.plot(t, [s["gpu_power_w"] for s in tl], label=f"GPU ({tl[-1]['gpu_power_source']})")
        ax.set_xlabel("seconds since start")
        ax.set_ylabel("power (W)")
        ax.set_ylim(bottom=0)
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


# The verdict's evidence, in words (each a share of the role's wall time unless named otherwise).
_FIGURE_LABELS = {
    "learner_wait_data": "learner waiting for unrolls", "learner_busy": "learner computing (copy, forward/backward, optimizer)",
    "actor_env_step": "actors stepping their envs", "actor_wait_action": "actors waiting for actions",
    "actor_wait_buffer": "actors waiting for a free buffer", "inference_wait": "inference server waiting for requests",
    "inference_forward": "inference server in forward passes", "inference_copy": "inference server copying to and from the device",
    "cpu_util_mean": "CPU utilization (mean over cores)", "gpu_util_mean": "GPU utilization (mean over GPUs)",
}


def _figure_label(key: str, gpu: bool = True) -> str:
    label = _FIGURE_LABELS.get(key)
    if key == "inference_copy" and not gpu:
        label = "inference server gathering batches and handing back actions"
    if label is None:
        return key.replace("_", " ")
    return label + ("" if key.endswith("util_mean") else " (share of its time)")


def _percent(v) -> str:
    """Every figure of the verdict's evidence is a fraction (a share of time, a utilization): shown as a percent."""
    return f"{v:.0%}" if isinstance(v, (int, float)) and not isinstance(v, bool) else _fmt(v)


def write_csv(run: Path, d: dict | None = None) -> None:
    d = d or _load(run)
    with open_nofollow(run / "stage_shares.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["role", "stage", "stage_in_words", "share"])
        gpu = _has_gpu(d)
        for role, st in sorted(d["telemetry"].get("stage_shares", {}).items()):
            for stage, v in sorted(st.items()):
                w.writerow([role, stage, stage_words(stage, gpu), f"{v:.6f}"])
    tl = d["telemetry"].get("hardware_timeline", [])
    gpu = _has_gpu(d) or any(s.get("gpu_util") for s in tl)
    with open_nofollow(run / "hardware.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s", "cpu_util_mean", "cpu_power_w", "cpu_power_source"]
                   + (["gpu_power_w", "gpu_power_source"] if gpu else []))  # no GPU columns without a GPU
        for s in tl:
            w.writerow([f"{s['t']:.3f}", f"{sum(s['cpu_per_core']) / len(s['cpu_per_core']):.4f}",
                        f"{s['cpu_power_w']:.2f}", s["cpu_power_source"]]
                       + ([f"{s['gpu_power_w']:.2f}", s["gpu_power_source"]] if gpu else []))


def _wall(seconds) -> str | None:
    """A run's wall time as a person reads it: '3 min 12 s (192 s)'."""
    if not isinstance(seconds, (int, float)):
        return None
    m, sec = divmod(round(seconds), 60)
    h, m = divmod(m, 60)
    said = f"{h} h {m} min" if h else f"{m} min {sec} s" if m else f"{sec} s"
    return f"{said} ({seconds:,.0f} s)"


def _precision_row(choice: dict | None) -> str | None:
    """learner.torso_precision as the run resolved it on its learner device, and why (config.json's "resolved")."""
    if not choice:
        return None
    name = {"bf16": "bfloat16", "fp32": "float32"}.get(choice["torso_precision"], choice["torso_precision"])
    layout = "" if choice.get("image_layout") in (None, "n/a") else f", images {choice['image_layout'].replace('_', '-')}"
    return f"{name}{layout} ({choice['why']})"


def write_report(run: str | Path) -> Path:
    run = Path(run)
    d = _load(run)
    write_csv(run, d)
    s, tel, hw = d["summary"], d["telemetry"], d["meta"].get("hardware", {})
    v = dict(tel.get("verdict", {}))
    if v.get("verdict") in VERDICTS and "device" in s:  # the advice for the machine the run was on
        v["advice"] = advise(v["verdict"], {"gpus": len(hw.get("gpus", [])), "learner_device": s["device"]},
                             s.get("inference") == "central", (v.get("figures") or {}).get("cpu_util_mean"))
    rows = [("outcome", s.get("outcome")), ("env", s.get("env")), ("mode", f"{s.get('mode')}, {s.get('inference')} inference"),
            ("model / device", f"{s.get('model')} on {s.get('device')}"),
            ("torso precision", _precision_row(d["config"].get("resolved", {}).get("learner"))),
            ("env steps", f"{s['steps']:,}" if isinstance(s.get("steps"), int) else s.get("steps")),
            ("wall time", _wall(s.get("wall_s"))),
            ("sustained FPS (env frames/s, after warm-up)", s.get("fps_sustained")), ("sustained SPS (env steps/s)", s.get("sps_sustained")),
            ("mean return (last 100 episodes)", s.get("episode_return_last100")),
            ("CPU utilization (mean, fraction of all cores)", s.get("cpu_util_mean")),
            ("node power (W)", s.get("node_power_w")), ("FPS per watt (frames/J)", s.get("fps_per_watt")),
            ("actor restarts", s.get("actor_restarts")), ("actor-seconds lost (s)", s.get("actor_seconds_lost"))]
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
    rows += balance_rows(s.get("balance"))
    for ev in s.get("actor_faults", []):
        rows.append((f"actor {ev['actor']} fault at {ev['at']}", ev["reason"]))
    for key, val in tel.get("latency_ms", {}).items():
        if val is not None:
            rows.append((key.removesuffix("_ms").replace("_", " ") + " (ms)", val))
    if tel.get("transport"):
        rows.append(("shared-memory transport, bytes/s", {"value": tel["transport"]["bytes_per_s"],
                                                           "source": "derived"}))
    has_gpu = bool(hw.get("gpus"))
    for key, label in (("cpu_power_w", "CPU power (W)"), ("gpu_power_w", "GPU power (W)"),
                       ("base_power_w", "rest of the node, power (W)"), ("energy_cpu_j", "CPU energy (J)"),
                       ("energy_gpu_j", "GPU energy (J)")):
        if key in tel.get("hardware", {}) and (has_gpu or "gpu" not in key):  # no rows for a GPU the node lacks
            rows.append((label, tel["hardware"][key]))
    table = "\n".join(f"<tr><th>{html.escape(k)}</th><td>{_fmt(val)}</td></tr>" for k, val in rows if val is not None)
    figs = "\n".join(f'<figure><img alt="{html.escape(t)}" src="data:image/png;base64,{b}"><figcaption>'
                     f"{html.escape(t)}</figcaption></figure>" for t, b in _plots(d))
    evidence = "".join(f"<li>{html.escape(_figure_label(k, _has_gpu(d)))}: {_percent(val)}</li>"
                       for k, val in v.get("figures", {}).items())
    esc = lambda x: html.escape(str(x))  # noqa: E731 - every field read from the run's files, escaped
    machine = (f"{esc(hw.get('cpu_model', '?'))}, {esc(hw.get('physical_cores', '?'))} cores / "
               f"{esc(hw.get('logical_cpus', '?'))} threads, GPUs: "
               f"{esc([g.get('name') if isinstance(g, dict) else g for g in hw.get('gpus', [])] or 'none')}, "
               f"commit {esc(hw.get('git_commit', '?'))}")
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
    with open_nofollow(out, "w", encoding="utf-8") as f:
        f.write(page)
    return out
