"""GA3C's way of balancing a run, as a baseline to measure ours against (``run.balance=ga3c``).

GA3C (Babaeizadeh et al. 2017, its ThreadDynamicAdjustment) is the one anchor that changes its worker counts while it
trains: every 20 s it moves one count by one step at random and moves back if the throughput measured over the
period after the move is below the period before it. Here the counts are the knobs our controller moves (actors,
learner threads, the envs per actor as a step along its choices, the inference wait 0/1 ms), through the same
``Knobs``; it has no model, no settling and no noise margin, which is what the comparison is about. Its moves,
summary and metrics have the same form as ``balance.Balancer``'s, so the report, summary.json and balanced.json
read them alike.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from rlbalance.runtime.balance import Balancer, Knobs, layout_scalars, measured_gain
from rlbalance.telemetry.balance_model import Layout


class GA3CBalancer:
    def __init__(self, knobs: Knobs, period_s: float = 20.0, max_actors: int = 8, max_threads: int = 2,
                 envs: tuple[int, ...] = (), knob_names: tuple[str, ...] = ("actors", "threads", "wait"),
                 seed: int = 0, clock: Callable[[], float] = time.monotonic):
        self.knobs, self.period_s, self.max_actors, self.max_threads = knobs, period_s, max_actors, max_threads
        self.envs, self.knob_names, self.clock = tuple(sorted(envs)), knob_names, clock
        self.rng = random.Random(seed)
        self.t0 = clock()
        self.start = knobs.layout()
        self.phase = "measure"
        self.moves: list[dict[str, Any]] = []
        self.measured: dict[Layout, float] = {}
        self.move: dict[str, Any] | None = None  # the move made at the last period's end, judged at this one's
        self._t: float | None = None
        self._steps = 0

    def feed(self, role: str, snap: dict) -> None:
        pass  # (it reads nothing but the throughput)

    def step(self, steps: int, waited_s: float) -> None:
        """After an update: ``steps`` trained so far."""
        now = self.clock()
        if self._t is None:
            self._t, self._steps = now, steps
            return
        if now - self._t < self.period_s:
            return
        sps = (steps - self._steps) / (now - self._t)
        self._t, self._steps = now, steps
        at = self.knobs.layout()
        self.measured[at] = sps
        if self.move is not None:
            mv, self.move = self.move, None
            kept = sps >= mv["base_sps"]
            mv.update(measured_sps=sps, gain=sps / mv["base_sps"] - 1 if mv["base_sps"] else 0.0, margin=0.0,
                      outcome="kept" if kept else "undone", judged_t=round(now - self.t0, 1),
                      trial_windows=[sps])
            self.moves.append(mv)
            if not kept:  # it fell: back, and measure there for a period before the next move
                self.knobs.apply(Layout(**mv["from"]))
                return
        to = self._random_step(at)
        if to is None:
            return
        self.move = {"t": round(now - self.t0, 1), "steps": steps, "event": "move", "from": at.to_dict(),
                     "to": to.to_dict(), "moved": to.differs(at), "predicted_sps": None, "bound": "random step",
                     "why": "GA3C: one count moved by one step at random", "base_sps": sps, "base_windows": [sps]}
        self.knobs.apply(to)

    def _random_step(self, at: Layout) -> Layout | None:
        """One knob, one step, at random (a step that would leave the allowed range is drawn again)."""
        for _ in range(32):
            knob, d = self.rng.choice(self.knob_names), self.rng.choice((-1, 1))
            to = at
            if knob == "actors" and 1 <= at.actors + d <= self.max_actors:
                to = Layout(at.actors + d, at.threads, at.wait_ms, at.envs)
            elif knob == "threads" and 1 <= at.threads + d <= self.max_threads:
                to = Layout(at.actors, at.threads + d, at.wait_ms, at.envs)
            elif knob == "wait":
                to = Layout(at.actors, at.threads, 1.0 if at.wait_ms == 0 else 0.0, at.envs)
            elif knob == "envs" and at.envs in self.envs:
                i = self.envs.index(at.envs) + d
                if 0 <= i < len(self.envs):
                    to = Layout(at.actors, at.threads, at.wait_ms, self.envs[i])
            if to != at:
                return to
        return None

    def restart_wanted(self) -> bool:
        return self.knobs.restart_pending()

    def scalars(self) -> dict[str, float]:
        return layout_scalars(self.knobs.layout(), self.phase, self.moves)

    def summary(self, sps_start: float | None = None) -> dict[str, Any]:
        final = self.knobs.layout()
        first = next((m["base_sps"] for m in self.moves if Layout(**m["from"]) == self.start),
                     self.measured.get(self.start))
        last = self.measured.get(final)
        return {"method": "ga3c", "start": self.start.to_dict(), "final": final.to_dict(), "phase": self.phase,
                "moves": self.moves, "start_sps": first, "final_sps": last,
                "gain": measured_gain(first, last, final != self.start), "window_s": self.period_s,
                "windows_per_measure": 1, "min_gain": 0.0}


def controller(cfg: Any, knobs: Knobs, cores: int, max_actors: int, max_threads: int,
               knob_names: tuple[str, ...], envs: tuple[int, ...] = ()) -> Any:
    """The controller ``cfg.run.balance`` names over ``knobs``: ours (``balance.Balancer``, 'auto') or GA3C's
    ('ga3c', seeded by run.seed)."""
    if cfg.run.balance == "ga3c":
        return GA3CBalancer(knobs, max_actors=max_actors, max_threads=max_threads, envs=envs, knob_names=knob_names,
                            seed=cfg.run.seed)
    return Balancer(knobs, cores, cfg.run.balance_window_s, min_gain=cfg.run.balance_min_gain, max_actors=max_actors,
                    max_threads=max_threads, envs=envs, knob_names=knob_names)
