"""Pong learning curve: train ALE/Pong-v5 (DeepMind preprocessing, Nature CNN) for the first N frames
and record episode return against frames. Writes pong-curve.json, .csv and .png."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from bench.trainer import workload_config


def run_curve(frames: int, num_actors: int, out: Path, extra: dict | None = None) -> dict:
    from rlbalance.train import train

    cfg = workload_config("pong", extra)
    steps = frames // cfg.env.frameskip
    cfg = replace(cfg, actors=replace(cfg.actors, num_actors=num_actors),
                  run=replace(cfg.run, total_steps=steps, out_dir=str(out / "runs"),
                              name=f"pong-curve-{int(time.time())}"),
                  telemetry=replace(cfg.telemetry, tensorboard=True, log_interval_s=10.0))
    summary = train(cfg)
    run = Path(summary["run_dir"])
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    curve = [(r["frames"], r["episode_return"]) for r in recs if r.get("episode_return") is not None]
    rets = [r for _, r in curve]
    k = max(1, len(rets) // 10)
    first, last = float(np.mean(rets[:k])), float(np.mean(rets[-k:]))
    result = {"frames": summary["frames"], "fps_sustained": summary["fps_sustained"],
              "return_first_tenth": first, "return_last_tenth": last, "improved": last > first,
              "episodes": summary["episodes"], "run_dir": str(run), "curve": curve}
    out.mkdir(parents=True, exist_ok=True)
    (out / "pong-curve.json").write_text(json.dumps(result, indent=2))
    (out / "pong-curve.csv").write_text("frames,mean_return_last100\n" +
                                        "".join(f"{f},{r}\n" for f, r in curve))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([f for f, _ in curve], rets)
    ax.set_xlabel("frames")
    ax.set_ylabel("mean return (last 100 episodes)")
    ax.set_title(f"ALE/Pong-v5, {num_actors} actors, {summary['fps_sustained']:,.0f} FPS")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "pong-curve.png", dpi=110)
    plt.close(fig)
    return {k: v for k, v in result.items() if k != "curve"}
