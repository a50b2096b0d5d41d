"""The throughput model and planner: from a calibration, predict FPS, the bottleneck, node power and the
best CPU/GPU ratios on another machine (a catalog entry or a user-described one).

Per env step, in microseconds:

- actor side, on one hardware thread: the actor loop's cost per step at K envs (env step and buffer
  writes; times the SMT factor when actors use sibling threads) + the message round trip shared by K
  envs + copying the observation to the step slot; actor SPS = actor threads x 1e6 / that;
- learner side, on one accelerator: training time per step (update time / (B x T); an agent with a replay: gradient step
  time / (B x T / replay_ratio), the env steps each gradient step is due for) + inference time
  per step (forward time / batch) at the batch that device's share of the actors keeps in flight (one
  learner process and inference server per device); learner SPS = devices x 1e6 / that.
  On another GPU both scale by its speed relative to the calibrated device: a GPU calibration file where
  there is one, else a roofline estimate (model FLOPs over peak FP32 at a stated efficiency, plus a fixed
  per-call overhead), marked modeled;
- where there is no GPU, the learner runs on host threads; actors and learner then share the machine
  when actor threads + learner threads exceed its threads, and a step costs the sum of both. There the
  measured pipeline loop (a short training run on a free env at 1, N and 2N actor processes) gives the
  round trips and each process's CPU per step; at other envs per actor K its terms move as the loop measured
  them move at about K/4 and 4K (per step: linear in 1/K, per-step work plus per-request work shared by K
  envs; the wait for a request: linear in K).

FPS = frameskip x min(actor SPS, learner SPS); the smaller side is the verdict. Power: CPU idle at 30% of
TDP plus the busy share of the rest, GPUs idle plus their utilization share of TDP less idle, plus a base.

Coverage: every prediction says which of its lookups fell outside what the calibration measured (an env
count, inference or training batch, or actor count past the measured ones; a GPU speed from the roofline;
a machine other than the calibrated one) and gives an FPS range besides the point. The range spans the
two ways an extrapolated term can go on: held at the value measured at the edge ('edge'; a per-call time
grows in proportion to its batch past the largest measured batch), or along the slope of the last two
measured points ('trend', kept within a factor of 2 of the edge value); the roofline's efficiency is
taken at half and twice its stated value. Every combination is evaluated, and the band widens by the
model's validated error (VALIDATED_ERROR, the 90th percentile of ``rlbalance bench planner``'s errors).
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from dataclasses import dataclass, field

from rlbalance import config as C
from rlbalance.analysis.catalog import GpuSpec, Machine
from rlbalance.analysis.ratio import KNEE_TOLERANCE
from rlbalance.core.errors import ConfigError

ROOFLINE_EFFICIENCY = 0.3  # fraction of peak FP32 a small RL model reaches (stated, modeled)
GPU_INFER_OVERHEAD_MS = 0.08  # kernel launches and sync per forward pass (modeled)
GPU_TRAIN_OVERHEAD_MS = 1.5  # per update: forward, backward, optimizer kernels (modeled)
CPU_IDLE_FRACTION = 0.3
# The band every prediction carries even where it stays within the calibration: the 90th percentile of the absolute
# FPS errors of the planner's validation on held-out sweep points (bench/results/planner/planner-validation.md: 43
# points over 11 workloads, 2 cores, 2026-12-05: 12.0%; 15.3% with the first calibration of cartpole-large-model,
# whose pipeline loop ran 15% slow and which was made again: the band takes the wider, since a user calibrates
# once). Measured; rlbalance bench planner re-measures it (its p90_abs_error).
VALIDATED_ERROR = 0.15


def interp(table: dict[str, float], x: float) -> float:
    """Piecewise-linear in x through the measured points; linear extrapolation past the ends."""
    pts = sorted((float(k), float(v)) for k, v in table.items())
    if len(pts) == 1:
        return pts[0][1] * x / pts[0][0] if x > pts[0][0] else pts[0][1]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1 or (x1, y1) == pts[-1]:
            return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 1e-9)
    return pts[-1][1]


@dataclass
class Lookups:
    """The table lookups of one prediction: which fell outside the measured range (``outside``: name -> why), and
    how each extrapolated term goes on (``modes``: name -> 'edge' or 'trend'; unnamed terms take their default)."""

    modes: dict[str, str] = field(default_factory=dict)
    outside: dict[str, str] = field(default_factory=dict)

    def table(self, name: str, table: dict[str, float], x: float, per_call: bool = False,
              edge_default: bool = False, what: str = "") -> float:
        """``table`` at ``x``: piecewise-linear inside the measured points; past them as the term's mode says
        (``edge_default``: the point prediction holds the edge value, else it follows the trend)."""
        pts = sorted((float(k), float(v)) for k, v in table.items())
        (x0, y0), (x1, y1) = pts[0], pts[-1]
        if x0 <= x <= x1:
            return interp(table, x)
        self.outside[name] = f"{what or name} at {x:g}, measured {x0:g}" + (f"..{x1:g}" if x1 != x0 else "")
        edge_x, edge_y = (x0, y0) if x < x0 else (x1, y1)
        edge = edge_y * x / edge_x if per_call and x > x1 else edge_y  # a batch past the largest: in proportion
        if self.modes.get(name, "edge" if edge_default else "trend") == "edge" or len(pts) == 1:
            return edge
        return min(max(interp(table, x), edge / 2), edge * 2)


def _workload(cal: dict, key: str):
    """A calibration's workload field, with what files from before agents were named (V-trace's) meant."""
    w = cal["workload"]
    default = {"agent": C.LearnerConfig.agent, "rows_per_sample": w.get("unroll_length", 0) + 1}.get(key)
    return w.get(key, default)


def learner_devices(cal: dict, m: Machine) -> int:
    """The devices a workload's learner uses on ``m``: one per GPU (a learner process and inference server each), up
    to the most its agent trains on (the calibration's ``max_learner_devices``)."""
    most = _workload(cal, "max_learner_devices")
    return min(max(m.gpus, 1), most) if most else max(m.gpus, 1)


def gpu_speed(cal: dict, gpu: GpuSpec, efficiency: float = ROOFLINE_EFFICIENCY) -> dict:
    """Speed of ``gpu`` relative to the calibrated device for inference and training (roofline, modeled)."""
    w = cal["workload"]
    peak = gpu.fp32_tflops * 1e12 * efficiency
    b_inf = 128
    t_inf = GPU_INFER_OVERHEAD_MS + w["forward_flops_per_obs"] * b_inf / peak * 1e3
    b_tr = w["batch_size"]
    # row-forwards per sample, as the agent counts them (Agent.learner_work; the calibration records it); files
    # from before it did: a forward and a backward (about two) over T + 1 rows
    passes = w.get("row_forwards_per_sample", 3 * (w["unroll_length"] + 1))
    t_tr = GPU_TRAIN_OVERHEAD_MS + w["forward_flops_per_obs"] * b_tr * passes / peak * 1e3
    return {"inference": interp(cal["inference_ms"], b_inf) / t_inf,
            "training": interp(cal["train_step_ms"], b_tr) / t_tr, "source": "modeled (roofline)"}


def gpu_speed_measured(cal: dict, gpu_cal: dict) -> dict:
    """Speed of the GPU a calibration file was made on, relative to ``cal``'s device: the ratio of their
    measured inference (batch 128) and training (the workload's B) times."""
    for key in ("env", "agent", "model", "unroll_length", "rows_per_sample"):
        if _workload(cal, key) != _workload(gpu_cal, key):
            raise ConfigError(f"GPU calibration: workload.{key} is {gpu_cal['workload'].get(key)!r}, the "
                              f"calibration's is {cal['workload'].get(key)!r}; calibrate the same workload on the GPU")
    b = cal["workload"]["batch_size"]
    name = gpu_name(gpu_cal) or "?"
    return {"inference": interp(cal["inference_ms"], 128) / interp(gpu_cal["inference_ms"], 128),
            "training": interp(cal["train_step_ms"], b) / interp(gpu_cal["train_step_ms"], b),
            "source": f"measured (GPU calibration on {name})"}


def gpu_name(cal: dict) -> str | None:
    gpus = (cal.get("hardware") or {}).get("gpus") or []
    return gpus[0].get("name") if gpus and str(cal.get("device", "")).startswith("cuda") else None


def speed_for(cal: dict, m: Machine, gpu_cals: list[dict]) -> dict | None:
    """A measured speed where a GPU calibration was made on the machine's GPU model (its catalog name,
    e.g. A100, in the NVML name), else None: the roofline estimate applies."""
    if not m.gpu:
        return None
    for g in gpu_cals:
        name = gpu_name(g)
        if name and m.gpu.name.lower() in name.lower():
            return gpu_speed_measured(cal, g)
    return None


def predict(cal: dict, m: Machine, actor_threads: int | None = None, speed: dict | None = None,
            envs_per_actor: int | None = None, env_groups: int | None = None) -> dict:
    """The modeled FPS, verdict and power of the workload on ``m`` with ``actor_threads`` actor threads (default:
    all but what the learner takes) of ``env_groups`` groups of ``envs_per_actor`` envs each (default: the
    calibrated workload's), with ``extrapolated`` / ``extrapolation`` (the terms outside what the calibration
    measured, and why) and ``fps_range`` [low, high] (see the module's note on coverage)."""
    shape = (envs_per_actor, env_groups)
    lk = Lookups()
    p = _predict(cal, m, actor_threads, speed, lk, *shape)
    why = dict(lk.outside)
    roofline = bool(m.gpus) and speed is None
    if roofline:
        why["gpu"] = f"{m.gpu.name} speed from the roofline model (no calibration on that GPU: --gpu-calibration)"
    calibrated = this_machine(cal) if "hardware" in cal else None
    if calibrated and (m.threads, m.gpus) != (calibrated.threads, 0):
        why["machine"] = (f"calibrated on a {calibrated.threads}-thread machine without a GPU; predicted for "
                          f"{m.threads} threads" + (f" and {m.gpus} GPU(s)" if m.gpus else ""))
    fps = [p["fps"]]
    terms = sorted(lk.outside)
    for modes in itertools.product(("edge", "trend"), repeat=len(terms)):
        for eff in ((ROOFLINE_EFFICIENCY / 2, min(1.0, ROOFLINE_EFFICIENCY * 2)) if roofline else (None,)):
            alt = gpu_speed(cal, m.gpu, eff) if eff else speed
            fps.append(_predict(cal, m, actor_threads, alt, Lookups(dict(zip(terms, modes))), *shape)["fps"])
    p.update(extrapolated=bool(why), extrapolation=list(why.values()),
             fps_range=[min(fps) * (1 - VALIDATED_ERROR), max(fps) * (1 + VALIDATED_ERROR)])
    return p


def _envs_shift(pipe: dict, k0: int, k: int, lk: Lookups) -> dict[str, float]:
    """How the pipeline loop's terms change from the calibrated K0 envs per actor to ``k``, from the loop measured
    at other K (at ``envs_actors`` actors): per env step, the actor's and the learner process's CPU and the
    learner process's time (1 / sps) are per-step work plus per-request work shared by K envs, so they go
    piecewise-linearly in 1/K through the measured points; the wait for one request's actions goes linearly in K.
    Returns each term's change (to add to its value at any actor count); {} where nothing was measured."""
    at_k0 = (pipe.get("points") or {}).get(str(pipe.get("envs_actors")))
    extra = pipe.get("envs_points") or {}
    if not at_k0 or not extra:
        return {}
    pts = {int(k0): {**at_k0, "free_env_step_us": pipe.get("free_env_step_us", 0.0)},
           **{int(x): q for x, q in extra.items()}}
    sub = Lookups(modes={"x": lk.modes.get("envs", "trend")})

    def over(value, inverse: bool = True) -> float:  # value(point) at k less its value at k0
        x_of = (lambda x: 1.0 / x) if inverse else float
        table = {str(x_of(x)): value(q) for x, q in pts.items()}
        return sub.table("x", table, x_of(k)) - table[str(x_of(k0))]

    shift = {key: over(lambda q, key=key: q[key])
             for key in ("actor_cpu_us_per_step", "learner_cpu_us_per_step", "free_env_step_us")}
    shift["inv_sps"] = over(lambda q: 1e6 / q["sps"])
    if all("request_wait_us" in q for q in pts.values()):
        shift["request_wait_us"] = over(lambda q: q["request_wait_us"], inverse=False)
    if sub.outside:
        lk.outside["envs"] = f"envs per actor at {k:g}, the pipeline loop measured {min(pts):g}..{max(pts):g}"
    return shift


def _predict(cal: dict, m: Machine, actor_threads: int | None, speed: dict | None, lk: Lookups,
             envs_per_actor: int | None = None, env_groups: int | None = None) -> dict:
    w = cal["workload"]
    k0, g0 = w["envs_per_actor"], max(int(w.get("env_groups", 1)), 1)
    k, t, b = envs_per_actor or k0, w["unroll_length"], w["batch_size"]
    g = max(int(env_groups or g0), 1)
    learner_threads = 0 if m.gpus else int(cal.get("torch_threads", 1))
    if actor_threads is None:
        actor_threads = m.threads - (1 if m.gpus else learner_threads)
    pipe = cal.get("pipeline") if not m.gpus else None
    # more actor processes than threads is a point the CPU pipeline loop measures (up to twice the CPUs): kept
    actor_threads = max(1, actor_threads if pipe else min(actor_threads, m.threads))
    smt = (cal.get("smt") or {}).get("factor") or 1.0
    smt_threads = max(0, actor_threads - m.cores)  # threads beyond one per core run on siblings
    if "actor_loop_us" in cal:  # the whole actor loop (env + buffer writes) was measured
        env_us = lk.table("env", cal["actor_loop_us"], k, what="envs per actor")
        overhead_us = cal["pipe_round_trip_us"] / k + w["obs_bytes"] * cal["copy_ns_per_byte"] / 1e3
    else:
        env_us = lk.table("env", cal["env_step_us"], k, what="envs per actor")
        overhead_us = cal["pipe_round_trip_us"] / k + 3 * w["obs_bytes"] * cal["copy_ns_per_byte"] / 1e3
    per_thread = [env_us * (smt if i < 2 * smt_threads else 1.0) for i in range(actor_threads)]
    actor_sps = sum(1e6 / (c + overhead_us) for c in per_thread)
    actor_cost_us = actor_threads * 1e6 / actor_sps  # thread-microseconds per step
    # one inference server per learner device, each batching its own share of the actors (learner.devices=N)
    devices = learner_devices(cal, m)
    in_flight = max(k, min(512, actor_threads * k * g // (2 * devices)))
    inf_us = lk.table("inference", cal["inference_ms"], in_flight, per_call=True,
                      what="inference batch") * 1e3 / in_flight
    train_us = (lk.table("training", cal["train_step_ms"], b, per_call=True, what="training batch") * 1e3
                / w.get("env_steps_per_train_step", b * t))
    if m.gpus:
        speed = speed or gpu_speed(cal, m.gpu)
        inf_us, train_us = inf_us / speed["inference"], train_us / speed["training"]
    device_us = inf_us + train_us
    learner_sps = devices * 1e6 / device_us
    if pipe:  # the measured pipeline loop: round trips and CPU per step with the CPU learner beside
        def loop(key: str) -> float:  # a loop term at this many actor processes
            return lk.table("pipeline", {a: q[key] for a, q in pipe["points"].items()}, actor_threads,
                            edge_default=True, what="actor threads in the pipeline loop")

        def measured(key: str) -> bool:  # (files from before a term was measured lack it)
            return all(key in q for q in pipe["points"].values())

        at = {key: loop(key) for key in ("group_cycle_us", "actor_cpu_us_per_step", "learner_cpu_us_per_step")}
        free_us = pipe.get("free_env_step_us", 0.0)
        shift = _envs_shift(pipe, k0, k, lk) if k != k0 else {}
        if k != k0 and not shift:  # a calibration without the loop at other K: its terms held as measured at K0
            lk.outside["envs"] = (f"envs per actor at {k:g}; this calibration's pipeline loop ran only {k0:g} "
                                  "(calibrate again for the loop at other envs per actor)")
        if g != g0:
            lk.outside["groups"] = f"env groups at {g:g}, the pipeline loop ran {g0:g}"
        for key in ("actor_cpu_us_per_step", "learner_cpu_us_per_step"):
            at[key] = max(1e-3, at[key] + shift.get(key, 0.0))
        env_extra = max(0.0, lk.table("env", cal["env_step_us"], k, what="envs per actor")
                        - max(0.0, free_us + shift.get("free_env_step_us", 0.0)))
        if measured("request_wait_us"):
            # An actor's round over its g groups: each steps its K envs (the env's cost over the free env's, plus
            # the actor loop's CPU per step), then waits for its request's actions, L, less the time the other
            # groups' steps took meanwhile
            wait = max(0.0, loop("request_wait_us") + shift.get("request_wait_us", 0.0))
            turn = k * (env_extra + at["actor_cpu_us_per_step"])
            cycle = g * turn + g * max(0.0, wait - (g - 1) * turn)
        else:  # a calibration from before the request wait was measured: the loop's cycle plus the env's cost
            cycle = max(at["group_cycle_us"] + k * env_extra, g * k * env_extra)  # a group's turn; all groups
        actor_sps = min(actor_sps, actor_threads * g * k * 1e6 / cycle)
        actor_cost_us = env_extra + at["actor_cpu_us_per_step"]
        device_us = at["learner_cpu_us_per_step"]
        learner_sps = m.threads * 1e6 / device_us  # with the whole machine; the shared capacity is below
        if measured("sps"):
            # The learner process (learner and inference server threads under one GIL) saturates below the
            # machine's threads: the pipeline's own throughput with free actors is the learner side's ceiling.
            learner_sps = min(learner_sps, 1e6 / max(1e6 / loop("sps") + shift.get("inv_sps", 0.0), 1e-3))
    sps = min(actor_sps, learner_sps)
    shared = not m.gpus and (actor_threads + learner_threads > m.threads or bool(pipe))
    cpu_bound = False
    if shared:  # actors and the CPU learner take turns on the same threads
        per_step = actor_cost_us + device_us * (1 if pipe else learner_threads)
        capacity = m.threads * 1e6 / per_step
        cpu_bound = capacity < sps
        sps = min(sps, capacity)
    if cpu_bound:
        verdict = "actor-bound" if actor_cost_us >= device_us else "learner-bound"
    elif actor_sps <= learner_sps:
        verdict = "actor-bound"
    else:
        verdict = "inference-bound" if inf_us > train_us else "learner-bound"
    busy_threads = min(m.threads, sps * actor_cost_us / 1e6 + (0 if m.gpus else sps * device_us / 1e6))
    cpu_w = m.cpu_tdp_w * (CPU_IDLE_FRACTION + (1 - CPU_IDLE_FRACTION) * busy_threads / m.threads)
    gpu_util = sps / learner_sps if m.gpus else 0.0
    # the learner's devices busy at gpu_util, any others idle
    gpu_w = (m.gpus * m.gpu.idle_w + devices * (m.gpu.tdp_w - m.gpu.idle_w) * gpu_util) if m.gpus else 0.0
    node_w = cpu_w + gpu_w + m.base_w
    fps = sps * w["frames_per_step"]
    return {"machine": m.name, "actor_threads": actor_threads, "sps": sps, "fps": fps, "verdict": verdict,
            "actor_sps": actor_sps, "learner_sps": learner_sps, "shared_cores": shared, "gpu_util": gpu_util,
            "inference_batch_per_device": in_flight,
            "node_power_w": node_w, "fps_per_watt": fps / node_w,
            "cost_per_billion_frames": (m.price_per_hour / (fps * 3600) * 1e9) if m.price_per_hour else None,
            "speed": speed, "source": "modeled"}


def best_ratios(cal: dict, m: Machine, speed: dict | None = None, envs_per_actor: int | None = None) -> dict:
    """Throughput- and efficiency-optimal actor threads per accelerator on machine ``m`` (per accelerator the learner
    uses: see learner_devices), with ``envs_per_actor`` envs per group (default: the calibrated workload's)."""
    acc = learner_devices(cal, m)
    reserve = 1 if m.gpus else int(cal.get("torch_threads", 1))
    rows = [predict(cal, m, r * acc, speed, envs_per_actor=envs_per_actor)
            for r in range(1, max(1, (m.threads - reserve) // acc) + 1)]
    best = max(p["fps"] for p in rows)
    knee = next(p for p in rows if p["fps"] >= (1 - KNEE_TOLERANCE) * best)
    eff = max(rows, key=lambda p: p["fps_per_watt"])
    return {"throughput_optimal_R": knee["actor_threads"] / acc, "efficiency_optimal_R": eff["actor_threads"] / acc,
            "at_knee": knee, "at_efficiency": eff, "curve": rows,
            "has_R": (m.threads - reserve) / acc, "source": "modeled"}


def this_machine(cal: dict) -> Machine:
    hw = cal["hardware"]
    return Machine("this machine", hw.get("cpu_model", "?"), int(hw.get("physical_cores") or hw["logical_cpus"]),
                   int(hw.get("usable_cpus") or hw["logical_cpus"]), 0, None, 10.0 * hw["logical_cpus"], 100.0)


def _actor_processes(row: dict) -> int:
    """A local sweep run's actor processes (which the CPU pipeline loop is measured against, more than the cores
    included); the actor cores of the row where its config does not say (a Ray run: the CPUs it reserved)."""
    cfg = _row_config(row)
    if (cfg.get("ray") or {}).get("address") or not cfg.get("actors"):
        return int(row["actor_cores"])
    return int(cfg["actors"]["num_actors"])


# The config fields that make a workload what was calibrated: a sweep point that differs in one of them ran another
# workload (actor counts, envs per actor and env groups are what the model carries over; run and telemetry settings
# do not change the work).
WORKLOAD_FIELDS = (("env", "id"), ("env", "backend"), ("env", "frameskip"), ("env", "synthetic_step_us"),
                   ("env", "synthetic_cost"), ("env", "synthetic_obs_shape"), ("env", "synthetic_obs_dtype"),
                   ("learner", "agent"), ("learner", "model"), ("learner", "hidden_sizes"), ("learner", "core"),
                   ("learner", "core_size"), ("learner", "unroll_length"), ("learner", "batch_size"),
                   ("learner", "epochs"), ("learner", "minibatches"), ("learner", "torso_precision"),
                   ("learner", "devices"), ("learner", "torch_threads"), ("inference", "mode"),
                   ("inference", "max_batch"), ("inference", "max_wait_ms"))
# (and the agent's own fields that change its work, less those that do not: the calibration's workload_fields and
# unused_fields, from its Agent)


def workload_mismatch(cal: dict, row: dict) -> str | None:
    """Why sweep point ``row`` did not run the calibrated workload (the first field that differs), or None. A
    calibration from before it recorded its config is matched on the env id alone."""
    cfg = _row_config(row)
    ref = cal.get("config")
    own = [tuple(f.split(".")) for f in cal["workload"].get("workload_fields", [])]
    unused = {tuple(f.split(".")) for f in cal["workload"].get("unused_fields", [])}
    fields = (*WORKLOAD_FIELDS, *own) if ref else (("env", "id"),)
    ref = ref or {"env": {"id": cal["workload"]["env"]}}
    for section, name in fields:
        want, got = (ref.get(section) or {}).get(name), (cfg.get(section) or {}).get(name)
        if (section, name) == ("learner", "model") and "auto" in (want, got):
            continue  # 'auto' resolves per env: the env id is compared
        if (section, name) in unused:
            continue
        if want is not None and got is not None and json.dumps(want) != json.dumps(got):
            return f"{section}.{name} is {got!r}, the calibration's is {want!r}"
    return None


def validate(cal: dict, rows: list[dict]) -> dict:
    """Predicted against measured FPS for sweep points on the calibrated machine (a point run several times
    counts with the median of its runs, and its spread is kept), each with its own actor count, envs per actor
    and env groups. Points of another workload (a sweep database may hold several) are left out and listed in
    ``skipped``; if none is of the calibrated workload, a ConfigError says why."""
    from rlbalance.analysis.sweep import combine_repeats

    m = this_machine(cal)
    out, skipped = [], []
    combined = combine_repeats(rows)
    for r in combined:
        why = workload_mismatch(cal, r)
        if why:
            skipped.append({"key": r["key"], "sweep": r.get("sweep"), "why": why})
            continue
        if not r["fps"] or r["fps"] <= 0:  # a point with no measured FPS (too short a run) says nothing
            continue
        acts = _row_actors(r)
        p = predict(cal, m, _actor_processes(r), envs_per_actor=acts.get("envs_per_actor"),
                    env_groups=acts.get("env_groups"))
        out.append({"key": r["key"], "point": r["point"], "measured_fps": r["fps"], "measured_fps_min": r["fps_min"],
                    "measured_fps_max": r["fps_max"], "runs": r["runs"], "predicted_fps": p["fps"],
                    "predicted_fps_range": p["fps_range"], "extrapolated": p["extrapolated"],
                    "in_range": p["fps_range"][0] <= r["fps"] <= p["fps_range"][1],
                    "error": abs(p["fps"] - r["fps"]) / r["fps"], "measured_verdict": r["verdict"],
                    "predicted_verdict": p["verdict"]})
    if combined and len(skipped) == len(combined):
        raise ConfigError(f"none of the {len(combined)} sweep points ran the calibrated workload "
                          f"({cal['workload']['env']}); e.g. {skipped[0]['key']}: {skipped[0]['why']}. Validate "
                          "against a sweep of the workload you calibrated (plan --validate DB --sweep NAME)")
    errs = [x["error"] for x in out]
    return {"points": out, "median_abs_error": statistics.median(errs) if errs else math.nan,
            "worst_abs_error": max(errs) if errs else math.nan, "skipped": skipped}


def _row_config(row: dict) -> dict:
    """A sweep row's whole config (stored as JSON text in the database)."""
    cfg = row.get("config")
    return json.loads(cfg) if isinstance(cfg, str) else cfg or {}


def _row_actors(row: dict) -> dict:
    return _row_config(row).get("actors") or {}
