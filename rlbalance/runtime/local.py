"""The runners on one machine: serial (everything in one process) and parallel (actor processes over shared memory,
central inference as a thread beside the learner loop). Both run the one learner loop (``roles.learn``)
over their actor set: get a batch of unrolls, train on it, let the session log, checkpoint and decide when to stop."""

from __future__ import annotations

import multiprocessing as mp

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
from rlbalance.runtime.roles import FaultLedger, RunSession, learn


class SerialActors:
    """The actors of a serial run, in the learner's own process: each batch's buffers are filled by stepping the env
    groups in turn, as the actor processes would (an ``ActorSet`` with nothing to restart)."""

    def __init__(self, rollouts: list[Rollout], buffers: RolloutBuffers, max_restarts: int):
        self.rollouts, self.buffers = rollouts, buffers
        self.ledger = FaultLedger(max_restarts)
        self.turn = 0

    def take_full(self, nb: int) -> list[int]:
        for j in range(nb):
            self.rollouts[self.turn % len(self.rollouts)].fill(self.buffers.view(j))
            self.turn += 1
        return list(range(nb))

    def give_back(self, idx: list[int]) -> None:
        pass

    def poll(self) -> None:
        pass

    def report(self, session: RunSession, final: bool = False) -> None:
        pass

    def stop(self) -> None:
        for r in self.rollouts:
            r.envs.close()


def run_serial(cfg: Config, spec: EnvSpec, learner, session: RunSession) -> None:
    """Everything in one process: the same Rollout, model and learner as the parallel runner."""
    k, g = cfg.actors.envs_per_actor, cfg.actors.env_groups
    device = learner.device
    weights = None
    if cfg.inference.mode == "central":
        gen = torch.Generator(device=device).manual_seed(cfg.run.seed)
        explore = exploration(cfg, device)
        policies: list = [DirectPolicy(learner.model, k, gen, lambda: learner.updates,
                                       None if explore is None else explore[c], device)
                          for c in range(cfg.num_clients)]
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
    actors = SerialActors(rollouts, buffers, cfg.actors.max_restarts)
    session.attach_actors(actors)
    publish = None if weights is None else (lambda: weights.publish(learner.model, learner.updates))
    learn(session, learner, actors, buffers, nb, publish)


def run_parallel(cfg: Config, spec: EnvSpec, learner, session: RunSession) -> None:
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
    pool = ActorPool(ctx, cfg, sh, lambda i, pid: session.watch_process("actor", pid))
    session.attach_actors(pool)
    pool.start_all()
    if sh.slots is not None:
        server = InferenceServer(learner.model, sh.slots, list(pool.parent_conns), learner.device, k,
                                 cfg.inference.max_batch, cfg.inference.max_wait_ms, session.model_lock,
                                 lambda: learner.updates, cfg.run.seed, cfg.telemetry.stage_timers,
                                 exploration(cfg, learner.device))
        pool.serve(server)
        server.start()
    weights = sh.weights
    publish = None if weights is None else (lambda: weights.publish(learner.model, learner.updates))
    learn(session, learner, pool, sh.buffers, cfg.buffers_per_batch, publish)
