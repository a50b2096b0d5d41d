"""Actors on a Ray cluster; the learner and its central inference server stay in this process.

Ray places, starts and restarts the actors (``EnvWorker``, one per actor, ``ray.cpus_per_actor`` CPU
resources each); no home-made cluster manager. The per-step channel is one Ray call per env group
and step: ``step(group, actions[K])`` returns the K envs' next observations, rewards and flags, so a
message carries a whole group's K environments. The learner side drives: a thread (``RayFeeder``)
waits on all groups' outstanding calls, batches the observations that are in (the same dynamic
batching as the shared-memory server: everything ready, then up to ``inference.max_wait_ms`` more),
runs one forward pass, and sends each group its actions. It writes the unrolls into buffers in this
process with the same ``UnrollWriter`` as the local actors, so the learner loop is the same.

With ``inference.mode=actor`` a call is ``unroll(group, weights, version)``: the actor runs a CPU copy
of the policy for T steps and returns the whole unroll; new weights go out through Ray's object store
(one ``ray.put`` per version, read by every actor that needs it).

Faults: a call that fails because its actor died (process killed, node lost) voids that group's
half-filled unroll; Ray restarts the actor (``actors.max_restarts``) where resources allow, and the
feeder resets its groups when it is back. A call outstanding longer than ``actors.heartbeat_timeout_s``
is a hung actor: it is killed and restarted. The seconds from an actor's last good reply to its first
after the restart are counted as lost actor-seconds. Training goes on with the other actors meanwhile.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, replace

import numpy as np
import torch

from rlbalance.agents import registry
from rlbalance.agents.base import LearnerBase
from rlbalance.config import Config
from rlbalance.core.cpuinfo import usable_cpus
from rlbalance.core.timing import StageTimer
from rlbalance.envs.batch import EnvSpec
from rlbalance.runtime import balance_ga3c
from rlbalance.runtime.actor import UnrollWriter, unroll_base
from rlbalance.runtime.actor_pool import START_TIMEOUT_S
from rlbalance.runtime.buffers import RolloutBuffers
from rlbalance.runtime.policies import EnvStates, acting_values
from rlbalance.runtime.ray_actors import RayActorSet, RayKnobs, cluster_cpus
from rlbalance.runtime.ray_workers import _RETRY_S, NodeStats, connect
from rlbalance.runtime.roles import NodeFigures, RunSession, learn, take_inference_figures

# -- the learner side (the actor side, EnvWorker, is in ray_workers) ------------------------------------


@dataclass
class _Group:
    """The learner's record of one env group: its buffer, and the call in flight for it."""

    actor: int
    group: int
    client: int = 0  # actor * env_groups + group: the env group's place in the run (its acting values, ...)
    writer: UnrollWriter | None = None
    lives: int = 0  # writers begun: each restart of the group numbers its unrolls from a new base
    buffer: int = -1  # index of the buffer being filled, -1 when waiting for one
    ref: object = None
    sent_at: float = 0.0
    retry_at: float = 0.0
    version: int = -1  # actor mode: the weights version this group's actor was last sent

    @property
    def live(self) -> UnrollWriter:
        """The group's writer, which its reset made (a group steps only after it)."""
        assert self.writer is not None, "an env group is reset before it steps"
        return self.writer


class RayFeeder(threading.Thread):
    """Drives the Ray actors: central inference over their step calls, or collecting their unrolls."""

    def __init__(self, ray, cfg: Config, actors: RayActorSet, buffers: RolloutBuffers, free_q: queue.Queue,
                 full_q: queue.Queue, stats_q: queue.Queue, learner: LearnerBase, model_lock: threading.Lock):
        super().__init__(name="ray-feeder", daemon=True)
        self.ray, self.cfg, self.actors = ray, cfg, actors
        self.buffers, self.free_q, self.full_q, self.stats_q = buffers, free_q, full_q, stats_q
        self.learner, self.model_lock = learner, model_lock
        self.central = cfg.inference.mode == "central"
        g = cfg.actors.env_groups
        self.groups = [_Group(a, j, a * g + j) for a in range(cfg.actors.num_actors) for j in range(g)]
        self.k = cfg.actors.envs_per_actor
        mb = cfg.inference.max_batch
        self.max_groups = max(1, mb // self.k) if mb else len(self.groups)
        self.max_wait = cfg.inference.max_wait_ms / 1000.0
        self.timeout = cfg.actors.heartbeat_timeout_s
        self.stop_event = threading.Event()
        self.timer = StageTimer(cfg.telemetry.stage_timers)  # the inference role (central mode)
        self.batch_sizes: list[int] = []
        self.error: BaseException | None = None
        device = learner.device
        self.device = device
        self.generator = torch.Generator(device=device).manual_seed(cfg.run.seed)
        # central inference: every env's core state (a recurrent policy's) and acting values, on the device
        self.envs = EnvStates(learner.model, len(self.groups), self.k, device, acting_values(cfg, device))
        self.torch_threads = torch.get_num_threads()
        self.actor_cpu_s = 0.0  # CPU seconds the actors reported using (what a self-balancing run measures)
        self.weights: tuple[int, object] | None = None  # actor mode: (version, object ref of flat params)
        self._weights_lock = threading.Lock()
        self.messages = 0
        self.bytes = 0

    # the learner thread publishes new weights for actor-side inference
    def publish(self, model: torch.nn.Module, version: int) -> None:
        if self.weights is not None and version - self.weights[0] < self.cfg.inference.sync_every:
            return
        flat = torch.nn.utils.parameters_to_vector([p.detach() for p in model.parameters()]).cpu().numpy()
        ref = self.ray.put(flat)
        with self._weights_lock:
            self.weights = (version, ref)

    def run(self) -> None:
        torch.set_num_threads(self.torch_threads)  # (a thread's OpenMP team is its own: see InferenceServer.run)
        try:
            self._loop()
        except BaseException as e:
            if not self.stop_event.is_set():
                self.error = e

    def stop(self) -> None:
        self.stop_event.set()

    def set_layout(self, max_wait_ms: float, torch_threads: int) -> None:
        """Move the feeder's wait for a fuller batch and its thread's torch threads (applied at its next round)."""
        self.max_wait, self.torch_threads = max_wait_ms / 1000.0, torch_threads

    def _report(self, report: dict | None) -> None:
        if report is not None:
            self.actor_cpu_s += report.get("cpu_s", 0.0)
            self.stats_q.put(report)

    def _retire_idle(self) -> None:
        """End each retiring actor whose groups have no call out; a buffer one of them holds without an unroll
        under way (its actor failed, or its call was never sent) goes back."""
        for a in list(self.actors.retiring):
            groups = [g for g in self.groups if g.actor == a]
            if any(g.ref is not None or (self.central and g.writer is not None and g.buffer >= 0) for g in groups):
                continue
            for g in groups:
                if g.buffer >= 0:
                    self.free_q.put(g.buffer)
                    g.buffer = -1
                g.writer, g.version = None, -1
            self.actors.retire(a)

    def raise_error(self) -> None:
        """Surface an error of the feeder thread in the learner loop."""
        if self.error is not None:
            raise self.error

    def _send_reset(self, g: _Group) -> None:
        g.writer = None  # a buffer held stays held; the new unroll starts at its row 0
        g.ref = self.actors.handles[g.actor].reset.remote(g.group)
        g.sent_at = time.monotonic()

    def _send_unroll(self, g: _Group) -> None:
        with self._weights_lock:
            version, ref = self.weights if self.weights is not None else (0, None)
        send = ref if version != g.version else None
        g.ref = self.actors.handles[g.actor].unroll.remote(g.group, send, version)
        g.version = version
        g.sent_at = time.monotonic()

    def _take_buffer(self, g: _Group) -> bool:
        if g.buffer >= 0:
            return True
        if not self.actors.running(g.actor):  # (a retiring actor's group takes no new unroll)
            return False
        try:
            g.buffer = self.free_q.get_nowait()
        except queue.Empty:
            return False
        if g.writer is not None:
            g.writer.begin(self.buffers.view(g.buffer))
        return True

    def _fail(self, g: _Group, reason: str) -> None:
        """The group's actor died or hangs: its half-filled unroll is void; ask again after the restart."""
        self.actors.failed(g.actor, reason)
        for other in self.groups:
            if other.actor == g.actor:
                other.ref = None
                other.writer = None
                other.version = -1
                other.retry_at = time.monotonic() + _RETRY_S

    def _loop(self) -> None:
        ray = self.ray
        errors = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)
        if self.central:  # actor mode: unroll calls go out below, once a group has a free buffer
            for g in self.groups:
                if self.actors.running(g.actor):
                    self._send_reset(g)
        while not self.stop_event.is_set():
            if torch.get_num_threads() != self.torch_threads:  # (set_layout)
                torch.set_num_threads(self.torch_threads)
            self._retire_idle()
            now = time.monotonic()
            # groups waiting to be asked again (restarting actor) or for a free buffer
            for g in self.groups:
                if g.ref is None and now >= g.retry_at and self.actors.running(g.actor):
                    if self.central:
                        if g.writer is None:
                            self._send_reset(g)
                    elif self._take_buffer(g):
                        self._send_unroll(g)
            inflight = {g.ref: g for g in self.groups if g.ref is not None}
            if not inflight:
                self._serve([])
                time.sleep(0.01)
                continue
            with self.timer.stage("batch_wait"):
                ready = self._gather(list(inflight))
            answered = []
            for ref in ready:
                g = inflight[ref]
                if g.ref is not ref:  # voided meanwhile: a sibling group's call failed and _fail reset its actor's
                    continue
                g.ref = None
                try:
                    reply = ray.get(ref)
                except errors as e:
                    self._fail(g, f"failed ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
                    continue
                self.actors.ok(g.actor)
                self.messages += 1
                if self.central:
                    if self._on_step(g, reply):
                        answered.append(g)
                else:
                    self._on_unroll(g, reply)
            self._serve([g for g in answered if g.writer is not None])  # (less groups a sibling's failure voided)
            now = time.monotonic()
            for g in self.groups:  # a call outstanding too long: the actor hangs (a starting one gets longer)
                limit = self.timeout if self.actors.replied[g.actor] else max(self.timeout, START_TIMEOUT_S)
                if g.ref is not None and now - g.sent_at > limit and g.actor not in self.actors.down:
                    self.actors.kill(g.actor)
                    self._fail(g, f"silent for {now - g.sent_at:.1f} s (hung)")

    def _gather(self, refs: list) -> list:
        """Wait for one reply, take all others already in, then up to max_wait for a fuller batch."""
        ready, rest = self.ray.wait(refs, num_returns=1, timeout=0.1)
        if not ready:
            return []
        if rest:
            more, rest = self.ray.wait(rest, num_returns=len(rest), timeout=0)
            ready += more
        if self.max_wait > 0 and rest and len(ready) < self.max_groups:
            more, _ = self.ray.wait(rest, num_returns=min(len(rest), self.max_groups - len(ready)),
                                    timeout=self.max_wait)
            ready += more
        return ready

    def _on_step(self, g: _Group, reply) -> bool:
        """A reset's observations or a step's result; True when the group now wants actions."""
        if isinstance(reply, np.ndarray):  # reset: a fresh start for this group
            g.writer = UnrollWriter(self.k, reply, g.client, unroll_base(g.lives))
            g.lives += 1
            if g.buffer >= 0:
                g.writer.begin(self.buffers.view(g.buffer))
            return True
        r, final, report = reply
        self._report(report)
        self.bytes += sum(x.nbytes for x in r)
        if final is not None:
            full_final = np.zeros_like(r.obs)
            full_final[r.truncated] = final
            final = full_final
        if g.live.record_step(r, final):
            self.full_q.put(g.buffer)
            self.actors.delivered[g.actor] += 1
            g.buffer = -1
        return True

    def _on_unroll(self, g: _Group, reply) -> None:
        arrays, report = reply
        self._report(report)
        self.bytes += self.buffers.view(g.buffer).load(arrays)
        self.full_q.put(g.buffer)
        self.actors.delivered[g.actor] += 1
        g.buffer = -1

    def _serve(self, answered: list[_Group]) -> None:
        """One forward pass for every group that has observations and a buffer; send the actions."""
        if not self.central:
            return
        waiting = [g for g in self.groups if g.ref is None and g.writer is not None and g.buffer < 0]
        want = [g for g in answered if g.buffer >= 0 or self._take_buffer(g)]
        want += [g for g in waiting if g not in answered and self._take_buffer(g)]
        while want:
            batch, want = want[: self.max_groups], want[self.max_groups:]
            timer = self.timer
            n = len(batch) * self.k
            with timer.stage("h2d"):
                obs = torch.from_numpy(np.stack([g.live.obs for g in batch]))
                obs = obs.reshape(n, *obs.shape[2:]).to(self.device, non_blocking=True)
                first = torch.from_numpy(np.concatenate([g.live.first for g in batch])).to(self.device)
                idx = torch.tensor([g.client for g in batch], device=self.device)
            with timer.stage("forward"), self.model_lock:
                actions, out, core_in = self.envs.step(idx, obs, first, self.generator)
                version = self.learner.updates
            with timer.stage("d2h"):
                actions = actions.view(len(batch), self.k, *actions.shape[1:]).cpu().numpy()
                record = {name: x.view(len(batch), self.k, *x.shape[1:]).cpu().numpy() for name, x in out.items()}
                core_in = None if core_in is None else core_in.view(len(batch), self.k, -1).cpu().numpy()
            with timer.stage("send"):
                for i, g in enumerate(batch):
                    g.live.record_action(actions[i], {name: x[i] for name, x in record.items()}, version,
                                         None if core_in is None else core_in[i])
                    g.ref = self.actors.handles[g.actor].step.remote(g.group, actions[i])
                    g.sent_at = time.monotonic()
            self.batch_sizes.append(len(batch) * self.k)


class RayActors:
    """The Ray actors of one learner, as the learner loop sees them (an ``ActorSet``): the buffers the feeder
    thread fills from their calls, handed over through queues in this process."""

    def __init__(self, ray, cfg: Config, actors: RayActorSet, feeder: RayFeeder, full_q: queue.Queue,
                 free_q: queue.Queue, stats_q: queue.Queue, nodes: NodeFigures):
        self.ray, self.cfg, self.actors, self.feeder = ray, cfg, actors, feeder
        self.full_q, self.free_q, self.stats_q, self.nodes = full_q, free_q, stats_q, nodes
        self.ledger = actors.ledger
        self.placement: list[dict] | None = None

    def take_full(self, nb: int) -> list[int]:
        """The next ``nb`` full buffer indices; the feeder's error, if it failed, is raised while waiting."""
        idx: list[int] = []
        while len(idx) < nb:
            try:
                idx.append(self.full_q.get(timeout=0.5))
            except queue.Empty:
                self.feeder.raise_error()
        return idx

    def give_back(self, idx: list[int]) -> None:
        for i in idx:
            self.free_q.put(i)

    def poll(self) -> None:
        self.feeder.raise_error()

    def report(self, session: RunSession, final: bool = False) -> None:
        while True:
            try:
                rep = self.stats_q.get_nowait()
            except queue.Empty:
                break
            session.role_snapshot("actor", rep["stages"])
            self.nodes.add(rep)
        if self.feeder.central:
            take_inference_figures(session, self.feeder, final)
        session.set_scalars({"queue/full": float(self.full_q.qsize()), "queue/free": float(self.free_q.qsize())})
        if final and self.placement is not None:
            session.note_info("ray", {"placement": self.placement, "messages": self.feeder.messages,
                                      "bytes_received": self.feeder.bytes})

    def stop(self) -> None:
        self.feeder.stop()
        self.feeder.join(timeout=10)
        self.placement = _placement(self.ray, self.actors)
        self.actors.stop()


def run_ray(cfg: Config, spec: EnvSpec, learner: LearnerBase, session: RunSession) -> None:
    """The parallel runner with Ray actors: the one learner loop over Ray-fed buffers. With run.balance=auto the
    actor set has room for the most actors the run may grow to (on the cluster's CPUs), and a ``Balancer`` moves the
    actor count, the learner's threads and the feeder's wait from the learner loop."""
    ray, owned = connect(cfg)
    active = cfg.actors.num_actors
    if cfg.run.balance != "off":
        capacity = max(active, cfg.run.balance_max_actors or 2 * cluster_cpus(ray))
        cfg = replace(cfg, actors=replace(cfg.actors, num_actors=capacity))
    k, t = cfg.actors.envs_per_actor, cfg.learner.unroll_length
    n_buf = cfg.num_buffers
    buffers = RolloutBuffers.allocate(n_buf, t, k, spec, shared=False, record=registry.step_record(cfg, spec),
                                      core_size=registry.core_state_size(cfg.learner, spec))
    free_q: queue.Queue[int] = queue.Queue()
    full_q: queue.Queue[int] = queue.Queue()
    stats_q: queue.Queue[dict] = queue.Queue()
    for i in range(n_buf):
        free_q.put(i)
    handles = RayActorSet(ray, cfg, active)
    feeder = RayFeeder(ray, cfg, handles, buffers, free_q, full_q, stats_q, learner, session.model_lock)
    if not feeder.central:
        feeder.publish(learner.model, learner.updates)
    actors = RayActors(ray, cfg, handles, feeder, full_q, free_q, stats_q, session.node_figures(NodeStats))
    session.attach_actors(actors)
    feeder.start()
    publish = None if feeder.central else (lambda: feeder.publish(learner.model, learner.updates))
    balancer = None
    if cfg.run.balance != "off":
        knobs = RayKnobs(handles, feeder, cfg.learner.torch_threads, cfg.inference.max_wait_ms)
        balancer = balance_ga3c.controller(cfg, knobs, cluster_cpus(ray), max_actors=handles.capacity,
                                           max_threads=usable_cpus(), knob_names=("actors", "threads", "wait")
                                           if feeder.central else ("actors", "threads"))
        session.attach_balancer(balancer)
    try:
        learn(session, learner, actors, buffers, cfg.buffers_per_batch, publish, balancer)
    finally:
        if owned:
            ray.shutdown()


def _placement(ray, actors: RayActorSet) -> list[dict]:
    out = []
    for h in actors.handles:
        if h is None:  # (a self-balancing run's actor not running at the end)
            continue
        try:
            out.append(ray.get(h.info.remote(), timeout=5))
        except Exception as e:  # an actor still restarting or gone
            out.append({"error": type(e).__name__})
    return out
