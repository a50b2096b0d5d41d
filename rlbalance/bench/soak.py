"""Soak: one long training run (30 minutes by default); memory (RSS of the learner and of all actors)
must stay flat within 10% after warm-up, and FPS steady. Hardware is sampled every second (the default), so a run
of over 34 minutes passes the 2,048 samples a timeline holds and thins it. Then the report is built in a process
of its own, from the run and from a copy whose metrics.jsonl is the run's repeated to a day's size, and the peak
RSS of each is recorded: bounded memory means the two peaks are alike. Writes soak.json, soak.md and soak.png."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from rlbalance import config as C
from rlbalance.core.jsonio import dumps


def run_soak(seconds: float, out: Path, warmup_s: float = 120.0, workload: dict | None = None) -> dict:
    from rlbalance.runtime.train import train

    cfg = C.build(C.merge(workload or {}, {
        "run": {"total_steps": 10**12, "max_seconds": seconds, "out_dir": str(out / "runs"),
                "name": f"soak-{int(time.time())}", "checkpoint_interval_s": 60.0},
        "telemetry": {"hardware_interval_s": 1.0, "log_interval_s": 10.0, "tensorboard": True,
                      "progress": True}}))
    s = train(cfg)
    run = Path(s["run_dir"])
    tel = json.loads((run / "telemetry.json").read_text())
    tl = tel["hardware_timeline"]
    mem = [(x["t"], sum(x["rss"].values())) for x in tl if x.get("rss")]
    after = [m for t, m in mem if t >= warmup_s]
    base = after[0] if after else float("nan")
    growth = max(after) / base - 1 if after else float("nan")
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    minute = {}
    for r in recs:
        if r["time_s"] >= warmup_s:
            minute.setdefault(int(r["time_s"] // 60), []).append(r["fps"])
    per_min = [statistics.mean(v) for k, v in sorted(minute.items())][:-1]
    result = {"seconds": seconds, "warmup_s": warmup_s, "steps": s["steps"], "fps_sustained": s["fps_sustained"],
              "rss_after_warmup_bytes": base, "rss_max_after_warmup_bytes": max(after) if after else None,
              "rss_growth": growth, "rss_target": 0.10,
              "fps_per_minute": per_min,
              "fps_cv": statistics.pstdev(per_min) / statistics.mean(per_min) if len(per_min) > 1 else None,
              "actor_restarts": s["actor_restarts"], "verdict": s["verdict"], "run_dir": str(run)}
    result.update(report_memory(run, out / "runs"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(dumps(result))
    cv = "n/a" if result["fps_cv"] is None else f"{result['fps_cv']:.1%}"
    lo, hi = (f"{min(per_min):,.0f}", f"{max(per_min):,.0f}") if per_min else ("n/a", "n/a")
    (out / "soak.md").write_text(
        f"# Soak ({seconds / 60:.0f} minutes, CartPole-v1 defaults)\n\n"
        f"- steps: {s['steps']:,}; sustained FPS {s['fps_sustained']:,.0f}; actor restarts {s['actor_restarts']}\n"
        f"- RSS of learner + actors after {warmup_s:.0f} s warm-up: {base / 2**20:,.0f} MiB, max after: "
        f"{(max(after) if after else 0) / 2**20:,.0f} MiB, growth {growth:+.1%} (target: within 10%)\n"
        f"- FPS per minute after warm-up: min {lo}, max {hi}, coefficient of variation {cv}\n"
        f"- report built in its own process: peak RSS {result['report_peak_rss_bytes'] / 2**20:,.0f} MiB from this "
        f"run's metrics.jsonl ({result['metrics_bytes'] / 2**20:,.1f} MiB), "
        f"{result['report_day_peak_rss_bytes'] / 2**20:,.0f} MiB from a copy of it repeated to "
        f"{result['day_metrics_bytes'] / 2**20:,.0f} MiB (a day's metrics at one record a second)\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot([t / 60 for t, _ in mem], [m / 2**20 for _, m in mem], color="tab:purple")
    ax.set_xlabel("minutes")
    ax.set_ylabel("RSS, learner + actors (MiB)", color="tab:purple")
    ax2 = ax.twinx()
    ax2.plot([r["time_s"] / 60 for r in recs], [r["fps"] for r in recs], color="tab:blue", alpha=0.6)
    ax2.set_ylabel("FPS", color="tab:blue")
    ax.axvline(warmup_s / 60, ls=":", color="0.5")
    ax.set_title(f"Soak: RSS growth {growth:+.1%}, FPS CV {cv}")
    fig.tight_layout()
    fig.savefig(out / "soak.png", dpi=100)
    plt.close(fig)
    return result


DAY_METRICS_BYTES = 56 * 2**20  # metrics.jsonl of a day at about one record a second (issue 44's measure)


def _report_peak_rss(run: Path) -> int:
    """Peak RSS (bytes) of a fresh process that builds ``run``'s report (and nothing else)."""
    import subprocess
    import sys

    code = ("import resource, sys; from rlbalance.telemetry.report import write_report; write_report(sys.argv[1]); "
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1]) * 1024  # Linux reports kilobytes


def report_memory(run: Path, scratch: Path) -> dict:
    """The report's peak memory from ``run`` and from a copy of it whose metrics.jsonl is repeated (each copy a
    session of its own, as resumes make) to a day's size (DAY_METRICS_BYTES)."""
    import shutil

    day = scratch / (run.name + "-day")
    shutil.rmtree(day, ignore_errors=True)
    shutil.copytree(run, day, ignore=shutil.ignore_patterns("checkpoints", "tb"))
    lines = (run / "metrics.jsonl").read_text().splitlines()
    size, session = 0, 0
    with open(day / "metrics.jsonl", "w") as f:
        while size < DAY_METRICS_BYTES:
            session += 1
            for line in lines:
                rec = json.loads(line)
                rec["session"] = session
                text = json.dumps(rec) + "\n"
                f.write(text)
                size += len(text)
    result = {"metrics_bytes": (run / "metrics.jsonl").stat().st_size, "report_peak_rss_bytes": _report_peak_rss(run),
              "day_metrics_bytes": size, "report_day_peak_rss_bytes": _report_peak_rss(day)}
    shutil.rmtree(day, ignore_errors=True)
    return result
