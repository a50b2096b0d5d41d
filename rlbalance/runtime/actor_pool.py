"""The actor processes and their health: start, heartbeats, restarts, shutdown.

An actor is restarted when its process has died (an env raised, it was SIGKILLed) or its heartbeat is
older than ``actors.heartbeat_timeout_s`` (it hangs; it is SIGKILLed first). Its half-filled buffers
go to its next process, its inference channels are replaced, and the seconds it was lost for are
counted. More than ``actors.max_restarts`` restarts stop training with an error.

Each actor owns a fixed share of the unroll buffers and talks to the learner over its own control pipe:
the pool sends it free buffer indices, it sends back full ones and its stage times. No lock or queue is
shared between processes, so an actor killed at any moment cannot stall the others.
"""

from __future__ import annotations

import os
import pickle
import signal
import time
from multiprocessing.connection import wait
from typing import Any

from rlbalance.config import Config
from rlbalance.runtime.actor import (
    FREE, FULL, RETIRE, START_FAILED, START_FAILED_EXIT, STATS, ActorShared, actor_main, encode_index,
)
from rlbalance.runtime.roles import ActorFailure, FaultLedger, RunSession, take_inference_figures

START_TIMEOUT_S = 60.0  # a new actor process may take this long (imports, env creation) to step once


class ActorStartFailure(ActorFailure):
    """An actor could not start (an import, an env constructor): a restart would fail the same way, so the run
    stops at the first, with the actor's traceback as its cause."""


class UnguardedMainError(ActorStartFailure):
    """rlbalance.train was called again in an actor process as it imported the user's script."""


class _ActorTraceback(Exception):
    """An actor's traceback, as text (the cause of an ActorStartFailure, printed with it)."""

    def __str__(self) -> str:
        return "\n" + self.args[0].rstrip()


UNGUARDED_MAIN_EXIT = 87  # an actor process's exit code when train() was called as it imported __main__


def refuse_train_in_spawned_child() -> None:
    """Called first by train(): a process that multiprocessing is still starting (it imports the parent's main
    script, as spawn does) and that reaches train() ran a script that calls it at import time. It exits at once,
    without a traceback; its parent names the cause (``UnguardedMainError``)."""
    import multiprocessing as mp

    if getattr(mp.current_process(), "_inheriting", False):
        os._exit(UNGUARDED_MAIN_EXIT)


def unguarded_main_error(process: str) -> UnguardedMainError:
    """The error for a spawned ``process`` that exited with UNGUARDED_MAIN_EXIT."""
    import __main__

    script = getattr(__main__, "__file__", None) or "your script"
    return UnguardedMainError(
        f"rlbalance.train() was called again in {process} as it imported {script}: put the call under "
        "`if __name__ == \"__main__\":` (rlbalance's processes are spawned, and each imports the main script first)")


def _start_failure(i: int, exitcode: int | None, text: str | None) -> ActorStartFailure | None:
    if exitcode == UNGUARDED_MAIN_EXIT:
        return unguarded_main_error(f"actor process {i}")
    if exitcode == START_FAILED_EXIT and text:
        last = text.rstrip().splitlines()[-1]
        err = ActorStartFailure(f"actor {i} could not start: {last} (its traceback above); restarting it would fail "
                                "the same way")
        err.__cause__ = _ActorTraceback(text)
        return err
    return None


class ActorPool:
    """Local actor processes over shared memory: an ``ActorSet`` (rlbalance/runtime/roles.py) that can grow and
    shrink while the run goes on (``resize``: a run that balances itself).

    ``cfg.actors.num_actors`` is the pool's capacity (the shared memory, step slots and heartbeats are allocated for
    it); ``active`` actors run (all of them by default). Buffers belong to no actor for good: a free buffer goes to
    the running actor holding the fewest, up to each actor's share at the number running (``quota``)."""

    def __init__(self, ctx, cfg: Config, shared: ActorShared, on_start=None, active: int | None = None,
                 ledger: FaultLedger | None = None):
        """``ledger``: the fault ledger of the pool this one replaces (actors built anew at other envs per actor), so
        restarts and lost actor-seconds count over the whole run, within one actors.max_restarts."""
        self.ctx, self.cfg, self.sh = ctx, cfg, shared
        self.g = cfg.actors.env_groups
        self.central = cfg.inference.mode == "central"
        self.on_start = on_start  # called with (actor_id, pid) for each process started
        self.capacity = cfg.actors.num_actors
        self.active = min(active or self.capacity, self.capacity)
        self.procs: list = [None] * self.capacity
        self.incarnation = [0] * self.capacity
        self.parent_conns: list = [None] * cfg.num_clients
        self.ledger = ledger if ledger is not None else FaultLedger(cfg.actors.max_restarts)
        for actor in list(self.ledger.down):  # (an actor of the last pool still down: its time lost ends here)
            self.ledger.back(actor)
        self._awaiting: dict[int, float] = {}  # restarted actor -> when, until its new process steps
        self.server: Any = None  # the central inference server (inference.InferenceServer): its health is the pool's
        self._last_check = time.monotonic()
        self.started = [0.0] * self.capacity  # when each actor's current process was started
        self.delivered = [0] * self.capacity  # unrolls each actor's current process has sent
        self.ctl: list = [None] * self.capacity  # the learner's end of each actor's control pipe
        self.full: list[int] = []  # full buffers, oldest first, not yet taken by the learner
        self.holder: dict[int, int] = {}  # buffer -> the actor it was sent to, until it comes back full
        self.spare: list[int] = list(range(cfg.num_buffers))  # free buffers at no actor
        self.retiring: set[int] = set()  # actors told to finish their unrolls and exit
        self.stats: list[tuple] = []
        self._eof: set[int] = set()  # actors whose control pipe closed (dead), until restarted
        self.start_errors: dict[int, str] = {}  # actor -> the traceback it could not start with

    def quota(self) -> int:
        """Buffers each running actor may hold: what a run of ``active`` actors would own (actors.buffers_per_actor,
        or enough for two learner batches plus one per group)."""
        a, bpa = self.cfg.actors, self.cfg.actors.buffers_per_actor
        if bpa:
            return a.env_groups * bpa
        return a.env_groups + -(-2 * self.cfg.buffers_per_batch // max(1, self.running()))

    def running(self) -> int:
        """Actors running and not retiring."""
        return sum(1 for i, p in enumerate(self.procs) if p is not None and i not in self.retiring)

    def start_all(self) -> None:
        for i in range(self.active):
            self._start(i, distribute=False)
        self._distribute()  # (once all run: an even share each)

    def _start(self, i: int, distribute: bool = True) -> list:
        conns, child_ends = [], []
        if self.central:
            for _ in range(self.g):
                parent_end, child_end = self.ctx.Pipe(duplex=True)
                conns.append(parent_end)
                child_ends.append(child_end)
        ctl, ctl_child = self.ctx.Pipe(duplex=True)
        self.started[i] = time.monotonic()
        self.sh.heartbeat[i] = self.started[i]
        p = self.ctx.Process(target=actor_main, name=f"rlbalance-actor-{i}", daemon=True,
                             args=(i, self.incarnation[i], self.cfg, self.sh, child_ends, ctl_child))
        p.start()
        for c in (*child_ends, ctl_child):
            c.close()  # only the child holds its ends: its death closes them (EOF here, never a stall)
        self.procs[i] = p
        self.ctl[i] = ctl
        self.delivered[i] = 0
        self._eof.discard(i)
        if distribute:
            self._distribute()
        for j, c in enumerate(conns):
            old = self.parent_conns[i * self.g + j]
            self.parent_conns[i * self.g + j] = c
            if old is not None:
                old.close()
        if self.on_start:
            self.on_start(i, p.pid)
        return conns

    def resize(self, n: int) -> None:
        """Run ``n`` actors (1..capacity): new ones are started in free slots; the last running ones are retired:
        each finishes the unrolls it has begun, sends them, and exits (no unroll is lost), and the buffers it was
        sent and did not begin go to the others."""
        n = max(1, min(n, self.capacity))
        run = [i for i, p in enumerate(self.procs) if p is not None and i not in self.retiring]
        for i in reversed(run[n:]):
            self._retire(i)
        free = [i for i, p in enumerate(self.procs) if p is None]
        for i in free[:max(0, n - len(run))]:
            if self.started[i]:  # a slot run before: a new incarnation (its seeds and unroll numbers differ)
                self.incarnation[i] += 1
            conns = self._start(i, distribute=False)
            if self.server is not None:
                self.server.replace_clients(list(range(i * self.g, (i + 1) * self.g)), conns)
        self.active = n
        self._distribute()

    def drain(self, nb: int):
        """Retire every actor (each finishes the unrolls it has begun) and yield the full buffers in batches of
        ``nb``, the last batch smaller where they do not make a whole one: no unroll is lost when the actors are
        built anew (a run that balances itself, moving the envs per actor). The caller gives each batch back."""
        for i, p in enumerate(self.procs):
            if p is not None and i not in self.retiring:
                self._retire(i)
        self.active = 0
        while any(p is not None for p in self.procs):
            self.receive(0.2)
            self.health()
            while len(self.full) >= nb:
                idx, self.full = self.full[:nb], self.full[nb:]
                yield idx
        if self.full:
            idx, self.full = self.full, []
            yield idx

    def _retire(self, i: int) -> None:
        """Tell actor ``i`` to finish the unrolls it has begun and exit; it gets no more buffers."""
        self.retiring.add(i)
        try:
            self.ctl[i].send_bytes(RETIRE)
        except (BrokenPipeError, ConnectionResetError, OSError, AttributeError):
            pass  # already dead (or its pipe closed): check() reclaims it

    def settled(self) -> bool:
        """No actor is being retired and every running actor has sent an unroll since it started."""
        return not self.retiring and not self._awaiting and all(
            self.delivered[i] > 0 for i, p in enumerate(self.procs) if p is not None)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p is not None]

    def check(self) -> None:
        """Restart dead or hung actors; account for the time they were lost."""
        now = time.monotonic()
        timeout = self.cfg.actors.heartbeat_timeout_s
        for i, p in enumerate(self.procs):
            if p is None:
                continue
            beat = float(self.sh.heartbeat[i])
            if i in self.retiring:
                self._check_retiring(i, p, now - beat > timeout)
                continue
            if i in self._awaiting:
                t_restart = self._awaiting[i]
                if beat > t_restart:  # the new process stepped: it is back
                    self.ledger.back(i, at=beat)
                    del self._awaiting[i]
                elif p.is_alive() and now - t_restart < max(timeout, START_TIMEOUT_S):
                    continue
                # else the new process died too, or never stepped in its start-up time: restart it again
            dead = not p.is_alive()
            # a process that has not stepped yet is starting (imports, envs), not hung: it gets longer
            limit = timeout if beat > self.started[i] else max(timeout, START_TIMEOUT_S)
            hung = not dead and now - beat > limit
            if not (dead or hung):
                continue
            if dead and self.ctl[i] is not None:
                self._read(i, self.ctl[i])  # (a start failure's traceback)
            failure = _start_failure(i, p.exitcode, self.start_errors.get(i)) if dead else None
            if failure is not None:
                raise failure
            reason = f"exited with code {p.exitcode}" if dead else f"silent for {now - beat:.1f} s (hung)"
            if hung:
                os.kill(p.pid, signal.SIGKILL)
                p.join(timeout=5)
            self.ledger.fault(i, reason, last_alive=beat, hint="; see the actor's traceback above")
            self._reclaim(i)
            self.incarnation[i] += 1
            conns = self._start(i)
            if self.server is not None:
                self.server.replace_clients(list(range(i * self.g, (i + 1) * self.g)), conns)
            self._awaiting[i] = time.monotonic()

    def _check_retiring(self, i: int, p, hung: bool) -> None:
        """A retiring actor that has exited (or hangs: killed) leaves its slot; what it sent is read first."""
        if hung and p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
            p.join(timeout=5)
        if p.is_alive():
            return
        p.join(timeout=1)
        self._reclaim(i)
        self.procs[i] = None
        self.retiring.discard(i)
        if self.server is not None:
            self.server.remove_clients(list(range(i * self.g, (i + 1) * self.g)))
        for j in range(i * self.g, (i + 1) * self.g):
            c, self.parent_conns[j] = self.parent_conns[j], None
            if c is not None:
                c.close()
        self._distribute()

    def _reclaim(self, i: int) -> None:
        """Whatever the dead actor sent before it died is read; the buffers it held go to the others (its next
        process among them): an unroll it had begun is begun again."""
        conn, self.ctl[i] = self.ctl[i], None
        if conn is not None:
            self._read(i, conn)
            conn.close()
        held = sorted(idx for idx, a in self.holder.items() if a == i)
        for idx in held:
            del self.holder[idx]
        self.spare.extend(held)

    def _send_free(self, idx: list[int]) -> None:
        self.spare.extend(idx)
        self._distribute()

    def _distribute(self) -> None:
        """Spare buffers to the running actors holding fewer than their quota, the fewest first."""
        if not self.spare:
            return
        quota = self.quota()
        held = {i: 0 for i, c in enumerate(self.ctl)
                if c is not None and i not in self.retiring and i not in self._eof}
        for a in self.holder.values():
            if a in held:
                held[a] += 1
        while self.spare and held:
            i = min(held, key=lambda a: (held[a], a))
            if held[i] >= quota:
                break
            j = self.spare.pop(0)
            try:
                self.ctl[i].send_bytes(encode_index(FREE, j))
                self.holder[j] = i
                held[i] += 1
            except (BrokenPipeError, ConnectionResetError, OSError):
                self.spare.insert(0, j)  # the actor is dead: check() restarts it
                del held[i]

    def _read(self, i: int, conn) -> None:
        """Every message waiting on actor i's control pipe."""
        try:
            while conn.poll(0):
                msg = conn.recv_bytes()
                kind = msg[:1]
                if kind == FULL:
                    j = int.from_bytes(msg[1:5], "little")
                    if self.holder.get(j) == i:
                        del self.holder[j]
                        self.full.append(j)
                        self.delivered[i] += 1
                elif kind == STATS:
                    self.stats.append(pickle.loads(msg[1:]))
                elif kind == START_FAILED:
                    self.start_errors[i] = msg[1:].decode(errors="replace")
        except (EOFError, OSError):
            self._eof.add(i)  # the actor died; check() restarts it

    def receive(self, timeout: float) -> None:
        """Read the control pipes, waiting up to ``timeout`` seconds for the first message."""
        live = {id(c): (i, c) for i, c in enumerate(self.ctl) if c is not None and i not in self._eof}
        if not live:
            time.sleep(timeout)
            return
        for c in wait([c for _, c in live.values()], timeout=timeout):
            self._read(*live[id(c)])

    def serve(self, server: Any) -> None:
        """The central inference server of these actors: its error stops the run, a restarted actor's channels go to
        it, and it stops with them."""
        self.server = server

    def health(self) -> None:
        """The inference server's error, if it failed; dead or hung actors restarted."""
        if self.server is not None and self.server.error is not None:
            raise self.server.error
        self.check()

    def take_full(self, nb: int) -> list[int]:
        """The ``nb`` oldest full buffers; the health check runs every half second without enough of them."""
        last = since = time.monotonic()
        have, restarts = len(self.full), self.ledger.restarts
        # No actor fault can block the others now, but the learner still ends any stall it cannot explain.
        limit = 2 * max(self.cfg.actors.heartbeat_timeout_s, START_TIMEOUT_S)
        while len(self.full) < nb:
            self.receive(0.5)
            now = time.monotonic()
            if len(self.full) > have:
                have, since, restarts = len(self.full), now, self.ledger.restarts
            elif now - since > limit:
                why = (f"while actors were restarted {self.ledger.restarts - restarts} times (they fail faster "
                       "than they make an unroll)" if self.ledger.restarts > restarts else
                       "while every actor looked alive")
                raise ActorFailure(f"no unroll arrived for {now - since:.0f} s {why} ({len(self.full)} of {nb} "
                                   "buffers for the next batch); stopping rather than waiting forever")
            if now - last >= 0.5:
                self.health()
                last = time.monotonic()
        idx, self.full = self.full[:nb], self.full[nb:]
        return idx

    def give_back(self, idx: list[int]) -> None:
        """Buffers the learner has copied out go back to the actors that own them."""
        self._send_free(idx)

    def poll(self) -> None:
        """After an update: the health check about once a second, and whatever the actors sent meanwhile."""
        if time.monotonic() - self._last_check > 1.0:
            self.health()
            self._last_check = time.monotonic()
        self.receive(0)

    def take_stats(self) -> list[tuple]:
        out, self.stats = self.stats, []
        return out

    def report(self, session: RunSession, final: bool = False) -> None:
        """The actors' stage times, the inference server's figures and the buffer queues, into ``session``."""
        for role, _i, snap in self.take_stats():
            session.role_snapshot(role, snap)
        if self.server is not None:
            take_inference_figures(session, self.server, final)
        session.set_scalars({"queue/full": float(len(self.full)), "queue/at_actors": float(len(self.holder))})

    def stop(self) -> None:
        self.sh.stop[0] = 1
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
            if p is not None and p.is_alive():  # a stopped (SIGSTOP) or wedged actor ignores SIGTERM
                p.kill()
                p.join(timeout=2)
        for i, c in enumerate(self.ctl):
            if c is not None:
                self._read(i, c)  # the actors' last stage times
                c.close()
                self.ctl[i] = None
