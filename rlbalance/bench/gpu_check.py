"""The GPU path, for a machine with a CUDA device (the device tool's lent H200): short central-inference
trainings on CartPole and Pong with learner.device=cuda, a kernel-view capture, and the telemetry's
NVML figures, which must be *measured* there, and quick GPU calibrations of Pong and CartPole (for
`rlbalance plan --gpu-calibration`). Writes bench/results/gpu-check.json and gpu-calibration-*.json.

  python -m rlbalance.bench.gpu_check            # exits 1 when there is no CUDA device
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch


def main(out: str = "bench/results") -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check", file=sys.stderr)
        return 1
    from rlbalance.bench.trainer import learner_ceiling, workload_config
    from rlbalance import config as C
    from rlbalance.profiling import profile_run
    from rlbalance.train import train

    out_p = Path(out)
    res = {"device": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs": {}}
    for name, steps in (("cartpole", 200_000), ("pong", 40_000)):
        cfg = workload_config(name, {"learner": {"device": "cuda"},
                                     "run": {"total_steps": steps, "out_dir": str(out_p / "runs"),
                                             "name": f"gpu-{name}-{int(time.time())}"},
                                     "telemetry": {"progress": False}})
        s = train(cfg)
        tel = json.loads((Path(s["run_dir"]) / "telemetry.json").read_text())
        res["runs"][name] = {"fps": s["fps_sustained"], "verdict": s["verdict"], "evidence": s["verdict_evidence"],
                             "gpu_power_w": tel["hardware"].get("gpu_power_w"),
                             "gpu_util_mean": tel["hardware"].get("gpu_util_mean"),
                             "gpu_busy_shares": tel["stage_shares"].get("gpu"),
                             "learner_ceiling": learner_ceiling(cfg, 5.0)}
    prof, run_dir = profile_run(C.build({"env": {"id": "ALE/Pong-v5"}, "learner": {"device": "cuda"},
                                         "run": {"total_steps": 2000, "out_dir": str(out_p / "runs"),
                                                 "name": f"gpu-profile-{int(time.time())}"},
                                         "telemetry": {"progress": False}}))
    res["profile"] = {p: {k: g[k] for k in ("by_kind_ms", "wall_ms_per_step", "achieved_flops")}
                      for p, g in prof["phases"].items()}
    out_p.mkdir(parents=True, exist_ok=True)
    from rlbalance.calibrate import run_calibration, save

    for name in ("pong", "cartpole"):  # GPU calibration files for `rlbalance plan --gpu-calibration`
        cal = run_calibration(workload_config(name, {"learner": {"device": "cuda"}}), quick=True)
        save(cal, out_p / f"gpu-calibration-{name}.json")
        res[f"gpu_calibration_{name}"] = {"inference_ms": cal["inference_ms"], "train_step_ms": cal["train_step_ms"]}
    (out_p / "gpu-check.json").write_text(json.dumps(res, indent=2, default=str))
    print(json.dumps(res, indent=2, default=str))
    ok = all((r["gpu_power_w"] or {}).get("source") == "measured" for r in res["runs"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
