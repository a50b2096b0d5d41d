"""Kernel view: torch.profiler captures of inference and training steps, grouped by operator kind.

After a short training run (so the model and optimizer are in a real state), profile ``steps``
inference forward passes over all env groups' observations and ``steps`` learner updates on a real
batch, skipping the first (warm-up) iterations. Operators are grouped into kinds; FLOPs come from the
profiler's own counts (matmul and convolution), so achieved FLOP/s is reported where they are known.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from rlbalance.core.jsonio import dumps as strict_dumps

KINDS = (
    ("convolution", ("conv", "cudnn_convolution", "mkldnn_convolution")),
    ("GEMM", ("addmm", "mm", "bmm", "matmul", "linear", "gemm")),
    ("optimizer", ("adam", "_foreach", "lerp", "addcdiv", "addcmul")),
    ("memory copy", ("copy_", "_to_copy", "to", "contiguous", "clone", "cat", "stack", "index", "gather",
                     "memcpy", "pin_memory", "empty_like")),
    ("reduction", ("sum", "mean", "max", "min", "argmax", "norm", "softmax", "log_softmax")),
)


def op_kind(name: str) -> str:
    base = name.split("::")[-1].lower()
    for kind, keys in KINDS:
        if any(base == k or base.startswith(k + "_") or base.startswith(k) for k in keys):
            return kind
    return "elementwise/other"


def _group(prof, steps: int, device_type: str) -> dict:
    by_kind_ms: dict[str, float] = {}
    flops = 0
    top = []
    for e in prof.key_averages():
        if not e.key.startswith("aten::"):
            continue
        t_us = (e.self_device_time_total if device_type == "cuda" else e.self_cpu_time_total)
        kind = op_kind(e.key)
        by_kind_ms[kind] = by_kind_ms.get(kind, 0.0) + t_us / 1000.0 / steps
        flops += getattr(e, "flops", 0) or 0
        top.append((t_us, e.key, kind))
    total_ms = sum(by_kind_ms.values())
    top.sort(reverse=True)
    return {"by_kind_ms": by_kind_ms, "total_ms_per_step": total_ms, "flops_per_step": flops / steps,
            "top_ops": [{"op": k, "kind": kind, "ms_per_step": t / 1000.0 / steps} for t, k, kind in top[:12]]}


def capture(learner, obs_batch: torch.Tensor, train_batch: dict, steps: int = 10, warmup: int = 3) -> dict:
    device = learner.device
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    out = {"device": str(device), "steps": steps, "phases": {}}
    obs = obs_batch.to(device)

    def run(fn, name):
        sched = schedule(wait=0, warmup=warmup, active=steps, repeat=1)
        with profile(activities=acts, schedule=sched, with_flops=True, record_shapes=False) as prof:
            t0 = None
            for i in range(warmup + steps):
                if i == warmup:
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                fn()
                prof.step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) / steps
        g = _group(prof, steps, device.type)
        g["wall_ms_per_step"] = wall * 1000.0
        g["achieved_flops"] = g["flops_per_step"] / wall if g["flops_per_step"] else None
        out["phases"][name] = g

    run(lambda: learner.model.act(obs), "inference")
    run(lambda: learner.timed_step(train_batch), "training")  # one learner step as the agent takes it
    return out


def profile_run(cfg, steps: int = 10) -> tuple[dict, Path]:
    """Train briefly (serial mode, the config's budget), then capture the kernel view into the run dir."""
    from dataclasses import replace

    from rlbalance.agents.registry import core_state_size, step_record
    from rlbalance.envs.batch import EnvBatch
    from rlbalance.runtime.buffers import RolloutBuffers
    from rlbalance.runtime.train import train

    captured: dict = {}

    def after_run(learner, spec) -> None:
        k = cfg.actors.envs_per_actor
        envs = EnvBatch(cfg.env, k, 0)
        obs = torch.from_numpy(envs.reset().copy()).repeat(cfg.num_clients, *([1] * len(spec.obs_shape)))
        nb = cfg.buffers_per_batch
        bufs = RolloutBuffers.allocate(nb, cfg.learner.unroll_length, k, spec, shared=False,
                                       record=step_record(cfg, spec), core_size=core_state_size(cfg.learner, spec))
        for j in range(nb):
            bufs.view(j).obs[:] = envs.obs
        envs.close()
        captured.update(capture(learner, obs, bufs.gather(list(range(nb))), steps=steps))

    cfg = replace(cfg, run=replace(cfg.run, mode="serial"))
    summary = train(cfg, after_run=after_run)
    run_dir = Path(summary["run_dir"])
    (run_dir / "profile.json").write_text(strict_dumps(captured, indent=2))
    from rlbalance.telemetry.report import write_report

    write_report(run_dir)
    return captured, run_dir
