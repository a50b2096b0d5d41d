"""Trainer benchmark: env ceiling, learner ceiling and end-to-end FPS, measured in one run.

- env ceiling: the same envs stepped with random actions by the same number of actor processes,
  no learning;
- learner ceiling: training steps on a batch already in memory (real observations from the env);
- end to end: real training runs of fixed length at each actor count, sustained FPS after warm-up.

Writes ``trainer-<workload>.json`` and ``.md`` (table of ratios) and a plot to the output folder.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from rlbalance import config as C
from rlbalance.agents import registry
from rlbalance.core.jsonio import dumps
from rlbalance.envs.batch import probe_spec
from rlbalance.runtime.actor import actor_cpus, actor_env_groups, client_seed, init_process
from rlbalance.runtime.devices import resolve_device
from rlbalance.runtime.rundir import hardware_stamp

WORKLOADS = {
    "cartpole": {},
    # CartPole on the bare defaults (one V-trace pass per batch), the classic preset before it took APPO's
    # passes, kept to measure what the preset costs in SPS, in the same bench run.
    "cartpole-previous": {"run": {"preset": "none"}},
    # The Atari preset (rlbalance/config/presets.py) is the one source of its settings.
    "pong": {"env": {"id": "ALE/Pong-v5"}},
    # The bench's Pong config before the preset (B=16, one pass, gymnasium envs), kept to measure what the
    # preset costs in FPS, in the same bench run; it did not learn Pong (bench/README.md).
    "pong-previous": {"env": {"id": "ALE/Pong-v5", "backend": "gymnasium"}, "run": {"preset": "none"},
                      "actors": {"envs_per_actor": 8},
                      "learner": {"batch_size": 16, "unroll_length": 20, "learning_rate": 8e-4, "reward_clip": 1.0,
                                  "max_grad_norm": 0.5, "torch_threads": 2}},
    "synthetic": {"env": {"id": "synthetic", "synthetic_step_us": 20.0}},
    # R2D2 (learner.agent=r2d2, its preset over the family's) on the same envs, for the sweep of R2D2 against V-trace
    "cartpole-r2d2": {"learner": {"agent": "r2d2"}},
    "pong-r2d2": {"env": {"id": "ALE/Pong-v5"}, "learner": {"agent": "r2d2"}},
    # the same with the torso under bfloat16 autocast (learner.torso_precision=bf16), as the R2D2 Pong run took it
    "pong-r2d2-bf16": {"env": {"id": "ALE/Pong-v5"}, "learner": {"agent": "r2d2", "torso_precision": "bf16"}},
    # MuJoCo continuous control with the continuous preset (Gaussian policy, 10 APPO epochs per batch).
    "halfcheetah": {"env": {"id": "HalfCheetah-v5"}},
}

# End-to-end env steps per actor count where the default (500k) would take too long here.
DEFAULT_STEPS = {"pong": 25_000, "pong-previous": 25_000, "pong-r2d2": 25_000, "pong-r2d2-bf16": 25_000,
                 "halfcheetah": 60_000}


def workload_config(name: str, extra: dict | None = None) -> C.Config:
    return C.build(C.merge(WORKLOADS[name], extra or {}))


def _env_worker(cfg: C.Config, actor_id: int, seconds: float, warmup: float, out_q) -> None:
    g = cfg.actors.env_groups
    init_process(1, actor_cpus(cfg, actor_id), client_seed(cfg, actor_id * g))
    groups = actor_env_groups(cfg, actor_id)
    rng = np.random.default_rng(actor_id)
    for envs in groups:
        envs.reset()
    action, k = groups[0].spec.action, groups[0].k
    t0 = time.perf_counter()
    steps, t_warm = 0, None
    while True:
        now = time.perf_counter()
        if t_warm is None and now - t0 >= warmup:
            t_warm, steps = now, 0
        if now - t0 >= warmup + seconds:
            break
        for envs in groups:
            envs.step(action.random(rng, k))
        steps += k * g
    out_q.put(steps / (time.perf_counter() - t_warm))
    for envs in groups:
        envs.close()


def env_ceiling(cfg: C.Config, num_actors: int, seconds: float = 5.0, warmup: float = 1.0) -> float:
    """SPS of num_actors processes stepping the same envs (env_groups x K each) with random actions."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_env_worker, args=(cfg, i, seconds, warmup, q)) for i in range(num_actors)]
    for p in procs:
        p.start()
    total = sum(q.get(timeout=seconds + warmup + 120) for _ in procs)
    for p in procs:
        p.join()
    return total


def learner_ceiling(cfg: C.Config, seconds: float = 5.0, warmup_updates: int = 3) -> dict:
    """SPS of learner steps on one batch already in memory (observations from real env steps), each step worth what
    the agent says the actors must deliver for it (``Agent.learner_work``: a V-trace update its B x T steps, an R2D2
    gradient step B x period / replay_ratio)."""
    from rlbalance.analysis.calibrate import timed_learner

    spec = probe_spec(cfg.env)
    torch.set_num_threads(cfg.learner.torch_threads)
    device = resolve_device(cfg.learner.device)
    work = registry.get(cfg.learner.agent).learner_work(cfg)
    learner, batch = timed_learner(cfg, spec, device, work["batch_size"], real_env=True)
    for _ in range(warmup_updates):
        learner.timed_step(batch)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        learner.timed_step(batch)
        n += 1
    dt = time.perf_counter() - t0
    per_step = work["env_steps_per_train_step"]
    return {"sps": n * per_step / dt, "updates_per_s": n / dt, "device": str(device),
            "note": f"learner steps of {cfg.learner.agent}, each worth {per_step:g} env steps"}


def end_to_end(cfg: C.Config, num_actors: int, steps: int, out_dir: Path, label: str) -> dict:
    from rlbalance.runtime.train import train

    cfg = replace(cfg, actors=C.fit_buffers(replace(cfg.actors, num_actors=num_actors), cfg.learner),
                  run=replace(cfg.run, total_steps=steps, out_dir=str(out_dir),
                              name=f"{label}-a{num_actors}-{int(time.time())}"),
                  telemetry=replace(cfg.telemetry, progress=False, tensorboard=False))
    return train(cfg)


def run_workload(name: str, actor_counts: list[int], e2e_steps: int, seconds: float, out: Path,
                 extra: dict | None = None, progress=print, peer_steps: int = 200_000) -> dict:
    cfg = workload_config(name, extra)
    fps_mult = probe_spec(cfg.env).frames_per_step
    progress(f"[{name}] learner ceiling ...")
    lc = learner_ceiling(cfg, seconds)
    rows = []
    for a in actor_counts:
        progress(f"[{name}] env ceiling, {a} actor(s) ...")
        ec = env_ceiling(cfg, a, seconds)
        progress(f"[{name}] end-to-end training, {a} actor(s), {e2e_steps:,} steps ...")
        s = end_to_end(cfg, a, e2e_steps, out / "runs", name)
        bound = min(ec, lc["sps"])
        # Where actors and learner share the same cores, a step costs the env's time plus the learner's:
        # the harmonic combination of the two ceilings estimates end-to-end SPS (inference not counted).
        # Not a strict bound: neither ceiling scales perfectly with cores.
        shared = 1.0 / (1.0 / ec + 1.0 / lc["sps"])
        rows.append({"actors": a, "env_ceiling_sps": ec, "learner_ceiling_sps": lc["sps"],
                     "e2e_sps": s["sps_sustained"], "e2e_fps": s["sps_sustained"] * fps_mult,
                     "ratio_to_min_ceiling": s["sps_sustained"] / bound,
                     "shared_core_estimate_sps": shared, "ratio_to_shared_estimate": s["sps_sustained"] / shared,
                     "verdict": s["verdict"],
                     "episode_return_last100": s["episode_return_last100"], "run_dir": s["run_dir"]})
        progress(f"[{name}]   env {ec:,.0f} SPS, learner {lc['sps']:,.0f} SPS, e2e {s['sps_sustained']:,.0f} SPS "
                 f"({rows[-1]['ratio_to_min_ceiling']:.0%} of min ceiling)")
    best = max(rows, key=lambda r: r["e2e_sps"])
    out_doc = {"workload": name, "frames_per_step": fps_mult, "config": cfg.to_dict(), "learner_ceiling": lc,
               "rows": rows, "best": best}
    if name == "cartpole" and peer_steps:
        try:
            from rlbalance.bench.ppo_envpool import ppo_envpool_sps
        except ImportError:
            peer = None
        else:
            progress(f"[{name}] peer: CleanRL-style PPO on EnvPool, {peer_steps:,} steps ...")
            try:
                peer = ppo_envpool_sps(peer_steps)
            except ImportError:
                peer = None
        if peer:
            peer["ours_over_peer"] = best["e2e_sps"] / peer["sps"]
            out_doc["peer_ppo_envpool"] = peer
            progress(f"[{name}]   PPO-EnvPool {peer['sps']:,.0f} SPS; ours/peer {peer['ours_over_peer']:.2f}x")
    return out_doc


def write_results(results: list[dict], out: Path, note: str = "") -> Path:
    out.mkdir(parents=True, exist_ok=True)
    stamp = hardware_stamp()
    doc = {"benchmark": "trainer", "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "hardware": stamp,
           "note": note, "workloads": results}
    (out / "trainer.json").write_text(dumps(doc))
    lines = [f"# Trainer benchmark ({doc['date']})", "",
             f"Machine: {stamp['cpu_model']}, {stamp['usable_cpus']} usable CPUs, "
             f"GPUs: {[g['name'] for g in stamp['gpus']] or 'none'}; commit {stamp['git_commit']}.", "",
             "SPS = env steps/s; FPS = SPS x frameskip. All figures measured in this one run.",
             "Each ceiling is measured alone on all usable cores. The shared-core estimate, "
             "1 / (1/env + 1/learner), is what end-to-end training would reach if every step paid for both "
             "on the same cores, leaving out inference (not a strict bound: neither ceiling scales perfectly "
             "with cores); where actor and learner cores are separate, min(ceilings) is the bound.", ""]
    for r in results:
        lines += [f"## {r['workload']} (learner ceiling {r['learner_ceiling']['sps']:,.0f} SPS on "
                  f"{r['learner_ceiling']['device']})", "",
                  "| actors | env ceiling SPS | learner ceiling SPS | end-to-end SPS | end-to-end FPS | "
                  "e2e / min(ceilings) | shared-core estimate SPS | e2e / estimate | verdict |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for row in r["rows"]:
            lines.append(f"| {row['actors']} | {row['env_ceiling_sps']:,.0f} | {row['learner_ceiling_sps']:,.0f} | "
                         f"{row['e2e_sps']:,.0f} | {row['e2e_fps']:,.0f} | {row['ratio_to_min_ceiling']:.0%} | "
                         f"{row['shared_core_estimate_sps']:,.0f} | {row['ratio_to_shared_estimate']:.0%} | "
                         f"{row['verdict']} |")
        b = r["best"]
        lines += ["", f"Best actor count: {b['actors']} ({b['e2e_sps']:,.0f} SPS, "
                  f"{b['ratio_to_min_ceiling']:.0%} of min(env ceiling, learner ceiling)).", ""]
        if "peer_ppo_envpool" in r:
            p = r["peer_ppo_envpool"]
            lines += [f"Peer in the same run: CleanRL-style PPO on EnvPool (rlbalance/bench/ppo_envpool.py, 8 envs, 4 epochs), "
                      f"{p['sps']:,.0f} SPS over {p['steps']:,} steps; ours at the best actor count is "
                      f"{p['ours_over_peer']:.2f}x that.", ""]
    by_name = {r["workload"]: r for r in results}
    for name, r in by_name.items():  # what a preset costs in throughput, measured in this one run
        prev = by_name.get(f"{name}-previous")
        if prev:
            ratio = r["best"]["e2e_fps"] / prev["best"]["e2e_fps"]
            doc.setdefault("preset_vs_previous", {})[name] = ratio
            lines += [f"**{name} with its preset against {name}-previous** (best actor count each): "
                      f"{r['best']['e2e_fps']:,.0f} against {prev['best']['e2e_fps']:,.0f} FPS end-to-end, "
                      f"{ratio:.0%}.", ""]
    (out / "trainer.json").write_text(dumps(doc))
    (out / "trainer.md").write_text("\n".join(lines) + "\n")
    _plot(results, out / "trainer.png")
    return out / "trainer.md"


def _plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 4), squeeze=False)
    for ax, r in zip(axes[0], results):
        a = [row["actors"] for row in r["rows"]]
        m = r["frames_per_step"]
        ax.plot(a, [row["env_ceiling_sps"] * m for row in r["rows"]], "s--", label="env ceiling")
        ax.axhline(r["learner_ceiling"]["sps"] * m, color="tab:red", ls=":", label="learner ceiling")
        ax.plot(a, [row["e2e_fps"] for row in r["rows"]], "o-", label="end-to-end")
        ax.set_title(r["workload"])
        ax.set_xlabel("actor processes")
        ax.set_ylabel("FPS")
        ax.set_xticks(a)
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
