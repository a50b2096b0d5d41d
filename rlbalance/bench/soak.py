"""Soak: one long training run (30 minutes by default); memory (RSS of the learner and of all actors)
must stay flat within 10% after warm-up, and FPS steady. Writes soak.json, soak.md and soak.png."""

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
        "telemetry": {"hardware_interval_s": 5.0, "log_interval_s": 10.0, "tensorboard": True,
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
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(dumps(result))
    cv = "n/a" if result["fps_cv"] is None else f"{result['fps_cv']:.1%}"
    lo, hi = (f"{min(per_min):,.0f}", f"{max(per_min):,.0f}") if per_min else ("n/a", "n/a")
    (out / "soak.md").write_text(
        f"# Soak ({seconds / 60:.0f} minutes, CartPole-v1 defaults)\n\n"
        f"- steps: {s['steps']:,}; sustained FPS {s['fps_sustained']:,.0f}; actor restarts {s['actor_restarts']}\n"
        f"- RSS of learner + actors after {warmup_s:.0f} s warm-up: {base / 2**20:,.0f} MiB, max after: "
        f"{(max(after) if after else 0) / 2**20:,.0f} MiB, growth {growth:+.1%} (target: within 10%)\n"
        f"- FPS per minute after warm-up: min {lo}, max {hi}, coefficient of variation {cv}\n")
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
