"""The GPU path, for a machine with a CUDA device (the device tool's lent H200): short central-inference
trainings on CartPole and Pong with learner.device=cuda (V-trace, and R2D2), a kernel-view capture, and the telemetry's
NVML figures, which must be *measured* there, and quick GPU calibrations of Pong and CartPole (for
`rlbalance plan --gpu-calibration`), a short actor sweep on Pong (1, 2, 4, 8, 16 actors, each point a timed
run: FPS, verdict, GPU utilisation and power), and, where two CUDA devices are visible, learner.devices=2 (one
learner process and inference server per GPU, NCCL). Writes bench/results/gpu-check.json and
gpu-calibration-*.json.

  python -m rlbalance.bench.gpu_check              # exits 1 when there is no CUDA device
  python -m rlbalance.bench.gpu_check --rehearse   # the same steps on the CPU, tiny budgets, into a scratch folder
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from rlbalance.core.jsonio import dumps

SWEEP_ACTORS = (1, 2, 4, 8, 16)


def _figures(s: dict) -> dict:
    tel = json.loads((Path(s["run_dir"]) / "telemetry.json").read_text())
    hw = tel["hardware"]
    return {"fps": s["fps_sustained"], "verdict": s["verdict"], "evidence": s["verdict_evidence"],
            "gpu_power_w": hw.get("gpu_power_w"), "gpu_util_mean": hw.get("gpu_util_mean"),
            "cpu_util_mean": hw.get("cpu_util_mean"), "gpu_busy_shares": tel["stage_shares"].get("gpu"),
            "learner_ranks": tel.get("learner_ranks")}


def main(out: str = "bench/results", rehearse: bool = False) -> int:
    if rehearse:  # every step on the CPU with tiny budgets: the script is checked before device time is spent
        out = str(Path(out) / "scratch" / "gpu-check-rehearsal")
    elif not torch.cuda.is_available():
        print("no CUDA device: nothing to check (--rehearse runs the steps on the CPU)", file=sys.stderr)
        return 1
    device = "cpu" if rehearse else "cuda"
    scale = 0.02 if rehearse else 1.0
    from rlbalance import config as C
    from rlbalance.analysis.profiling import profile_run
    from rlbalance.bench.trainer import learner_ceiling, workload_config
    from rlbalance.runtime.train import train

    out_p = Path(out)
    res = {"device": "cpu (rehearsal)" if rehearse else torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "runs": {}}
    # V-trace, and R2D2 (its recurrent Q-net's central inference, replay and learner on the GPU)
    for name, steps in (("cartpole", 200_000), ("pong", 40_000), ("cartpole-r2d2", 60_000), ("pong-r2d2", 20_000)):
        cfg = workload_config(name, {"learner": {"device": device},
                                     "run": {"total_steps": int(steps * scale), "out_dir": str(out_p / "runs"),
                                             "name": f"gpu-{name}-{int(time.time())}"},
                                     "telemetry": {"progress": False}})
        res["runs"][name] = {**_figures(train(cfg)), "learner_ceiling": learner_ceiling(cfg, 5.0 * scale)}
    res["pong_actor_sweep"] = {}
    for n in SWEEP_ACTORS[:2] if rehearse else SWEEP_ACTORS:  # central inference on the GPU for 1..16 actors
        cfg = workload_config("pong", {"learner": {"device": device}, "actors": {"num_actors": n},
                                       "run": {"total_steps": 10**9, "max_seconds": 4.0 if rehearse else 25.0,
                                               "out_dir": str(out_p / "runs"), "name": f"gpu-sweep-a{n}-{int(time.time())}"},
                                       "telemetry": {"progress": False, "warmup_s": 1.0 if rehearse else 8.0}})
        res["pong_actor_sweep"][str(n)] = _figures(train(cfg))
        print(f"pong actors={n}: {res['pong_actor_sweep'][str(n)]['fps']:.0f} FPS, "
              f"{res['pong_actor_sweep'][str(n)]['verdict']}", flush=True)
    if rehearse or torch.cuda.device_count() >= 2:  # one learner process per GPU (on the CPU: two gloo ranks)
        cfg = workload_config("pong", {"learner": {"device": device, "devices": 2},
                                       "actors": {"num_actors": 2, "buffers_per_actor": 0},
                                       "run": {"total_steps": 10**9, "max_seconds": 6.0 if rehearse else 40.0,
                                               "out_dir": str(out_p / "runs"), "name": f"gpu-ddp2-{int(time.time())}"},
                                       "telemetry": {"progress": False, "warmup_s": 1.0 if rehearse else 8.0}})
        res["runs"]["pong_devices2"] = _figures(train(cfg))
    prof, run_dir = profile_run(C.build({"env": {"id": "ALE/Pong-v5"}, "learner": {"device": device},
                                         "run": {"total_steps": 2000, "out_dir": str(out_p / "runs"),
                                                 "name": f"gpu-profile-{int(time.time())}"},
                                         "telemetry": {"progress": False}}))
    res["profile"] = {p: {k: g[k] for k in ("by_kind_ms", "wall_ms_per_step", "achieved_flops")}
                      for p, g in prof["phases"].items()}
    out_p.mkdir(parents=True, exist_ok=True)
    from rlbalance.analysis.calibrate import run_calibration, save

    for name in ("pong", "cartpole"):  # GPU calibration files for `rlbalance plan --gpu-calibration`
        cal = run_calibration(workload_config(name, {"learner": {"device": device}}), quick=True)
        save(cal, out_p / f"gpu-calibration-{name}.json")
        res[f"gpu_calibration_{name}"] = {"inference_ms": cal["inference_ms"], "train_step_ms": cal["train_step_ms"]}
    (out_p / "gpu-check.json").write_text(dumps(res))
    print(json.dumps(res, indent=2, default=str))
    if rehearse:
        return 0
    ok = all((r["gpu_power_w"] or {}).get("source") == "measured" for r in res["runs"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(rehearse="--rehearse" in sys.argv[1:]))
