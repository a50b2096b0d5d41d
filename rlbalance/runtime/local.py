"""The runners on one machine: serial (everything in one process) and parallel (actor processes over shared memory,
central inference as a thread beside the learner loop). The learner loop of each reads top to bottom: get a batch
of unrolls, train on it, let the session log, checkpoint and decide when to stop."""

from __future__ import annotations

import multiprocessing as mp
import time

import torch

from rlbalance.agents import registry
from rlbalance.config import Config
from rlbalance.envs.batch import EnvBatch, EnvSpec
from rlbalance.runtime.actor import (
    ActorShared,
    DirectPolicy,
    LocalModel,
    Rollout,
    client_seed,
    exploration,
)
from rlbalance.runtime.actor_pool import ActorPool
from rlbalance.runtime.buffers import RolloutBuffers, SharedWeights, StepSlots
from rlbalance.runtime.inference import InferenceServer
from rlbalance.runtime.session import Session, take_inference_figures


def run_serial(cfg: Config, spec: EnvSpec, learner, session: Session) -> None:
    """Everything in one process: the same Rollout, model and learner as the parallel runner."""
    k, g = cfg.actors.envs_per_actor, cfg.actors.env_groups
    device = learner.device
    if cfg.inference.mode == "central":
        gen = torch.Generator(device=device).manual_seed(cfg.run.seed)
        explore = exploration(cfg, device)
        policies = [DirectPolicy(learner.model, k, gen, lambda: learner.updates,
                                 None if explore is None else explore[c], device) for c in range(cfg.num_clients)]
    else:
        weights = SharedWeights.allocate(learner.model)
        explore = exploration(cfg)
        policies = []
        for a in range(cfg.actors.num_actors):
            local = LocalModel(registry.build_model(cfg.learner, spec), weights, cfg.inference.sync_every,
                               client_seed(cfg, a * g))
            policies += [local.policy(k, None if explore is None else explore[a * g + i]) for i in range(g)]
    rollouts = [Rollout(EnvBatch(cfg.env, k, client_seed(cfg, c)), policies[c], client=c)
                for c in range(cfg.num_clients)]
    nb = cfg.buffers_per_batch
    buffers = RolloutBuffers.allocate(nb, cfg.learner.unroll_length, k, spec, shared=False,
                                      core_size=registry.core_state_size(cfg.learner, spec))
    turn = 0
    while not session.done():
        for j in range(nb):
            rollouts[turn % len(rollouts)].fill(buffers.view(j))
            turn += 1
        batch = buffers.gather(list(range(nb)))
        stats = learner.train(batch)
        if cfg.inference.mode == "actor":
            weights.publish(learner.model, learner.updates)
        session.after_update(batch, stats)
    for r in rollouts:
        r.envs.close()


def run_parallel(cfg: Config, spec: EnvSpec, learner, session: Session) -> None:
    """Actor processes over shared memory; central inference as a thread beside the learner loop."""
    ctx = mp.get_context("spawn")
    k, t, n_buf = cfg.actors.envs_per_actor, cfg.learner.unroll_length, cfg.num_buffers
    central = cfg.inference.mode == "central"
    core = registry.core_state_size(cfg.learner, spec)
    sh = ActorShared(
        buffers=RolloutBuffers.allocate(n_buf, t, k, spec, shared=True, core_size=core),
        stop=torch.zeros(1, dtype=torch.uint8).share_memory_(),
        heartbeat=torch.zeros(cfg.actors.num_actors, dtype=torch.float64).share_memory_(),
        slots=StepSlots.allocate(cfg.num_clients, k, spec, shared=True, core_size=core) if central else None,
        weights=None if central else SharedWeights.allocate(learner.model))
    on_start = (lambda i, pid: session.sampler.watch("actor", pid)) if session.sampler is not None else None
    pool = ActorPool(ctx, cfg, sh, on_start)
    pool.start_all()
    server = None
    if central:
        server = InferenceServer(learner.model, sh.slots, list(pool.parent_conns), learner.device, k,
                                 cfg.inference.max_batch, cfg.inference.max_wait_ms, session.model_lock,
                                 lambda: learner.updates, cfg.run.seed, cfg.telemetry.stage_timers,
                                 exploration(cfg, learner.device))
        pool.server = server
        server.start()
    session.actor_pool = pool
    nb = cfg.buffers_per_batch
    last_check = time.perf_counter()
    try:
        while not session.done():
            with session.timer.stage("wait_data"):
                idx = pool.take_full(nb, lambda: _check_health(pool, server))
            batch = sh.buffers.gather(idx)
            pool.give_back(idx)
            stats = learner.train(batch)
            if sh.weights is not None:
                with session.timer.stage("weight_publish"):
                    sh.weights.publish(learner.model, learner.updates)
            if time.perf_counter() - last_check > 1.0:
                _check_health(pool, server)
                last_check = time.perf_counter()
            pool.receive(0)
            _drain_stats(pool, session, server)
            session.after_update(batch, stats)
    finally:
        pool.stop()
        _drain_stats(pool, session, server, final=True)


def _check_health(pool: ActorPool, server) -> None:
    if server is not None and server.error is not None:
        raise server.error
    pool.check()


def _drain_stats(pool: ActorPool, session: Session, server, final: bool = False) -> None:
    for role, _i, snap in pool.take_stats():
        session.role_snapshot(role, snap)
    if server is not None:
        take_inference_figures(session, server, final)
    session.extra_scalars["queue/full"] = float(len(pool.full))
    session.extra_scalars["queue/at_actors"] = float(len(pool.at_actor))
