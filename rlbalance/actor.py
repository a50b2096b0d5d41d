"""The actor role: step K environments, ask a policy for actions, fill unroll buffers.

``Rollout.fill`` is the actor loop, shared by the serial runner and the actor processes;
``actor_main`` is the process around it (one init function owning signals, threads, affinity).
"""

from __future__ import annotations

import os
import queue
import signal
import time
from typing import Callable, Protocol

import numpy as np
import torch

from .buffers import RolloutBuffers, SharedWeights, StepSlots, UnrollView
from .config import Config
from .envs import EnvBatch
from .timing import StageTimer


class Policy(Protocol):
    def __call__(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """Return (actions [K], logits [K, A], policy version) for observations [K, ...]."""


class Rollout:
    """One actor's envs and its current step; ``fill`` writes the next T steps into a buffer."""

    def __init__(self, envs: EnvBatch, policy: Policy, timer: StageTimer | None = None):
        self.envs, self.policy = envs, policy
        self.timer = timer or StageTimer()
        with self.timer.stage("reset"):
            obs = envs.reset()
        with self.timer.stage("wait_action"):
            self.action, self.logits, self.version = policy(obs)
        self.obs = obs
        self.steps = 0

    def fill(self, buf: UnrollView) -> None:
        timer, envs, policy = self.timer, self.envs, self.policy
        t_len = buf.action.shape[0] - 1
        buf.version[...] = self.version
        for t in range(t_len):
            buf.obs[t] = self.obs
            buf.action[t] = self.action
            buf.logits[t] = self.logits
            with timer.stage("env_step"):
                r = envs.step(self.action)
            buf.reward[t] = r.reward
            buf.done[t] = r.done
            buf.truncated[t] = r.truncated
            if r.truncated.any():
                buf.final_obs[t][r.truncated] = envs.final_obs[r.truncated]
            buf.ep_end[t] = r.game_over
            buf.ep_return[t] = r.ep_return
            buf.ep_length[t] = r.ep_length
            with timer.stage("wait_action"):
                self.action, self.logits, self.version = policy(r.obs)
            self.obs = r.obs
        buf.obs[t_len] = self.obs
        buf.action[t_len] = self.action
        buf.logits[t_len] = self.logits
        buf.reward[t_len] = 0
        buf.done[t_len] = False
        buf.truncated[t_len] = False
        buf.ep_end[t_len] = False
        self.steps += t_len * envs.k


class CentralClient:
    """Policy for central inference: write obs to this actor's slot, flag the server, wait."""

    def __init__(self, actor_id: int, slots: StepSlots, conn):
        self.conn = conn
        self.obs = slots.obs[actor_id].numpy()
        self.action = slots.action[actor_id].numpy()
        self.logits = slots.logits[actor_id].numpy()
        self.version = slots.version[actor_id : actor_id + 1].numpy()

    def __call__(self, obs: np.ndarray):
        self.obs[...] = obs
        self.conn.send_bytes(b"r")
        self.conn.recv_bytes()
        return self.action, self.logits, int(self.version[0])


class LocalPolicy:
    """Policy for actor-side inference: a CPU copy of the model, synced every N learner updates."""

    def __init__(self, model: torch.nn.Module, weights: SharedWeights, lock, sync_every: int, seed: int):
        self.model, self.weights, self.lock, self.sync_every = model, weights, lock, sync_every
        self.generator = torch.Generator().manual_seed(seed)
        self.version = weights.load_into(model, lock)

    def __call__(self, obs: np.ndarray):
        if int(self.weights.version[0]) - self.version >= self.sync_every:
            self.version = self.weights.load_into(self.model, self.lock)
        actions, logits = self.model.act(torch.from_numpy(obs), self.generator)
        return actions.numpy(), logits.numpy(), self.version


def init_process(torch_threads: int, cpus: tuple[int, ...] | None, seed: int) -> None:
    """Per-process setup for every role: signals, torch threads, CPU affinity, seeds."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the learner coordinates shutdown
    torch.set_num_threads(torch_threads)
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)
    torch.manual_seed(seed)
    np.random.seed(seed % (2**32))


def actor_seed(cfg: Config, actor_id: int) -> int:
    return cfg.run.seed * 1_000_003 + actor_id * cfg.actors.envs_per_actor


def actor_main(actor_id: int, cfg: Config, buffers: RolloutBuffers, free_q, full_q, stop_event, conn,
               slots: StepSlots | None, weights: SharedWeights | None, weights_lock, stats_q) -> None:
    """Entry point of one actor process."""
    cpus = None
    if cfg.actors.cpu_affinity:
        cpus = (cfg.actors.cpu_affinity[actor_id % len(cfg.actors.cpu_affinity)],)
    seed = actor_seed(cfg, actor_id)
    init_process(1, cpus, seed)
    envs = EnvBatch(cfg.env, cfg.actors.envs_per_actor, seed)
    timer = StageTimer()
    if cfg.inference.mode == "central":
        policy: Callable = CentralClient(actor_id, slots, conn)
    else:
        from .model import build_model

        model = build_model(cfg.learner, envs.spec)
        policy = LocalPolicy(model, weights, weights_lock, cfg.inference.sync_every, seed)
    try:
        rollout = Rollout(envs, policy, timer)
        last_report = time.perf_counter()
        while not stop_event.is_set():
            with timer.stage("wait_buffer"):
                try:
                    idx = free_q.get(timeout=0.2)
                except queue.Empty:
                    continue
            rollout.fill(buffers.view(idx))
            full_q.put(idx)
            now = time.perf_counter()
            if now - last_report > 1.0:
                stats_q.put(("actor", actor_id, timer.snapshot(reset=True)))
                last_report = now
    except (EOFError, BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        pass  # the server closed the channel: shutdown
    finally:
        envs.close()
