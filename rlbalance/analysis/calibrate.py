"""Calibration: short microbenchmarks of one workload (env + model) on this machine.

Terms measured, each the median of a few repetitions:

- env step cost per core (microseconds per env step, random actions, one process) at several K;
- SMT effect: the same on two sibling hardware threads of one core, where the machine has them;
- inference latency (policy forward + sampling) against batch size, on the learner device;
- training step time against batch size (one learner step as the agent takes it: unrolls of length T, or
  sequences, each due for every B x T / replay_ratio env steps), on the learner device;
- transport: the round trip of a one-byte message on a pipe between two processes, and the cost of
  copying observations per byte (what the shared-memory path does per step);
- the pipeline loop: short real training runs of the workload's shape (observation shape, K, env
  groups, model, batch) on a free env (the synthetic env at 0 us per step) with 1, 2, ... actors up to
  twice the usable CPUs: what one env group's round trip costs with the learner training beside the
  server, and the CPU time per step of the actors' and the learner's processes, without the env's cost
  (the free env's own step cost is measured too, to be taken off the real env's).

Saved with the hardware stamp as a JSON calibration file that the planner reads.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import statistics
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from rlbalance import config as C
from rlbalance.agents import registry
from rlbalance.agents.nets import resolve_model
from rlbalance.core.cpuinfo import usable_cpus
from rlbalance.core.jsonio import dumps as strict_dumps
from rlbalance.envs.batch import EnvBatch, probe_spec
from rlbalance.runtime.buffers import RolloutBuffers
from rlbalance.runtime.devices import resolve_device


def _median_time(fn, reps: int, min_s: float = 0.2) -> float:
    """Median seconds per call over ``reps`` timed blocks of at least ``min_s`` each."""
    fn()
    out = []
    for _ in range(reps):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            dt = time.perf_counter() - t0
            if dt >= min_s:
                break
        out.append(dt / n)
    return statistics.median(out)


def env_step_us(cfg: C.Config, k: int, seconds: float = 0.6) -> float:
    envs = EnvBatch(cfg.env, k, 0)
    envs.reset()
    rng = np.random.default_rng(0)
    t = _median_time(lambda: envs.step(envs.spec.action.random(rng, k)), reps=3, min_s=seconds / 3)
    envs.close()
    return t / k * 1e6


class _ConstantPolicy:
    """Answers at once with action 0: what is left is the actor loop's own cost."""

    def __init__(self, k: int, spec, record: dict):
        action = spec.action
        zeros = np.zeros((k, *action.store_shape), dtype=np.float32 if action.kind == "box" else np.int64)
        fields = {name: torch.zeros((k, *f.shape), dtype=f.dtype).numpy() for name, f in record.items()}
        self.answer = (zeros, fields, 0)

    core_in = None

    def request(self, obs, first) -> None:
        pass

    def receive(self):
        return self.answer


def actor_loop_us(cfg: C.Config, k: int, seconds: float = 0.6) -> float:
    """Microseconds per env step of the whole actor loop (env step, buffer writes, timers), no inference."""
    from rlbalance.runtime.actor import Rollout

    envs = EnvBatch(cfg.env, k, 0)
    spec = envs.spec
    record = registry.step_record(cfg, spec)
    bufs = RolloutBuffers.allocate(1, cfg.learner.unroll_length, k, spec, shared=False, record=record)
    view = bufs.view(0)
    rollout = Rollout(envs, _ConstantPolicy(k, spec, record))
    t = _median_time(lambda: rollout.fill(view), reps=3, min_s=seconds / 3)
    envs.close()
    return t / (cfg.learner.unroll_length * k) * 1e6


def _smt_worker(cfg, k, cpu, q):
    import os

    os.sched_setaffinity(0, {cpu})
    q.put(env_step_us(cfg, k))


def smt_factor(cfg: C.Config, k: int) -> dict:
    """Per-thread env cost when both hardware threads of one core step envs, over the cost alone."""
    import glob
    import os

    for path in sorted(glob.glob("/sys/devices/system/cpu/cpu*/topology/thread_siblings_list")):
        text = Path(path).read_text().strip()
        sib = [int(x) for x in text.replace("-", ",").split(",") if x]
        if len(sib) >= 2 and set(sib[:2]) <= os.sched_getaffinity(0):
            ctx = mp.get_context("spawn")
            q = ctx.Queue()
            ps = [ctx.Process(target=_smt_worker, args=(cfg, k, c, q)) for c in sib[:2]]
            for p in ps:
                p.start()
            both = statistics.mean(q.get(timeout=120) for _ in ps)
            for p in ps:
                p.join()
            alone = env_step_us(cfg, k)
            return {"factor": both / alone, "siblings": sib[:2], "source": "measured"}
    return {"factor": None, "source": "no sibling hardware threads here"}


def _echo(conn):
    while True:
        try:
            conn.send_bytes(conn.recv_bytes())
        except EOFError:
            return


def pipe_round_trip_us(n: int = 2000) -> float:
    ctx = mp.get_context("spawn")
    a, b = ctx.Pipe()
    p = ctx.Process(target=_echo, args=(b,), daemon=True)
    p.start()
    b.close()
    for _ in range(100):
        a.send_bytes(b"r")
        a.recv_bytes()
    t0 = time.perf_counter()
    for _ in range(n):
        a.send_bytes(b"r")
        a.recv_bytes()
    dt = (time.perf_counter() - t0) / n
    a.close()
    p.join(timeout=5)
    return dt * 1e6


def copy_ns_per_byte(nbytes: int) -> float:
    src = np.random.default_rng(0).integers(0, 255, max(nbytes, 1024), dtype=np.uint8)
    dst = np.empty_like(src)
    t = _median_time(lambda: np.copyto(dst, src), reps=3, min_s=0.05)
    return t / src.nbytes * 1e9


def model_flops(model: torch.nn.Module, obs: torch.Tensor) -> int:
    """Forward FLOPs for one observation batch (torch's own counter)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter, torch.no_grad():
        if getattr(model, "recurrent", False):  # one step from an episode's start: [1, N] sequences
            model(obs[None], model.initial_state(obs.shape[0], obs.device),
                  torch.ones(1, obs.shape[0], dtype=torch.bool, device=obs.device))
        else:
            model(obs)
    return int(counter.get_total_flops())


def free_env(env: C.EnvConfig, spec) -> C.EnvConfig:
    """The synthetic env at 0 us per step with this env's observation shape and dtype and action count: the free
    env of the pipeline loop."""
    return replace(env, id="synthetic", synthetic_step_us=0.0, synthetic_cost="busy", synthetic_fault="",
                   synthetic_obs_shape=tuple(spec.obs_shape), synthetic_actions=spec.num_actions,
                   synthetic_obs_dtype="uint8" if spec.obs_dtype == np.uint8 else "float32")


def pipeline_loop(cfg: C.Config, spec, seconds: float = 8.0, num_actors: int = 1) -> dict:
    """A real training run of this workload's config on its free env with ``num_actors`` actor processes: its
    throughput, the actors' wait per request, and the actor and learner processes' CPU per step."""
    import tempfile

    from rlbalance.runtime.train import train

    with tempfile.TemporaryDirectory() as tmp:
        # The workload's whole config (actors, buffers, inference, learner as its presets made them; no preset
        # layered again) with the free env in place of its env
        d = cfg.to_dict()
        short = registry.get(cfg.learner.agent).short_run(cfg)  # (an agent's settings for a short run)
        over = {**d, **{sec: {**d[sec], **v} for sec, v in short.items()},
                "env": asdict(free_env(cfg.env, spec)),
                # (the buffers a run at this many actors gets: a preset's count raised where it would stall)
                "actors": {**d["actors"], "num_actors": num_actors, "cpu_affinity": [], "buffers_per_actor": C.fit_buffers(
                    replace(cfg.actors, num_actors=num_actors), cfg.learner).buffers_per_actor},
                "learner": {**d["learner"], "model": resolve_model(cfg.learner, spec)},
                "ray": {**d["ray"], "address": ""},
                "run": {**d["run"], "total_steps": 10**9, "max_seconds": seconds, "out_dir": tmp, "name": "pipeline",
                        "preset": "none", "checkpoint_interval_s": 10**6},
                # warm-up: half the loop (it counts from the first update, when with twice the CPUs in actor
                # processes the last ones are still starting: 10 s loops with a quarter measured 20-30% low there)
                "telemetry": {"progress": False, "report": False, "tensorboard": False, "warmup_s": seconds / 2,
                              "hardware_interval_s": 0.5, "log_interval_s": 0.5}}
        s = train(C.build(over))
        recs = [json.loads(line) for line in open(Path(s["run_dir"]) / "metrics.jsonl")]
    half = recs[len(recs) // 3:]
    cores = {role: statistics.mean(r.get(f"hw/cpu_cores_{role}", 0.0) for r in half) for role in ("actor", "learner")}
    sps = s["sps_sustained"] or s["sps_overall"]  # a loaded machine may log too little after warm-up
    if not sps:
        raise RuntimeError(f"pipeline loop with {num_actors} actors made no steps in {seconds} s")
    k, g = cfg.actors.envs_per_actor, cfg.actors.env_groups
    # an actor's wait for one request's actions (K envs' steps), from the share of its time it waits for them
    wait = ((s.get("stage_shares") or {}).get("actor") or {}).get("wait_action", 0.0)
    return {"sps": sps, "group_cycle_us": g * k * 1e6 / sps, "request_wait_us": wait * num_actors * k * 1e6 / sps,
            "actor_cpu_us_per_step": cores["actor"] * 1e6 / sps, "learner_cpu_us_per_step": cores["learner"] * 1e6 / sps}


def envs_counts(cfg: C.Config) -> list[int]:
    """Envs per actor besides the workload's K at which calibration runs the pipeline loop: the largest count up to
    K/4 and the largest up to 4K, among those the config allows (divisors of learner.batch_size, since an actor
    buffer holds K unrolls, and within inference.max_batch where that is set)."""
    k = cfg.actors.envs_per_actor
    b, cap = cfg.learner.batch_size, cfg.inference.max_batch

    def allowed(x: int) -> bool:
        return b % x == 0 and (not cap or x <= cap)

    small = max((x for x in range(1, max(1, k // 4) + 1) if x < k and allowed(x)), default=None)
    large = max((x for x in range(k + 1, 4 * k + 1) if allowed(x)), default=None)
    return [x for x in (small, large) if x is not None]


def timed_learner(cfg: C.Config, spec, device, batch_size: int, real_env: bool = False):
    """(The learner of ``cfg``'s agent with one learner step at ``batch_size`` samples, a batch of unrolls it can take
    that step on): what calibration and the trainer bench's learner ceiling time ``learner.timed_step(batch)`` on.
    The unrolls repeat the env's first observation, or (``real_env``) hold real env steps with random actions."""
    agent = registry.get(cfg.learner.agent)
    c2 = agent.sized(cfg, batch_size)
    learner = registry.make_learner(registry.build_model(c2.learner, spec), c2, spec, device)
    nb, k, t = c2.buffers_per_batch, c2.actors.envs_per_actor, c2.learner.unroll_length
    bufs = RolloutBuffers.allocate(nb, t, k, spec, shared=False, record=registry.step_record(c2, spec),
                                   core_size=registry.core_state_size(c2.learner, spec))
    envs = EnvBatch(c2.env, k, 0)
    obs = envs.reset()
    rng = np.random.default_rng(0)
    for j in range(nb):
        v = bufs.view(j)
        for i in range(t + 1):
            v.obs[i] = obs
            if real_env:
                v.action[i] = spec.action.random(rng, k)
                r = envs.step(v.action[i])
                obs, v.reward[i], v.done[i] = r.obs, r.reward, r.done
    envs.close()
    return learner, bufs.gather(list(range(nb)))


def run_calibration(cfg: C.Config, quick: bool = False, progress=print) -> dict:
    spec = probe_spec(cfg.env)
    agent = registry.get(cfg.learner.agent)
    device = resolve_device(cfg.learner.device)
    torch.set_num_threads(cfg.learner.torch_threads)
    # env and actor-loop costs at 1, 8 (32 for cheap envs), the workload's K and the K the loop is also run at
    other_ks = envs_counts(cfg)
    ks = [1, 8] if quick else sorted({1, 8, cfg.actors.envs_per_actor, *other_ks}
                                     | (set() if cfg.env.is_atari else {32}))
    progress("env step cost per core ...")
    env = {str(k): env_step_us(cfg, k) for k in ks}
    progress("actor loop cost per step ...")
    loop = {str(k): actor_loop_us(cfg, k) for k in ks}
    progress("SMT effect ...")
    smt = smt_factor(cfg, cfg.actors.envs_per_actor)
    model = registry.build_model(cfg.learner, spec).to(device)
    envs = EnvBatch(cfg.env, 1, 0)
    one = torch.from_numpy(envs.reset().copy())
    envs.close()
    progress("inference latency against batch size ...")
    inference = {}
    for b in ([8, 32, 128] if quick else [8, 32, 128, 512]):
        obs = one.repeat(b, *([1] * len(spec.obs_shape))).to(device)
        inference[str(b)] = _median_time(lambda: model.act(obs), reps=3, min_s=0.1) * 1e3
    progress("training step time against batch size ...")
    training = {}
    k = cfg.actors.envs_per_actor
    for b in agent.step_sizes(cfg, quick):  # one learner step as a run takes it, at each batch size
        learner, batch = timed_learner(cfg, spec, device, b)
        training[str(b)] = _median_time(lambda: learner.timed_step(batch), reps=3, min_s=0.3) * 1e3
    progress("transport ...")
    obs_bytes = spec.obs_bytes
    flops = model_flops(model.cpu(), one) if device.type == "cpu" else model_flops(registry.build_model(cfg.learner, spec), one)
    progress("pipeline loop (short training runs on a free env) ...")
    ncpu = usable_cpus()
    counts = sorted({1, ncpu, 2 * ncpu}) if not quick else [1]
    free = free_env(cfg.env, spec)
    pipeline = {"points": {str(n): pipeline_loop(cfg, spec, 4.0 if quick else 12.0, n) for n in counts},
                "free_env_step_us": env_step_us(replace(cfg, env=free), k),
                "source": "measured: synthetic env at 0 us per step, the workload's shapes"}
    if not quick:  # the loop at other envs per actor, at ncpu actors: what the terms do as K changes
        progress(f"pipeline loop at other envs per actor {other_ks} ...")
        pipeline["envs_actors"] = ncpu
        pipeline["envs_points"] = {}
        for kk in other_ks:
            c2 = replace(cfg, actors=C.fit_buffers(replace(cfg.actors, envs_per_actor=kk), cfg.learner))
            pipeline["envs_points"][str(kk)] = {**pipeline_loop(c2, spec, 12.0, ncpu),
                                                "free_env_step_us": env_step_us(replace(c2, env=free), kk)}
    from rlbalance.runtime.rundir import hardware_stamp

    t = cfg.learner.unroll_length
    work = agent.learner_work(cfg)
    return {
        "format": "rlbalance-calibration-v1",
        "workload": {"env": cfg.env.id, "agent": cfg.learner.agent, "model": resolve_model(cfg.learner, spec),
                     "frames_per_step": spec.frames_per_step, "obs_bytes": obs_bytes, "num_actions": spec.num_actions,
                     "unroll_length": t, "envs_per_actor": k,
                     "env_groups": cfg.actors.env_groups, **work, "forward_flops_per_obs": flops,
                     # what the planner needs of the agent: fields that do not change its work, its device count
                     "unused_fields": sorted(".".join(f) for f in agent.unused_fields),
                     "workload_fields": [".".join(f) for f in agent.workload_fields],
                     "max_learner_devices": agent.max_learner_devices},
        "device": str(device), "torch_threads": cfg.learner.torch_threads,
        "config": cfg.to_dict(),  # the workload calibrated: what plan --validate matches sweep points against
        "env_step_us": env, "actor_loop_us": loop, "smt": smt, "inference_ms": inference, "train_step_ms": training,
        "pipe_round_trip_us": pipe_round_trip_us(500 if quick else 2000),
        "copy_ns_per_byte": copy_ns_per_byte(obs_bytes * k * 64),
        "pipeline": pipeline,
        "hardware": hardware_stamp(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def save(cal: dict, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(strict_dumps(cal, indent=2))
    return p


def load(path: str | Path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise C.ConfigError(f"calibration file {p} not found; make one with `rlbalance calibrate --out {p}`")
    cal = json.loads(p.read_text())
    if cal.get("format") != "rlbalance-calibration-v1":
        raise C.ConfigError(f"{p} is not an rlbalance calibration file (format {cal.get('format')!r})")
    return cal
