"""The runners on one machine: serial (everything in one process) and parallel (actor processes over shared memory,
central inference as a thread beside the learner loop). Both run the one learner loop (``roles.learn``)
over their actor set: get a batch of unrolls, train on it, let the session log, checkpoint and decide when to stop."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
from typing import Any

import psutil
import torch

from rlbalance.agents import registry
from rlbalance.config import Config
from rlbalance.core.cpuinfo import usable_cpus
from rlbalance.envs.batch import EnvBatch, EnvSpec
from rlbalance.runtime.actor import ActorShared, Rollout, client_seed
from rlbalance.runtime.actor_pool import ActorPool
from rlbalance.runtime import balance_ga3c
from rlbalance.runtime.balance import ProcessCpu
from rlbalance.runtime.buffers import RolloutBuffers, SharedWeights, StepSlots
from rlbalance.runtime.inference import InferenceServer
from rlbalance.runtime.policies import DirectPolicy, LocalModel, acting_values, group_values
from rlbalance.runtime.roles import FaultLedger, RunSession, learn
from rlbalance.telemetry.balance_model import Layout


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
        values = acting_values(cfg, device)
        policies: list = [DirectPolicy(learner.model, k, gen, lambda: learner.updates, group_values(values, c), device)
                          for c in range(cfg.num_clients)]
    else:
        weights = SharedWeights.allocate(learner.model)
        values = acting_values(cfg)
        policies = []
        for a in range(cfg.actors.num_actors):
            local = LocalModel(registry.build_model(cfg.learner, spec), weights, cfg.inference.sync_every,
                               client_seed(cfg, a * g))
            policies += [local.policy(k, group_values(values, a * g + i)) for i in range(g)]
    rollouts = [Rollout(EnvBatch(cfg.env, k, client_seed(cfg, c)), policies[c], client=c)
                for c in range(cfg.num_clients)]
    nb = cfg.buffers_per_batch
    buffers = RolloutBuffers.allocate(nb, cfg.learner.unroll_length, k, spec, shared=False,
                                      record=registry.step_record(cfg, spec),
                                      core_size=registry.core_state_size(cfg.learner, spec))
    actors = SerialActors(rollouts, buffers, cfg.actors.max_restarts)
    session.attach_actors(actors)
    publish = None if weights is None else (lambda: weights.publish(learner.model, learner.updates))
    learn(session, learner, actors, buffers, nb, publish)


def balance_capacity(cfg: Config) -> int:
    """The most actor processes a self-balancing run may run (run.balance_max_actors; 0: twice the usable cores)."""
    return max(cfg.actors.num_actors, cfg.run.balance_max_actors or 2 * usable_cpus())


class LocalKnobs:
    """What a self-balancing run moves on local actor processes (``balance.Knobs``): the pool's running actors,
    the learner process's torch threads (the learner loop's and the inference server's), the server's wait, and
    the envs per actor (a controlled restart: ``restart_pending`` until the runner builds the actors anew)."""

    def __init__(self, threads: int, wait_ms: float, envs: int):
        self.pool: ActorPool | None = None
        self.server: InferenceServer | None = None
        self.threads, self.wait_ms, self.envs = threads, wait_ms, envs
        self.built_envs = envs  # the envs per actor the running actors were built with
        self.actor_cpu = ProcessCpu()
        self.me = psutil.Process()
        self.next_actors = 1  # the actors to run when the actors are built anew

    def bind(self, pool: ActorPool, server: InferenceServer | None) -> None:
        """The actors built (again) at ``envs`` per actor."""
        self.pool, self.server, self.built_envs, self.next_actors = pool, server, self.envs, pool.active
        for pid in pool.pids():
            self.actor_cpu.add(pid)

    def layout(self) -> Layout:
        assert self.pool is not None
        return Layout(self.pool.active or self.next_actors, self.threads, self.wait_ms, self.envs)

    def apply(self, to: Layout) -> None:
        assert self.pool is not None
        if to.actors != self.pool.active and to.envs == self.built_envs:
            self.pool.resize(to.actors)
        if to.threads != self.threads:
            torch.set_num_threads(to.threads)  # (called from the learner loop: the learner thread's own)
        self.threads, self.wait_ms, self.envs = to.threads, to.wait_ms, to.envs
        self.next_actors = to.actors
        if self.server is not None:
            self.server.set_layout(max_wait_ms=to.wait_ms, torch_threads=to.threads)

    def restart_pending(self) -> bool:
        return self.envs != self.built_envs

    def settled(self) -> bool:
        assert self.pool is not None
        return self.pool.settled()

    def cpu_seconds(self) -> tuple[float, float]:
        t = self.me.cpu_times()
        return self.actor_cpu.seconds(), t.user + t.system

    def faults(self) -> int:
        assert self.pool is not None
        return self.pool.ledger.restarts  # (one ledger over every pool of the run)


def envs_choices(cfg: Config) -> tuple[int, ...]:
    """Envs per actor a self-balancing run may move to: the divisors of learner.batch_size (each buffer holds K
    unrolls, a batch whole buffers) up to 64."""
    b = cfg.learner.batch_size
    return tuple(k for k in range(1, min(b, 64) + 1) if b % k == 0)


def run_parallel(cfg: Config, spec: EnvSpec, learner, session: RunSession) -> None:
    """Actor processes over shared memory; central inference as a thread beside the learner loop. With
    run.balance=auto the shared memory is allocated for the most actors the run may grow to, a ``Balancer`` moves
    the layout from the learner loop, and a move of the envs per actor drains the actors and builds them anew."""
    knobs: LocalKnobs | None = None
    balancer: Any = None  # balance.Balancer, or balance_ga3c.GA3CBalancer (run.balance=ga3c)
    if cfg.run.balance != "off":
        knobs = LocalKnobs(cfg.learner.torch_threads, cfg.inference.max_wait_ms, cfg.actors.envs_per_actor)
    active = cfg.actors.num_actors
    while True:
        if knobs is not None:  # room for every actor the balancer may start, at the envs per actor it chose
            cfg = dataclasses.replace(cfg, actors=dataclasses.replace(
                cfg.actors, num_actors=balance_capacity(cfg), envs_per_actor=knobs.envs))
        pool, server, sh = _start_actors(cfg, spec, learner, session, active, knobs)
        if knobs is not None and balancer is None:
            cores = usable_cpus()
            central = server is not None
            balancer = balance_ga3c.controller(cfg, knobs, cores, max_actors=pool.capacity, max_threads=cores,
                                               envs=envs_choices(cfg), knob_names=("actors", "threads", "wait", "envs")
                                               if central else ("actors", "threads", "envs"))
            session.attach_balancer(balancer)
        weights = sh.weights
        publish = None if weights is None else (lambda: weights.publish(learner.model, learner.updates))
        learn(session, learner, pool, sh.buffers, cfg.buffers_per_batch, publish, balancer)
        if knobs is None or not knobs.restart_pending() or session.done():
            return
        active = knobs.next_actors


def _start_actors(cfg: Config, spec: EnvSpec, learner, session: RunSession, active: int,
                  knobs: LocalKnobs | None) -> tuple[ActorPool, InferenceServer | None, ActorShared]:
    ctx = mp.get_context("spawn")
    k, t, n_buf = cfg.actors.envs_per_actor, cfg.learner.unroll_length, cfg.num_buffers
    central = cfg.inference.mode == "central"
    core, record = registry.core_state_size(cfg.learner, spec), registry.step_record(cfg, spec)
    sh = ActorShared(
        buffers=RolloutBuffers.allocate(n_buf, t, k, spec, shared=True, record=record, core_size=core),
        stop=torch.zeros(1, dtype=torch.uint8).share_memory_(),
        heartbeat=torch.zeros(cfg.actors.num_actors, dtype=torch.float64).share_memory_(),
        slots=StepSlots.allocate(cfg.num_clients, k, spec, shared=True, record=record, core_size=core)
        if central else None,
        weights=None if central else SharedWeights.allocate(learner.model))
    if sh.weights is not None:
        sh.weights.publish(learner.model, learner.updates)

    def started(i: int, pid: int) -> None:
        session.watch_process("actor", pid)
        if knobs is not None:
            knobs.actor_cpu.add(pid)

    pool = ActorPool(ctx, cfg, sh, started, active=active,
                     ledger=knobs.pool.ledger if knobs is not None and knobs.pool is not None else None)
    session.attach_actors(pool)
    pool.start_all()
    server = None
    if sh.slots is not None:
        server = InferenceServer(learner.model, sh.slots, list(pool.parent_conns), learner.device, k,
                                 cfg.inference.max_batch, knobs.wait_ms if knobs else cfg.inference.max_wait_ms,
                                 session.model_lock, lambda: learner.updates, cfg.run.seed,
                                 cfg.telemetry.stage_timers, acting_values(cfg, learner.device))
        pool.serve(server)
        server.start()
    if knobs is not None:
        knobs.bind(pool, server)
        learner.relayout(cfg)
    return pool, server, sh
