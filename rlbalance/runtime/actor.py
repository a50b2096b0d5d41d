"""The actor role: step K environments, ask a policy for actions, fill unroll buffers.

``Rollout.step`` is the actor loop's body, shared by the serial runner and the actor processes. A
policy is asked in two halves, ``request(obs)`` then ``receive()``, so an actor process can step one
env group while another group's request is in flight (double-buffered sampling). ``actor_main`` is
the process around it: one init function owns signals, threads and CPU affinity.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import time
import traceback
from dataclasses import dataclass

import numpy as np
import torch

from rlbalance.agents import registry
from rlbalance.config import Config
from rlbalance.core.timing import StageTimer
from rlbalance.envs.batch import EnvBatch, StepResult
from rlbalance.runtime.buffers import (
    RolloutBuffers,
    SharedWeights,
    StepSlots,
    UnrollView,
)
from rlbalance.runtime.policies import CentralClient, LocalModel, Policy, acting_values, group_values


class UnrollWriter:
    """Writes one env group's steps into its current unroll buffer, in two halves: the action chosen
    at x_t, then what stepping the envs gave. Used where the envs are stepped in this process
    (``Rollout``) and where they are stepped elsewhere (the Ray runner's learner-side record)."""

    def __init__(self, k: int, obs: np.ndarray, client: int = 0, first_unroll: int = 0):
        self.k, self.obs, self.client = k, obs, client
        self.first = np.ones(k, dtype=bool)  # obs starts an episode: after a reset, and after done or truncated
        self.buf: UnrollView | None = None
        self.t = 0
        self.steps = 0
        self.unrolls = first_unroll  # unrolls begun: consecutive numbers mark consecutive unrolls of the same envs

    def begin(self, buf: UnrollView) -> None:
        self.buf, self.t = buf, 0
        buf.client[...] = self.client
        buf.unroll[...] = self.unrolls
        self.unrolls += 1

    def record_action(self, action: np.ndarray, record: dict[str, np.ndarray], version: int,
                      core_in: np.ndarray | None = None) -> None:
        """``record``: the agent's fields of this step (name: [K, *shape]); ``core_in``: a recurrent policy's state
        [K, S] this step started from (kept for row 0)."""
        buf, t = self.buf, self.t
        assert buf is not None, "begin() gives the writer a buffer first"
        if t == 0:
            buf.version[...] = version
            if core_in is not None:
                buf.core[...] = core_in
        buf.obs[t] = self.obs
        buf.action[t] = action
        for name, x in record.items():
            buf.record[name][t] = x

    def record_step(self, r: StepResult, final_obs: np.ndarray | None) -> bool:
        """The transition of the recorded action; True when the buffer is complete. ``final_obs`` is
        needed only where ``r.truncated`` (rows elsewhere are ignored)."""
        buf, t = self.buf, self.t
        assert buf is not None, "begin() gives the writer a buffer first"
        buf.reward[t] = r.reward
        buf.done[t] = r.done
        buf.truncated[t] = r.truncated
        if r.truncated.any():
            assert final_obs is not None, "a truncated step comes with its final observation"
            buf.final_obs[t][r.truncated] = final_obs[r.truncated]
        buf.ep_end[t] = r.game_over
        buf.ep_return[t] = r.ep_return
        buf.ep_length[t] = r.ep_length
        self.obs = r.obs
        self.first = r.done | r.truncated  # (the learner resets a recurrent core by the same rule)
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

    def __init__(self, envs: EnvBatch, policy: Policy, timer: StageTimer | None = None, client: int = 0,
                 first_unroll: int = 0):
        self.envs, self.policy = envs, policy
        self.timer = timer or StageTimer()
        with self.timer.stage("reset"):
            obs = envs.reset()
        super().__init__(envs.k, obs, client, first_unroll)
        policy.request(self.obs, self.first)

    def step(self) -> bool:
        """Take one step of all K envs into the buffer; True when the buffer is complete."""
        timer = self.timer
        with timer.stage("wait_action"):
            action, record, version = self.policy.receive()
        self.record_action(action, record, version, self.policy.core_in)
        with timer.stage("env_step"):
            r = self.envs.step(action)
        complete = self.record_step(r, self.envs.final_obs)
        self.policy.request(self.obs, self.first)
        return complete

    def fill(self, buf: UnrollView) -> None:
        """Fill a whole buffer (the serial runner's way)."""
        self.begin(buf)
        while not self.step():
            pass



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
    """Everything an actor process shares with the learner, handed over once at start.

    Nothing here is a lock: an actor can be SIGKILLed at any moment, and a lock it held would stay held
    (a multiprocessing queue's lock did exactly that and stalled the other actors). Buffer indices and
    stage times travel over each actor's own control pipe; flags and heartbeats are shared memory with
    a single writer each."""

    buffers: RolloutBuffers
    stop: torch.Tensor       # [1] uint8: set by the learner to stop every actor
    heartbeat: torch.Tensor  # [num_actors] float64: time.monotonic() of each actor's last step
    slots: StepSlots | None
    weights: SharedWeights | None


FREE, FULL, STATS, START_FAILED = b"B", b"F", b"S", b"X"  # control-pipe message kinds: free buffer in; full buffer,
# stats and the error an actor could not start with (its traceback) out
RETIRE = b"R"  # in: finish each group's unroll in progress, take no new buffer, exit (a run that balances itself)
START_FAILED_EXIT = 86  # an actor's exit code when it could not start (START_FAILED says why)


def encode_index(kind: bytes, idx: int) -> bytes:
    return kind + int(idx).to_bytes(4, "little")


class BufferLink:
    """The actor's end of its control pipe: free buffer indices come in, full ones and stage times go out.

    Each message is one write of a few bytes (atomic on a pipe), one writer and one reader per direction."""

    def __init__(self, conn, actor_id: int, stop: torch.Tensor, beat):
        self.conn, self.actor_id, self.stop, self.beat = conn, actor_id, stop, beat
        self.free: list[int] = []
        self.retiring = False

    def _receive(self, timeout: float) -> None:
        if self.conn.poll(timeout):
            while True:
                msg = self.conn.recv_bytes()
                if msg[:1] == FREE:
                    self.free.append(int.from_bytes(msg[1:5], "little"))
                elif msg[:1] == RETIRE:
                    self.retiring = True
                if not self.conn.poll(0):
                    break

    def take(self, timer: StageTimer) -> int | None:
        """A free buffer index; None once the learner retires this actor (the buffers it sent and this actor did
        not begin stay the learner's). Waiting on the learner is not hanging: the heartbeat goes on meanwhile."""
        with timer.stage("wait_buffer"):
            self._receive(0)
            while not self.free and not self.retiring:
                if self.stop[0]:
                    raise _Stopped
                self._receive(0.2)
                self.beat()
                _check_parent()
        return None if self.retiring else self.free.pop(0)

    def full(self, idx: int) -> None:
        self.conn.send_bytes(encode_index(FULL, idx))

    def stats(self, snap: dict) -> None:
        self.conn.send_bytes(STATS + pickle.dumps(("actor", self.actor_id, snap)))

    def start_failed(self, text: str) -> None:
        """The traceback of the error this actor could not start with, for the learner to show once."""
        try:
            self.conn.send_bytes(START_FAILED + text.encode())
        except OSError:
            pass


def actor_main(actor_id: int, incarnation: int, cfg: Config, sh: ActorShared, conns, ctl) -> None:
    """Entry point of one actor process: env_groups rollouts stepped in turn.

    ``conns`` are the inference channels of its env groups (central inference), ``ctl`` its control pipe
    to the learner. ``incarnation`` counts restarts of this actor (0 for the first); a fault injected for
    tests (env.synthetic_fault) fires in the first incarnation of actor 0 only."""
    g = cfg.actors.env_groups
    clients = [actor_id * g + i for i in range(g)]
    init_process(1, actor_cpus(cfg, actor_id), client_seed(cfg, clients[0]) + 7919 * incarnation)
    if os.environ.get(FAULT_INJECTION_ENV) == "1":  # rlbalance bench chaos: SIGUSR1 is a crash at a random point
        signal.signal(signal.SIGUSR1, _injected_crash)
    timer = StageTimer(cfg.telemetry.stage_timers)
    heartbeat = sh.heartbeat.numpy()
    heartbeat[actor_id] = time.monotonic()

    def beat() -> None:
        heartbeat[actor_id] = time.monotonic()

    link = BufferLink(ctl, actor_id, sh.stop, beat)
    envs: list[EnvBatch] = []
    try:
        try:
            envs = actor_env_groups(cfg, actor_id, incarnation)
            policies: list[Policy]
            if sh.slots is not None:  # (central inference)
                policies = [CentralClient(c, sh.slots, conn) for c, conn in zip(clients, conns)]
            else:
                assert sh.weights is not None, "actor-side inference reads the learner's weights"
                model = registry.build_model(cfg.learner, envs[0].spec)
                local = LocalModel(model, sh.weights, cfg.inference.sync_every, client_seed(cfg, clients[0]))
                values = acting_values(cfg)
                policies = [local.policy(cfg.actors.envs_per_actor, group_values(values, c)) for c in clients]
        except Exception as e:  # (an import, an env constructor): it would fail the same way after any restart
            if isinstance(e, InjectedCrash):
                raise
            link.start_failed(traceback.format_exc())
            raise SystemExit(START_FAILED_EXIT) from None  # (the learner shows the traceback, once)
        rollouts = [Rollout(e, p, timer, c, unroll_base(incarnation)) for e, p, c in zip(envs, policies, clients)]
        owned: list[int | None] = [link.take(timer) for _ in rollouts]
        for r, idx in zip(rollouts, owned):
            if idx is not None:
                r.begin(sh.buffers.view(idx))
        last_report = time.perf_counter()
        while not sh.stop[0] and any(idx is not None for idx in owned):  # (retired: every unroll finished)
            for i, r in enumerate(rollouts):
                idx = owned[i]
                if idx is not None and r.step():
                    link.full(idx)
                    idx = owned[i] = link.take(timer)
                    if idx is not None:
                        r.begin(sh.buffers.view(idx))
            beat()
            now = time.perf_counter()
            if now - last_report > 1.0:
                _check_parent()
                link.stats(timer.snapshot(reset=True))
                last_report = now
        link.stats(timer.snapshot(reset=True))  # the last stage times
    except (EOFError, BrokenPipeError, ConnectionResetError, KeyboardInterrupt, _Stopped):
        # the server closed the channel or the learner asked us to stop: the last stage times still go to the
        # learner, which reads the control pipe after the actors exit (a run shorter than one report has no other)
        try:
            link.stats(timer.snapshot(reset=True))
        except (OSError, EOFError, ValueError):
            pass  # the learner closed the control pipe or is gone
    finally:
        for env in envs:
            env.close()


def unroll_base(incarnation: int) -> int:
    """The first unroll number of an actor's ``incarnation``: far from the last one's, so a restarted actor's
    unrolls never pass for the continuation of its predecessor's (an agent that chains an env's unrolls into sequences goes by their numbers)."""
    return incarnation << 40


class _Stopped(Exception):
    pass


FAULT_INJECTION_ENV = "RLBALANCE_FAULT_INJECTION"


class InjectedCrash(RuntimeError):
    """An actor crash injected on purpose (``rlbalance bench chaos`` sends SIGUSR1)."""


def _injected_crash(signum, frame) -> None:
    raise InjectedCrash("crash injected by rlbalance bench chaos (SIGUSR1)")


def _check_parent() -> None:
    """An actor whose learner died (kill -9) stops instead of living on as an orphan."""
    parent = mp.parent_process()
    if parent is not None and not parent.is_alive():
        raise _Stopped
