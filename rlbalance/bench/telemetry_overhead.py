"""Telemetry overhead: end-to-end FPS with telemetry on (stage timers, hardware sampler, metrics every
second) against off (timers no-ops, no sampler, one metrics record), alternating runs in one bench run."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from rlbalance import config as C
from rlbalance.core.jsonio import dumps

ON = {"stage_timers": True, "hardware_interval_s": 0.5, "log_interval_s": 1.0, "tensorboard": True}
OFF = {"stage_timers": False, "hardware_interval_s": 0.0, "log_interval_s": 3600.0, "tensorboard": False}


def run_overhead(steps: int, repeats: int, out: Path, workload: dict | None = None, progress=print) -> dict:
    from rlbalance.runtime.train import train

    sps = {"on": [], "off": []}
    for i in range(repeats):
        for label, tel in (("on", ON), ("off", OFF)) if i % 2 == 0 else (("off", OFF), ("on", ON)):
            cfg = C.build(C.merge(workload or {}, {
                "run": {"total_steps": steps, "out_dir": str(out / "runs"), "name": f"overhead-{label}-{i}-{time.time_ns()}"},
                "telemetry": {**tel, "progress": False, "report": False}}))
            s = train(cfg)
            sps[label].append(s["sps_sustained"])
            progress(f"[telemetry {label}] run {i}: {s['sps_sustained']:,.0f} SPS")
    on, off = statistics.median(sps["on"]), statistics.median(sps["off"])
    result = {"steps_per_run": steps, "repeats": repeats, "sps_on": sps["on"], "sps_off": sps["off"],
              "median_on": on, "median_off": off, "overhead": 1 - on / off, "target": 0.03}
    out.mkdir(parents=True, exist_ok=True)
    (out / "telemetry-overhead.json").write_text(dumps(result))
    (out / "telemetry-overhead.md").write_text(
        f"# Telemetry overhead\n\nCartPole-v1, {steps:,} steps per run, {repeats} runs each way, alternating.\n\n"
        f"| telemetry | runs (SPS) | median SPS |\n|---|---|---|\n"
        f"| on | {', '.join(f'{x:,.0f}' for x in sps['on'])} | {on:,.0f} |\n"
        f"| off | {', '.join(f'{x:,.0f}' for x in sps['off'])} | {off:,.0f} |\n\n"
        f"Overhead: {result['overhead']:+.1%} of the median FPS (target: at most 3%).\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.boxplot([sps["off"], sps["on"]])
    ax.set_xticks([1, 2], ["telemetry off", "telemetry on"])
    ax.set_ylabel("sustained SPS")
    ax.set_title(f"Telemetry overhead {result['overhead']:+.1%}")
    fig.tight_layout()
    fig.savefig(out / "telemetry-overhead.png", dpi=100)
    plt.close(fig)
    return result
