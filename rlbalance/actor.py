"""The actor role: step K environments, ask a policy for actions, fill unroll buffers.

``Rollout.step`` is the actor loop's body, shared by the serial runner and the actor processes. A
policy is asked in two halves, ``request(obs)`` then ``receive()``, so an actor process can step one
env group while another group's request is in flight (double-buffered sampling). ``actor_main`` is
the process around it: one init function owns signals, threads and CPU affinity.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from .buffers import RolloutBuffers, SharedWeights, StepSlots, UnrollView
from .config import Config
from .envs import EnvBatch, StepResult
from .timing import StageTimer


class Policy(Protocol):
    def request(self, obs: np.ndarray) -> None:
        """Ask for actions for observations [K, ...] (may return before they are ready)."""

    def receive(self) -> tuple[np.ndarray, np.ndarray, int]:
        """The answer to the last request: (actions [K], logits [K, A], policy version)."""


class UnrollWriter:
    """Writes one env group's steps into its current unroll buffer, in two halves: the action chosen
    at x_t, then what stepping the envs gave. Used where the envs are stepped in this process
    (``Rollout``) and where they are stepped elsewhere (the Ray runner's learner-side record)."""

    def __init__(self, k: int, obs: np.ndarray):
        self.k, self.obs = k, obs
        self.buf: UnrollView | None = None
        self.t = 0
        self.steps = 0

    def begin(self, buf: UnrollView) -> None:
        self.buf, self.t = buf, 0

    def record_action(self, action: np.ndarray, logits: np.ndarray, version: int) -> None:
        buf, t = self.buf, self.t
        if t == 0:
            buf.version[...] = version
        buf.obs[t] = self.obs
        buf.action[t] = action
        buf.logits[t] = logits

    def record_step(self, r: StepResult, final_obs: np.ndarray | None) -> bool:
        """The transition of the recorded action; True when the buffer is complete. ``final_obs`` is
        needed only where ``r.truncated`` (rows elsewhere are ignored)."""
        buf, t = self.buf, self.t
        buf.reward[t] = r.reward
        buf.done[t] = r.done
        buf.truncated[t] = r.truncated
        if r.truncated.any():
            buf.final_obs[t][r.truncated] = final_obs[r.truncated]
        buf.ep_end[t] = r.game_over
        buf.ep_return[t] = r.ep_return
        buf.ep_length[t] = r.ep_length
        self.obs = r.obs
        self.t += 1
        self.steps += self.k
        complete = self.t == buf.action.shape[0] - 1
        if complete:  # row T: the bootstrap observation (its action comes with the next buffer's row 0)
            buf.obs[self.t] = self.obs
            buf.reward[self.t] = 0
            buf.done[self.t] = buf.truncated[self.t] = buf.ep_end[self.t] = False
        return complete


class Rollout(UnrollWriter):
    """One env group stepped in this process, and its place in the current unroll buffer."""

    def __init__(self, envs: EnvBatch, policy: Policy, timer: StageTimer | None = None):
        self.envs, self.policy = envs, policy
        self.timer = timer or StageTimer()
        with self.timer.stage("reset"):
            obs = envs.reset()
        super().__init__(envs.k, obs)
        policy.request(self.obs)

    def step(self) -> bool:
        """Take one step of all K envs into the buffer; True when the buffer is complete."""
        timer = self.timer
        with timer.stage("wait_action"):
            action, logits, version = self.policy.receive()
        self.record_action(action, logits, version)
        with timer.stage("env_step"):
            r = self.envs.step(action)
        complete = self.record_step(r, self.envs.final_obs)
        self.policy.request(self.obs)
        return complete

    def fill(self, buf: UnrollView) -> None:
        """Fill a whole buffer (the serial runner's way)."""
        self.begin(buf)
        while not self.step():
            pass


class CentralClient:
    """Central inference: write obs to this group's slot, flag the server; later read the answer."""

    def __init__(self, client_id: int, slots: StepSlots, conn):
        self.conn = conn
        self.obs = slots.obs[client_id].numpy()
        self.action = slots.action[client_id].numpy()
        self.logits = slots.logits[client_id].numpy()
        self.version = slots.version[client_id : client_id + 1].numpy()

    def request(self, obs: np.ndarray) -> None:
        self.obs[...] = obs
        self.conn.send_bytes(b"r")

    def receive(self):
        self.conn.recv_bytes()
        return self.action, self.logits, int(self.version[0])


class DirectPolicy:
    """A policy evaluated at request time in this process (serial runner, actor-side inference)."""

    def __init__(self, act, version_fn):
        self.act, self.version_fn = act, version_fn
        self.answer = None

    def request(self, obs: np.ndarray) -> None:
        actions, logits = self.act(obs)
        self.answer = (actions, logits, self.version_fn())

    def receive(self):
        return self.answer


class LocalModel:
    """Actor-side inference: a CPU copy of the model, synced when sync_every learner updates passed.
    One per actor process, shared by its env groups (each with its own DirectPolicy)."""

    def __init__(self, model: torch.nn.Module, weights: SharedWeights, lock, sync_every: int, seed: int):
        self.model, self.weights, self.lock, self.sync_every = model, weights, lock, sync_every
        self.generator = torch.Generator().manual_seed(seed)
        self.version = weights.load_into(model, lock)

    def act(self, obs: np.ndarray):
        if int(self.weights.version[0]) - self.version >= self.sync_every:
            self.version = self.weights.load_into(self.model, self.lock)
        actions, logits = self.model.act(torch.from_numpy(obs), self.generator)
        return actions.numpy(), logits.numpy()

    def policy(self) -> DirectPolicy:
        return DirectPolicy(self.act, lambda: self.version)


def init_process(torch_threads: int, cpus: tuple[int, ...] | None, seed: int) -> None:
    """Per-process setup for every role: signals, torch threads, CPU affinity, seeds."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the learner coordinates shutdown
    torch.set_num_threads(torch_threads)
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)
    torch.manual_seed(seed)
    np.random.seed(seed % (2**32))


def client_seed(cfg: Config, client_id: int) -> int:
    """Seed of env group ``client_id`` (actor * env_groups + group); its envs take seed + 0..K-1."""
    return cfg.run.seed * 1_000_003 + client_id * cfg.actors.envs_per_actor


def actor_env_groups(cfg: Config, actor_id: int, life: int = 0) -> list[EnvBatch]:
    """The env groups of actor ``actor_id`` in its ``life``-th process (0: the first), each seeded apart;
    a fault injected for tests (env.synthetic_fault) is armed in actor 0's first life only."""
    g = cfg.actors.env_groups
    return [EnvBatch(cfg.env, cfg.actors.envs_per_actor, client_seed(cfg, actor_id * g + i) + 7919 * life,
                     fault_armed=(actor_id == 0 and i == 0 and life == 0)) for i in range(g)]


def actor_cpus(cfg: Config, actor_id: int) -> tuple[int, ...] | None:
    aff = cfg.actors.cpu_affinity
    return (aff[actor_id % len(aff)],) if aff else None


@dataclass
class ActorShared:
    """Everything an actor process shares with the learner, handed over once at start."""

    buffers: RolloutBuffers
    free_q: object
    full_q: object
    stats_q: object
    stop: object
    heartbeat: torch.Tensor  # [num_actors] float64: time.monotonic() of each actor's last step
    owner: torch.Tensor      # [num_buffers] int64: the actor filling each buffer, -1 when none
    slots: StepSlots | None
    weights: SharedWeights | None
    weights_lock: object


def actor_main(actor_id: int, incarnation: int, cfg: Config, sh: ActorShared, conns) -> None:
    """Entry point of one actor process: env_groups rollouts stepped in turn.

    ``incarnation`` counts restarts of this actor (0 for the first); a fault injected for tests
    (env.synthetic_fault) fires in the first incarnation of actor 0 only."""
    g = cfg.actors.env_groups
    clients = [actor_id * g + i for i in range(g)]
    init_process(1, actor_cpus(cfg, actor_id), client_seed(cfg, clients[0]) + 7919 * incarnation)
    timer = StageTimer(cfg.telemetry.stage_timers)
    heartbeat = sh.heartbeat.numpy()
    owner = sh.owner.numpy()
    heartbeat[actor_id] = time.monotonic()
    envs = actor_env_groups(cfg, actor_id, incarnation)
    if cfg.inference.mode == "central":
        policies = [CentralClient(c, sh.slots, conn) for c, conn in zip(clients, conns)]
    else:
        from .model import build_model

        model = build_model(cfg.learner, envs[0].spec)
        local = LocalModel(model, sh.weights, sh.weights_lock, cfg.inference.sync_every, client_seed(cfg, clients[0]))
        policies = [local.policy() for _ in clients]

    def beat() -> None:
        heartbeat[actor_id] = time.monotonic()

    def take() -> int:
        idx = _take(sh.free_q, sh.stop, timer, beat)
        owner[idx] = actor_id
        return idx

    try:
        rollouts = [Rollout(e, p, timer) for e, p in zip(envs, policies)]
        owned = [take() for _ in rollouts]
        for r, idx in zip(rollouts, owned):
            r.begin(sh.buffers.view(idx))
        last_report = time.perf_counter()
        while not sh.stop.is_set():
            for i, r in enumerate(rollouts):
                if r.step():
                    owner[owned[i]] = -1
                    sh.full_q.put(owned[i])
                    owned[i] = take()
                    r.begin(sh.buffers.view(owned[i]))
            heartbeat[actor_id] = time.monotonic()
            now = time.perf_counter()
            if now - last_report > 1.0:
                _check_parent()
                sh.stats_q.put(("actor", actor_id, timer.snapshot(reset=True)))
                last_report = now
    except (EOFError, BrokenPipeError, ConnectionResetError, KeyboardInterrupt, _Stopped):
        pass  # the server closed the channel or the learner asked us to stop
    finally:
        sh.stats_q.put(("actor", actor_id, timer.snapshot(reset=True)))  # the last stage times
        for e in envs:
            e.close()


class _Stopped(Exception):
    pass


def _check_parent() -> None:
    """An actor whose learner died (kill -9) stops instead of living on as an orphan."""
    parent = mp.parent_process()
    if parent is not None and not parent.is_alive():
        raise _Stopped


def _take(free_q, stop_event, timer: StageTimer, beat) -> int:
    """A free buffer index. Waiting on the learner is not hanging: the heartbeat goes on meanwhile."""
    with timer.stage("wait_buffer"):
        while not stop_event.is_set():
            try:
                return free_q.get(timeout=0.2)
            except queue.Empty:
                beat()
                _check_parent()
    raise _Stopped
