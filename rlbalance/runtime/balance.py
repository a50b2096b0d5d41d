"""A run that balances itself (``run.balance=auto``): the learner loop measures the run in windows and moves its
layout (actor processes, learner threads, the inference server's wait) toward the best throughput on the machine
it is on, then holds it.

Each move is the one the online model (``rlbalance.telemetry.balance_model``, calibrated from the run's own windows)
predicts to be best among the layouts one move away, and is kept only if the windows measured after it beat the
windows before it by more than ``run.balance_min_gain`` and by more than twice their combined standard error (this
machine's throughput moves 20-30% between minutes; a gain inside the noise is not a gain). A move that measures
worse is undone and not tried again until the workload drifts (hysteresis: the run does not oscillate between two
layouts). Holding, it re-checks when throughput at the held layout drifts by more than ``DRIFT`` from what it held
at, or an actor fails: then what it measured is forgotten and it starts again from where it is.

Every move is kept in ``moves`` (when, from, to, why: the prediction and its evidence, and what was measured) for
metrics.jsonl, TensorBoard, summary.json and the report; ``found_config`` is the layout as a config file the next run
can start from.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any, Protocol

import psutil

from rlbalance.telemetry.balance_model import Layout, Prediction, Window, ceilings, neighbours, predict

DRIFT = 0.25  # a held layout's throughput moving this much from where it settled: the workload changed
PHASES = ("measure", "settle", "trial", "hold")


class Knobs(Protocol):
    """What a runner lets the balancer move, and what it tells it (the local actor pool's, Ray's actor set's)."""

    def layout(self) -> Layout: ...

    def apply(self, to: Layout) -> None:
        """Move to ``to`` (actors started or retired without losing an unroll, threads, the server's wait)."""

    def settled(self) -> bool:
        """Every actor of the layout is stepping and none is being retired."""

    def cpu_seconds(self) -> tuple[float, float]:
        """CPU seconds used so far by the actors and by the learner process (monotonic)."""

    def faults(self) -> int:
        """Actor faults so far (a fault invalidates what was measured)."""

    def restart_pending(self) -> bool:
        """A move that cannot be made live (the envs per actor) waits for the runner to restart the actors."""


def layout_scalars(lay: Layout, phase: str, moves: list[dict[str, Any]]) -> dict[str, float]:
    """A controller's layout, phase and moves made, as every metrics record has them (TensorBoard: balance/...)."""
    return {"balance/actors": float(lay.actors), "balance/learner_threads": float(lay.threads),
            "balance/envs_per_actor": float(lay.envs), "balance/inference_wait_ms": float(lay.wait_ms),
            "balance/phase": float(PHASES.index(phase)),
            "balance/moves": float(sum(1 for m in moves if m.get("event") == "move"))}


def measured_gain(first: float | None, last: float | None, moved: bool) -> float | None:
    """The final layout's measured throughput over the start's, less one (0 where it kept none; None unmeasured)."""
    return (last / first - 1) if first and last and moved else (0.0 if first else None)


class ProcessCpu:
    """CPU seconds used by a set of processes, each counted until it ends (its last reading kept), so a window's
    figure never goes backwards when an actor is retired or restarted."""

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process] = {}
        self._last: dict[int, float] = {}

    def add(self, pid: int) -> None:
        try:
            self._procs[pid] = psutil.Process(pid)
            self._last.setdefault(pid, 0.0)
        except psutil.NoSuchProcess:
            pass

    def seconds(self) -> float:
        for pid, p in list(self._procs.items()):
            try:
                t = p.cpu_times()
                self._last[pid] = t.user + t.system
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                del self._procs[pid]  # ended: its last reading stays in the sum
        return sum(self._last.values())


class Balancer:
    """The controller (see the module's note). ``step`` is called by the learner loop after every update."""

    def __init__(self, knobs: Knobs, cores: int, window_s: float, windows: int = 3, min_gain: float = 0.05,
                 max_actors: int = 8, max_threads: int = 2, knob_names: tuple[str, ...] = ("actors", "threads", "wait"),
                 clock: Callable[[], float] = time.monotonic, envs: tuple[int, ...] = ()):
        self.knobs, self.cores, self.window_s, self.windows = knobs, cores, window_s, max(2, windows)
        self.min_gain, self.max_actors, self.max_threads, self.knob_names = min_gain, max_actors, max_threads, knob_names
        self.clock, self.envs = clock, envs
        self.t0 = clock()
        self.start = knobs.layout()
        self.phase = "settle"  # the first windows are actor start-up, not steady state
        self.next_phase = "measure"
        self.base: list[float] = []  # windows at the layout held (or tried from)
        self.trial: list[float] = []  # windows at the layout tried
        self.move: dict[str, Any] | None = None  # the move being tried
        self.moves: list[dict[str, Any]] = []
        self.measured: dict[Layout, float] = {}  # layout -> its mean steps/s, as last measured
        self.learner_ceiling: dict[int, float] = {}  # learner threads -> the learner's ceiling measured there
        self.tabu: set[Layout] = set()  # layouts that measured worse: not tried again until the workload drifts
        self.held_at: float | None = None
        self.last_window: Window | None = None
        self.prediction: Prediction | None = None
        self._faults = knobs.faults()
        self._open(clock())

    # ------------------------------------------------------------------ inputs
    def feed(self, role: str, snap: dict) -> None:
        """An actor's stage times (as reported to the session): how long the actors waited for a free buffer."""
        if role == "actor":
            self._actor_wall += snap["wall_s"]
            self._actor_wait += snap["seconds"].get("wait_buffer", 0.0)
            self._actor_env += snap["seconds"].get("env_step", 0.0)

    def _open(self, now: float) -> None:
        self._w_t, self._w_wait = now, 0.0
        self._w_steps: int | None = None
        self._w_cpu = self.knobs.cpu_seconds()
        self._actor_wall = self._actor_wait = self._actor_env = 0.0

    def step(self, steps: int, waited_s: float) -> None:
        """After an update: ``steps`` trained so far, ``waited_s`` the learner spent waiting for this batch."""
        now = self.clock()
        if self._w_steps is None:
            self._w_steps = steps
            self._w_t = now
            self._w_cpu = self.knobs.cpu_seconds()
            return
        self._w_wait += waited_s
        if now - self._w_t < self.window_s:
            return
        cpu = self.knobs.cpu_seconds()
        dt = now - self._w_t
        w = Window(sps=(steps - self._w_steps) / dt, layout=self.knobs.layout(), cores=self.cores,
                   actor_cpu=(cpu[0] - self._w_cpu[0]) / dt, learner_cpu=(cpu[1] - self._w_cpu[1]) / dt,
                   learner_wait=min(1.0, self._w_wait / dt),
                   actor_wait=self._actor_wait / self._actor_wall if self._actor_wall > 0 else 0.0,
                   actor_env=(min(1.0, self._actor_env / (self._actor_wall - self._actor_wait))
                              if self._actor_wall - self._actor_wait > 0 else 1.0))
        settled = self.knobs.settled()
        self._open(now)
        self._w_steps = steps
        self._window(w, settled, steps)

    # ------------------------------------------------------------------ the controller
    def _window(self, w: Window, settled: bool, steps: int) -> None:
        faults = self.knobs.faults()
        if faults != self._faults:  # an actor failed: what was measured no longer holds
            self._faults = faults
            self._forget("an actor failed")
            return
        if self.phase == "settle":
            if settled:
                self.phase = self.next_phase
            return
        if not settled:
            return
        self.last_window = w
        self.learner_ceiling[w.layout.threads] = ceilings(w)["learner"]
        if self.phase == "measure":
            self.base.append(w.sps)
            if len(self.base) >= self.windows:
                self.measured[w.layout] = statistics.fmean(self.base)
                self._propose(w, steps)
        elif self.phase == "trial":
            self.trial.append(w.sps)
            if len(self.trial) >= self.windows:
                self._judge(w, steps)
        elif self.phase == "hold":
            self.base = (self.base + [w.sps])[-self.windows:]
            recent = statistics.fmean(self.base)
            if self.held_at and len(self.base) >= self.windows and abs(recent / self.held_at - 1) > DRIFT:
                self._forget(f"throughput at the held layout moved {recent / self.held_at - 1:+.0%}")

    def _forget(self, why: str) -> None:
        self.moves.append({"t": round(self.clock() - self.t0, 1), "event": "recheck", "why": why,
                           "at": self.knobs.layout().to_dict()})
        if self.move is not None:  # a fault or drift mid-trial: back to where the trial started
            self.knobs.apply(Layout(**self.move["from"]))
            self.move = None
        self.measured.clear()
        self.learner_ceiling.clear()
        self.tabu.clear()
        self.base, self.trial, self.held_at = [], [], None
        self.phase, self.next_phase = "settle", "measure"

    def _propose(self, w: Window, steps: int) -> None:
        at = w.layout
        base = statistics.fmean(self.base)
        options = [(predict(w, lay, self.measured, self.learner_ceiling), lay)
                   for lay in neighbours(at, self.max_actors, self.max_threads, self.knob_names, self.envs)
                   if lay not in self.tabu]
        options.sort(key=lambda pl: (-pl[0].sps, pl[1]))
        if not options or options[0][0].sps < base * (1 + self.min_gain):
            self.phase, self.held_at = "hold", base
            self.prediction = options[0][0] if options else None
            if not self.moves or self.moves[-1].get("event") != "hold":
                self.moves.append({"t": round(self.clock() - self.t0, 1), "steps": steps, "event": "hold",
                                   "at": at.to_dict(), "sps": base,
                                   "why": ("no layout one move away is predicted to gain "
                                           f"{self.min_gain:.0%}" + (f" (best: {options[0][1].describe()}, "
                                                                       f"{options[0][0].sps:,.0f} steps/s)"
                                                                       if options else ""))})
            return
        pred, to = options[0]
        self.prediction = pred
        self.move = {"t": round(self.clock() - self.t0, 1), "steps": steps, "event": "move", "from": at.to_dict(),
                     "to": to.to_dict(), "moved": to.differs(at), "predicted_sps": pred.sps, "bound": pred.bound,
                     "why": pred.evidence, "base_sps": base, "base_windows": list(self.base)}
        self.knobs.apply(to)
        self.trial = []
        self.phase, self.next_phase = "settle", "trial"

    def _judge(self, w: Window, steps: int) -> None:
        assert self.move is not None
        base, trial = self.move["base_windows"], self.trial
        mb, mt = statistics.fmean(base), statistics.fmean(trial)
        se = math.sqrt(statistics.variance(base) / len(base) + statistics.variance(trial) / len(trial))
        margin = max(self.min_gain, 2 * se / mb)
        gain = mt / mb - 1
        to, frm = Layout(**self.move["to"]), Layout(**self.move["from"])
        self.measured[to] = mt
        kept = gain > margin
        self.move.update(measured_sps=mt, trial_windows=list(trial), gain=gain, margin=margin,
                         outcome="kept" if kept else "undone", judged_t=round(self.clock() - self.t0, 1))
        self.moves.append(self.move)
        self.move = None
        if kept:
            self.base = list(trial)
            self._propose(w, steps)
        else:
            self.tabu.add(to)
            self.knobs.apply(frm)
            self.base = []
            self.phase, self.next_phase = "settle", "measure"

    def restart_wanted(self) -> bool:
        """The move just made needs the actors restarted (the runner drains them, then builds them anew)."""
        return self.knobs.restart_pending()

    # ------------------------------------------------------------------ outputs
    def scalars(self) -> dict[str, float]:
        """The layout and the controller's phase, for every metrics record (TensorBoard: balance/...)."""
        out = layout_scalars(self.knobs.layout(), self.phase, self.moves)
        if self.prediction is not None:
            out["balance/predicted_sps"] = self.prediction.sps
        return out

    def summary(self, sps_start: float | None = None) -> dict[str, Any]:
        """summary.json's ``balance``: the start and final layouts, every move, and the measured gain (the final
        layout's measured throughput over the start's, both as measured in this run's windows; 0 where it kept no
        move)."""
        final = self.knobs.layout()
        first = self.measured_at(self.start)
        last = self.measured.get(final) or self.measured_at(final)
        return {"start": self.start.to_dict(), "final": final.to_dict(), "phase": self.phase,
                "moves": self.moves, "start_sps": first, "final_sps": last,
                "gain": measured_gain(first, last, final != self.start), "window_s": self.window_s,
                "windows_per_measure": self.windows, "min_gain": self.min_gain}

    def measured_at(self, lay: Layout) -> float | None:
        for m in self.moves:  # the first measurement of the start layout is in the first move's base
            if m.get("event") == "move" and Layout(**m["from"]) == lay:
                return m["base_sps"]
            if m.get("event") == "hold" and Layout(**m["at"]) == lay:
                return m["sps"]
        return self.measured.get(lay)
