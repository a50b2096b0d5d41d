"""The online throughput model a self-balancing run (``run.balance=auto``) moves its layout by.

It is calibrated from the run's own measured windows, with no separate calibration step: a window gives the
steps per second the learner consumed, the CPU the actor processes and the learner process used (cores, from
the operating system's counters for the run's own processes), the share of its time the learner waited for data
and the share the actors waited for a free buffer (held back by the learner). From those, at the layout measured:

- the actors' ceiling: each actor's rate were it never held back by the learner, ``sps / n / (1 - actor_wait)``,
  times the actors of the layout predicted;
- the learner's ceiling: ``sps / (1 - learner_wait)``, scaled by the learner threads where they change (a measured
  factor where the run has measured both thread counts, else a prior that assumes little: threads^0.3);
- the CPU's ceiling where actors and learner share the cores: the run's cores over the CPU-seconds a step costs
  (actors' and learner's); a layout that leaves the costs per step alone cannot pass it.

The prediction is the least of the three, and names it (the bound). A layout the run has already measured is
predicted by its measurement (the latest, its mean over the windows), not by the ceilings. The model is a
guide: every move it proposes is measured before it is kept (``rlbalance.runtime.balance``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

THREADS_PRIOR = 0.3  # learner speed ~ threads**0.3 until the run measures it: a cautious prior (measured, it is replaced)
LEAST_BUSY = 0.05  # a wait share above 95% is read as 95%: a ceiling from an almost idle role is not trusted further


@dataclass(frozen=True, order=True)
class Layout:
    """What a self-balancing run may move while it trains."""

    actors: int  # actor processes (actors.num_actors)
    threads: int  # learner.torch_threads: the learner process's (learner and inference server threads)
    wait_ms: float  # inference.max_wait_ms: how long the server waits for a fuller batch

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def differs(self, other: "Layout") -> list[str]:
        return [k for k, v in asdict(self).items() if asdict(other)[k] != v]

    def describe(self) -> str:
        return f"{self.actors} actors, {self.threads} learner threads, inference wait {self.wait_ms:g} ms"


@dataclass(frozen=True)
class Window:
    """What one measured window says (see the module's note)."""

    sps: float
    layout: Layout
    cores: int  # cores the run may use (its CPU affinity)
    actor_cpu: float  # cores the actor processes used, on average over the window
    learner_cpu: float  # cores the learner process used (learner and inference threads)
    learner_wait: float  # share of the learner's time spent waiting for data
    actor_wait: float  # share of the actors' time spent waiting for a free buffer


@dataclass(frozen=True)
class Prediction:
    sps: float
    bound: str  # 'actors', 'learner', 'cpu', or 'measured' (the layout's own measurement)
    evidence: str


def thread_factor(frm: int, to: int, measured: dict[int, float] | None = None) -> float:
    """How much faster the learner runs at ``to`` threads than at ``frm``: measured (``measured``: the learner's
    ceiling the run saw at each thread count) where both are known, else the prior."""
    if measured and frm in measured and to in measured and measured[frm] > 0:
        return measured[to] / measured[frm]
    return (to / frm) ** THREADS_PRIOR


def ceilings(w: Window) -> dict[str, float]:
    """The measured window's three ceilings (steps per second), at its own layout."""
    per_step_cpu = (w.actor_cpu + w.learner_cpu) / max(w.sps, 1e-9)
    return {"actors": w.sps / max(1.0 - w.actor_wait, LEAST_BUSY),
            "learner": w.sps / max(1.0 - w.learner_wait, LEAST_BUSY),
            "cpu": w.cores / max(per_step_cpu, 1e-12)}


def predict(w: Window, to: Layout, measured: dict[Layout, float] | None = None,
            learner_ceiling: dict[int, float] | None = None) -> Prediction:
    """The steps per second at layout ``to``, from window ``w`` (at another layout) and the layouts the run has
    measured (``measured``: layout -> its mean steps per second)."""
    if measured and to in measured:
        return Prediction(measured[to], "measured", f"measured at {to.describe()}: {measured[to]:,.0f} steps/s")
    c = ceilings(w)
    n0, n1 = w.layout.actors, to.actors
    actors = c["actors"] * n1 / n0
    learner = c["learner"] * thread_factor(w.layout.threads, to.threads, learner_ceiling)
    # more actor processes than cores: they take turns, and the CPU ceiling bounds them with everything else
    least = min((("actors", actors), ("learner", learner), ("cpu", c["cpu"])), key=lambda kv: kv[1])
    why = (f"actors {actors:,.0f} ({n1} x {c['actors'] / n0:,.0f}/actor, held back {w.actor_wait:.0%}), "
           f"learner {learner:,.0f} (waits {w.learner_wait:.0%} at {w.layout.threads} threads), "
           f"CPU {c['cpu']:,.0f} ({w.cores} cores, {(w.actor_cpu + w.learner_cpu) / max(w.sps, 1e-9) * 1e6:,.0f} "
           f"core-us/step)")
    return Prediction(least[1], least[0], why)


def neighbours(at: Layout, max_actors: int, max_threads: int, knobs: tuple[str, ...]) -> list[Layout]:
    """The layouts one move away: an actor more or fewer (twice or half as many too, from far off), a learner
    thread more or fewer, the inference wait off or on (1 ms)."""
    out: list[Layout] = []
    if "actors" in knobs:
        for n in {at.actors + 1, at.actors - 1, at.actors * 2, at.actors // 2}:
            if 1 <= n <= max_actors and n != at.actors:
                out.append(replace(at, actors=n))
    if "threads" in knobs:
        for h in (at.threads + 1, at.threads - 1):
            if 1 <= h <= max_threads:
                out.append(replace(at, threads=h))
    if "wait" in knobs:
        out.append(replace(at, wait_ms=0.0 if at.wait_ms else 1.0))
    return sorted(out)
