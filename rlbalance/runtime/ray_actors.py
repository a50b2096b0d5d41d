"""The Ray actors of one learner as a set that can grow and shrink (``RayActorSet``), and what a self-balancing run
moves on them (``RayKnobs``, a ``balance.Knobs``): the number of Ray actors (started where Ray schedules them, on
nodes with free CPUs; retired once their env groups' unrolls are in), the learner process's torch threads (the
learner loop's and the feeder's) and, with central inference, the feeder's wait for a fuller batch. The envs per
actor stay as configured on Ray (a move of them would restart every remote actor)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import psutil
import torch

from rlbalance.config import Config
from rlbalance.runtime.ray_workers import worker_class
from rlbalance.runtime.roles import FaultLedger
from rlbalance.telemetry.balance_model import Layout


class RayActorSet:
    """The Ray actors and their health (restarts and lost seconds in a ``FaultLedger``). ``cfg.actors.num_actors`` is
    its capacity; ``active`` of them run (all by default), and ``resize`` starts or retires actors while the run goes
    on (a run that balances itself): a retired actor's env groups finish the unroll they began, then the feeder
    ends the actor (``retire``)."""

    def __init__(self, ray, cfg: Config, active: int | None = None):
        self.ray, self.cfg = ray, cfg
        cls = worker_class(ray, cfg)
        strategy = "SPREAD" if cfg.ray.placement == "spread" else "DEFAULT"
        cfg_dict = cfg.to_dict()
        from rlbalance.config.user_modules import user_module_dirs

        dirs = user_module_dirs(cfg.env)
        agent_module = cfg.learner.agent.partition(":")[0] if ":" in cfg.learner.agent else None
        if agent_module:  # an agent named 'module:Agent' is imported in every worker, as env modules are
            dirs += [d for d in user_module_dirs(SimpleNamespace(id="", imports=(agent_module,))) if d not in dirs]
        self._spawn = lambda i: cls.options(scheduling_strategy=strategy, name=None).remote(i, cfg_dict, dirs)
        self.capacity = cfg.actors.num_actors
        self.active = min(active or self.capacity, self.capacity)
        self.handles: list = [self._spawn(i) if i < self.active else None for i in range(self.capacity)]
        self.ledger = FaultLedger(cfg.actors.max_restarts, what="Ray actor")
        self.down = self.ledger.down  # actor -> its last good reply before it failed
        self.last_ok = [time.monotonic()] * len(self.handles)
        self.replied = [False] * len(self.handles)  # since its (re)start: until then it is starting, not hung
        self.delivered = [0] * len(self.handles)  # unrolls each actor delivered since it was started
        self.retiring: set[int] = set()  # actors to end once their groups' unrolls are in
        self._lock = threading.Lock()  # (resize runs on the learner thread, retire on the feeder's)
        self.placement: dict[int, dict] = {}

    def running(self, actor: int) -> bool:
        """The actor is started and not being retired: its groups take new buffers and calls."""
        return self.handles[actor] is not None and actor not in self.retiring

    def resize(self, n: int) -> None:
        """Run ``n`` actors (1 to the capacity): start the missing ones, mark the ones past ``n`` for retiring."""
        n = max(1, min(n, self.capacity))
        with self._lock:
            for i in range(self.capacity):
                if i < n:
                    self.retiring.discard(i)
                    if self.handles[i] is None:
                        self.last_ok[i], self.replied[i], self.delivered[i] = time.monotonic(), False, 0
                        self.handles[i] = self._spawn(i)
                elif self.handles[i] is not None:
                    self.retiring.add(i)
            self.active = n

    def retire(self, actor: int) -> None:
        """End a retiring actor whose groups are idle (called by the feeder)."""
        with self._lock:
            if actor not in self.retiring:  # (started again meanwhile)
                return
            self.retiring.discard(actor)
            handle, self.handles[actor] = self.handles[actor], None
        self.ledger.back(actor)  # (one that failed while retiring: its lost time ends here)
        try:
            self.ray.kill(handle, no_restart=True)
        except Exception:
            pass

    def failed(self, actor: int, reason: str) -> None:
        if actor in self.down:
            return
        self.replied[actor] = False
        self.ledger.fault(actor, reason, last_alive=self.last_ok[actor])

    def ok(self, actor: int) -> None:
        now = time.monotonic()
        self.ledger.back(actor, at=now)
        self.last_ok[actor] = now
        self.replied[actor] = True

    def kill(self, actor: int) -> None:
        """A hung actor: Ray kills the process and restarts it."""
        if self.handles[actor] is not None:
            self.ray.kill(self.handles[actor], no_restart=False)

    def stop(self) -> None:
        for h in self.handles:
            if h is None:
                continue
            try:
                self.ray.kill(h, no_restart=True)
            except Exception:
                pass


class RayKnobs:
    """What a self-balancing run moves on Ray actors (``balance.Knobs``): ``actors``, the run's ``RayActorSet``;
    ``feeder``, its ``RayFeeder`` (the actors' CPU reports and, with central inference, the batching)."""

    def __init__(self, actors: Any, feeder: Any, threads: int, wait_ms: float):
        self.actors, self.feeder = actors, feeder
        self.threads, self.wait_ms = threads, wait_ms
        self.me = psutil.Process()

    def layout(self) -> Layout:
        return Layout(self.actors.active, self.threads, self.wait_ms, 0)

    def apply(self, to: Layout) -> None:
        if to.actors != self.actors.active:
            self.actors.resize(to.actors)
        if to.threads != self.threads:
            torch.set_num_threads(to.threads)  # (called from the learner loop: the learner thread's own)
        self.threads, self.wait_ms = to.threads, to.wait_ms
        self.feeder.set_layout(max_wait_ms=to.wait_ms, torch_threads=to.threads)

    def settled(self) -> bool:
        """Every running actor delivered an unroll since it started, and none is still being retired."""
        a = self.actors
        return not a.retiring and all(a.delivered[i] > 0 for i in range(a.capacity) if a.handles[i] is not None)

    def cpu_seconds(self) -> tuple[float, float]:
        t = self.me.cpu_times()
        return self.feeder.actor_cpu_s, t.user + t.system

    def faults(self) -> int:
        return self.actors.ledger.restarts

    def restart_pending(self) -> bool:
        return False


def cluster_cpus(ray) -> int:
    """The CPUs Ray schedules actors on, over every node (at least one)."""
    try:
        return max(1, int(ray.cluster_resources().get("CPU", 1)))
    except Exception:
        return 1
