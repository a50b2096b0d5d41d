"""The roles' interfaces: what a runner may ask of the actors it drives (``ActorSet``) and of the session it reports
to (``RunSession``), and the one learner loop every runner runs over them (``learn``).

An actor set is the actors of one learner, wherever they run: in this process (serial), in local processes over
shared memory (``actor_pool.ActorPool``), or on a Ray cluster (``ray_runner.RayActorSet``). Each hands the learner
full unroll buffers, takes them back, keeps its actors alive within ``actors.max_restarts`` (one ``FaultLedger``
for all of them), and passes its roles' figures to the session. A session is rank 0's ``session.Session`` (run
directory, metrics, checkpoints) or a learner rank's ``ddp_runner.RankSession`` (which reports to rank 0): the runners
take either through ``RunSession`` and set nothing on it from outside.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import threading

    import torch

    from rlbalance.core.timing import StageTimer


class ActorFailure(RuntimeError):
    """Actors failed more often than actors.max_restarts allows."""


class FaultLedger:
    """An actor set's restarts, the actor-seconds lost while actors were down, and the log of each fault, within
    the ``max_restarts`` a run allows: the same rule and the same words for local and Ray actors."""

    def __init__(self, max_restarts: int, what: str = "actor"):
        self.max_restarts, self.what = max_restarts, what
        self.restarts = 0
        self.lost_seconds = 0.0
        self.events: list[dict] = []
        self.down: dict[int, float] = {}  # actor -> its last sign of life before it failed

    def fault(self, actor: int, reason: str, last_alive: float, hint: str = "") -> None:
        """Actor ``actor`` failed (``reason``); it is restarted unless the restarts allowed are used up
        (ActorFailure). ``last_alive``: its last sign of life (time.monotonic), from which its lost time counts."""
        if self.restarts >= self.max_restarts:
            raise ActorFailure(f"{self.what} {actor} {reason}, and the {self.restarts} restarts allowed "
                               f"(actors.max_restarts) are used up{hint}")
        self.restarts += 1
        self.events.append({"actor": actor, "reason": reason, "at": time.strftime("%H:%M:%S")})
        self.down.setdefault(actor, last_alive)

    def back(self, actor: int, at: float | None = None) -> None:
        """A restarted actor is working again (at ``at``, time.monotonic; now by default): its down time is lost."""
        if actor in self.down:
            self.lost_seconds += (time.monotonic() if at is None else at) - self.down.pop(actor)

    def pending_lost_seconds(self) -> float:
        """Actor-seconds lost so far, those of actors still down included."""
        now = time.monotonic()
        return self.lost_seconds + sum(now - t for t in self.down.values())

    def figures(self) -> dict[str, Any]:
        """What the summary and a learner rank's report say of the actors' faults (see ``NO_FAULTS``)."""
        return {"actor_restarts": self.restarts, "actor_seconds_lost": self.pending_lost_seconds()}


#: ``FaultLedger.figures`` where there are no actors (yet)
NO_FAULTS: dict[str, Any] = {"actor_restarts": 0, "actor_seconds_lost": 0.0}


@runtime_checkable
class NodeFigures(Protocol):
    """Per-node figures the actors report (Ray): kept by rank 0 (``NodeStats``), sent on by other ranks
    (``NodeReports``: their ``scalars`` and ``summary`` are empty)."""

    def add(self, rep: dict) -> None: ...

    def scalars(self) -> dict[str, float]: ...

    def summary(self) -> dict[str, dict]: ...


@runtime_checkable
class RunSession(Protocol):
    """What a runner needs of its session: when to stop, each update's batch and figures, the roles' stage times,
    and the facts the runner learns (its actors, their nodes, queue depths, a runtime's own figures)."""

    cfg: Any
    timer: StageTimer
    gpu_timer: StageTimer
    model_lock: threading.Lock

    @property
    def warm(self) -> bool: ...

    def done(self) -> bool: ...

    def after_update(self, batch: dict[str, torch.Tensor], stats: dict[str, float]) -> None: ...

    def role_snapshot(self, role: str, snap: dict) -> None: ...

    def attach_actors(self, actors: ActorSet) -> None: ...

    def node_figures(self, make: Callable[[], NodeFigures]) -> NodeFigures: ...

    def watch_process(self, role: str, pid: int) -> None: ...

    def set_scalars(self, scalars: dict[str, float]) -> None: ...

    def add_batch_sizes(self, sizes: Iterable[int]) -> None: ...

    def note_info(self, key: str, value: Any) -> None: ...

    def attach_balancer(self, balancer: Any) -> None: ...


@runtime_checkable
class ActorSet(Protocol):
    """The actors of one learner. ``take_full`` blocks until ``nb`` unroll buffers are full (checking the actors'
    health meanwhile) and returns their indices, oldest first; ``give_back`` returns buffers the learner has copied
    out; ``poll`` checks health and reads what arrived; ``report`` passes the roles' figures to the session."""

    ledger: FaultLedger

    def take_full(self, nb: int) -> list[int]: ...

    def give_back(self, idx: list[int]) -> None: ...

    def poll(self) -> None: ...

    def report(self, session: RunSession, final: bool = False) -> None: ...

    def stop(self) -> None: ...


def take_inference_figures(session: RunSession, server: Any, final: bool = False) -> None:
    """The central inference role's figures since the last take, about once a second (and at the end), into
    ``session``: its stage times, its device busy time, its batch sizes. ``server``: the inference server, or the
    Ray feeder (anything with ``timer``, ``batch_sizes`` and, with a GPU, ``gpu_busy_s``)."""
    if not (final or server.timer.elapsed() > 1.0):
        return
    session.role_snapshot("inference", server.timer.snapshot(reset=True))
    if getattr(server, "gpu_busy_s", 0.0):
        session.gpu_timer.add("inference", server.gpu_busy_s)
        server.gpu_busy_s = 0.0
    sizes, server.batch_sizes = server.batch_sizes, []
    if sizes:
        session.set_scalars({"inference/batch_size": sum(sizes) / len(sizes)})
        session.add_batch_sizes(sizes)


class Buffers(Protocol):
    def gather(self, idx: list[int]) -> dict[str, torch.Tensor]: ...


class Learner(Protocol):
    steps: int
    updates: int

    def train(self, batch: dict[str, torch.Tensor]) -> dict[str, float]: ...


@runtime_checkable
class Drains(Protocol):
    """An actor set that can retire all its actors without losing an unroll (local actor processes)."""

    def drain(self, nb: int) -> Iterator[list[int]]: ...


class Balance(Protocol):
    def step(self, steps: int, waited_s: float) -> None: ...

    def restart_wanted(self) -> bool: ...


def learn(session: RunSession, learner: Learner, actors: ActorSet, buffers: Buffers, batch_buffers: int,
          publish: Callable[[], None] | None = None, balancer: Balance | None = None) -> None:
    """The learner loop of every runner: take a batch of full buffers, give them back once copied, train,
    publish the weights where actors hold their own copy, check the actors and report, until the session says
    stop; with run.balance=auto, the balancer measures each update and moves the layout between updates (a move
    that needs the actors built anew ends the loop once they are drained: every unroll they made is trained on).
    The actors are stopped, and their last figures reported, however the loop is left."""
    def train_on(idx: list[int]) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        batch = buffers.gather(idx)
        actors.give_back(idx)
        stats = learner.train(batch)
        if publish is not None:
            with session.timer.stage("weight_publish"):
                publish()
        return batch, stats

    try:
        while not session.done():
            if balancer is not None and balancer.restart_wanted():
                assert isinstance(actors, Drains), "run.balance moves envs per actor only where actors drain"
                for idx in actors.drain(batch_buffers):
                    session.after_update(*train_on(idx))
                return
            t0 = time.perf_counter()
            with session.timer.stage("wait_data"):
                idx = actors.take_full(batch_buffers)
            waited = time.perf_counter() - t0
            batch, stats = train_on(idx)
            actors.poll()
            actors.report(session)
            session.after_update(batch, stats)
            if balancer is not None:
                balancer.step(learner.steps, waited)
    finally:
        actors.stop()
        actors.report(session, final=True)
