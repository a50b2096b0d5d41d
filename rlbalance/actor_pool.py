"""The actor processes and their health: start, heartbeats, restarts, shutdown.

An actor is restarted when its process has died (an env raised, it was SIGKILLed) or its heartbeat is
older than ``actors.heartbeat_timeout_s`` (it hangs; it is SIGKILLed first). Its half-filled buffers
go back to the free queue, its inference channels are replaced, and the seconds it was lost for are
counted. More than ``actors.max_restarts`` restarts stop training with an error.
"""

from __future__ import annotations

import os
import signal
import time

from .actor import ActorShared, actor_main
from .config import Config


START_TIMEOUT_S = 60.0  # a new actor process may take this long (imports, env creation) to step once


class ActorFailure(RuntimeError):
    """Actors failed more often than actors.max_restarts allows."""


class ActorPool:
    def __init__(self, ctx, cfg: Config, shared: ActorShared, on_start=None):
        self.ctx, self.cfg, self.sh = ctx, cfg, shared
        self.g = cfg.actors.env_groups
        self.central = cfg.inference.mode == "central"
        self.on_start = on_start  # called with (actor_id, pid) for each process started
        self.procs: list = [None] * cfg.actors.num_actors
        self.incarnation = [0] * cfg.actors.num_actors
        self.parent_conns: list = [None] * cfg.num_clients
        self.restarts = 0
        self.lost_seconds = 0.0
        self.events: list[dict] = []
        self._awaiting: dict[int, tuple[float, float]] = {}  # actor -> (restart time, last sign of life)
        self.server = None
        self.started = [0.0] * cfg.actors.num_actors  # when each actor's current process was started

    def start_all(self) -> None:
        for i in range(len(self.procs)):
            self._start(i)

    def _start(self, i: int) -> list:
        conns, child_ends = [], []
        if self.central:
            for _ in range(self.g):
                parent_end, child_end = self.ctx.Pipe(duplex=True)
                conns.append(parent_end)
                child_ends.append(child_end)
        self.started[i] = time.monotonic()
        self.sh.heartbeat[i] = self.started[i]
        p = self.ctx.Process(target=actor_main, name=f"rlbalance-actor-{i}", daemon=True,
                             args=(i, self.incarnation[i], self.cfg, self.sh, child_ends))
        p.start()
        for c in child_ends:
            c.close()
        self.procs[i] = p
        for j, c in enumerate(conns):
            old = self.parent_conns[i * self.g + j]
            self.parent_conns[i * self.g + j] = c
            if old is not None:
                old.close()
        if self.on_start:
            self.on_start(i, p.pid)
        return conns

    def check(self) -> None:
        """Restart dead or hung actors; account for the time they were lost."""
        now = time.monotonic()
        timeout = self.cfg.actors.heartbeat_timeout_s
        for i, p in enumerate(self.procs):
            beat = float(self.sh.heartbeat[i])
            if i in self._awaiting:
                t_restart, t_last = self._awaiting[i]
                if beat > t_restart:  # the new process stepped: it is back
                    self.lost_seconds += beat - t_last
                    del self._awaiting[i]
                elif p.is_alive() and now - t_restart < max(timeout, START_TIMEOUT_S):
                    continue
            dead = not p.is_alive()
            # a process that has not stepped yet is starting (imports, envs), not hung: it gets longer
            limit = timeout if beat > self.started[i] else max(timeout, START_TIMEOUT_S)
            hung = not dead and now - beat > limit and i not in self._awaiting
            if not (dead or hung):
                continue
            reason = f"exited with code {p.exitcode}" if dead else f"silent for {now - beat:.1f} s (hung)"
            if hung:
                os.kill(p.pid, signal.SIGKILL)
                p.join(timeout=5)
            if self.restarts >= self.cfg.actors.max_restarts:
                raise ActorFailure(f"actor {i} {reason}, and the {self.restarts} restarts allowed "
                                   f"(actors.max_restarts) are used up; see the actor's traceback above")
            self.restarts += 1
            self.events.append({"actor": i, "reason": reason, "at": time.strftime("%H:%M:%S")})
            self._reclaim(i)
            self.incarnation[i] += 1
            t_last = beat if i not in self._awaiting else self._awaiting[i][1]
            conns = self._start(i)
            if self.server is not None:
                self.server.replace_clients(list(range(i * self.g, (i + 1) * self.g)), conns)
            self._awaiting[i] = (time.monotonic(), t_last)

    def _reclaim(self, i: int) -> None:
        """The dead actor's half-filled buffers go back to the free queue."""
        owner = self.sh.owner
        for idx in (owner == i).nonzero().flatten().tolist():
            owner[idx] = -1
            self.sh.free_q.put(idx)

    def pending_lost_seconds(self) -> float:
        now = time.monotonic()
        return self.lost_seconds + sum(now - t_last for _, t_last in self._awaiting.values())

    def stop(self) -> None:
        self.sh.stop.set()
        if self.server is not None:
            self.server.stop()
            self.server.join(timeout=5)
        for c in self.parent_conns:
            if c is not None:
                c.close()
        for p in self.procs:
            if p is not None:
                p.join(timeout=5)
        for p in self.procs:
            if p is not None and p.is_alive():
                p.terminate()
                p.join(timeout=2)
