"""The online throughput model a self-balancing run (``run.balance=auto``) moves its layout by.

It is calibrated from the run's own measured windows, with no separate calibration step: a window gives the
steps per second the learner consumed, the CPU the actor processes and the learner process used (cores, from
the operating system's counters for the run's own processes), the share of its time the learner waited for data
and the share the actors waited for a free buffer (held back by the learner). From those, at the layout measured:

- the actors' ceiling: each actor's rate were it never held back by the learner, ``sps / n / (1 - actor_wait)``,
  times the actors of the layout predicted;
- the learner's ceiling: ``sps / (1 - learner_wait)``, scaled by the learner threads where they change (a measured
  factor where the run has measured both thread counts, else a prior that assumes little: threads^0.3) and by how
  far the busy actors and the learner threads oversubscribe the cores (shared cores: the learner's threads take
  turns with the actors, so its ceiling falls as they ask for more than the cores and rises as they ask for less);
- the envs per actor (K): an actor's time per step is its env stepping plus its share of a request's round trip
  (over K envs), split by the actors' measured env-step share; the learner process's per-request inference work
  is taken as half its CPU until measured;
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
    envs: int = 0  # actors.envs_per_actor (K; 0: not moved)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def differs(self, other: "Layout") -> list[str]:
        return [k for k, v in asdict(self).items() if asdict(other)[k] != v]

    def describe(self) -> str:
        envs = f" of {self.envs} envs" if self.envs else ""
        return (f"{self.actors} actor{'s' if self.actors != 1 else ''}{envs}, {self.threads} learner "
                f"thread{'s' if self.threads != 1 else ''}, inference wait {self.wait_ms:g} ms")


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
    actor_env: float = 1.0  # share of the actors' working time (not waiting for a buffer) spent stepping envs


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


def oversubscribed(w: Window, lay: Layout) -> float:
    """How many times over the cores the busy actors (as busy as in ``w``) and the learner threads of ``lay`` ask
    for them (1: they fit)."""
    busy_actors = lay.actors * (1.0 - w.actor_wait)
    return max(1.0, (busy_actors + lay.threads) / max(w.cores, 1))


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
    # the learner's threads take turns with the busy actors where together they want more than the cores: its
    # ceiling measured at one oversubscription moves with the other's
    learner = (c["learner"] * thread_factor(w.layout.threads, to.threads, learner_ceiling)
               * oversubscribed(w, w.layout) / oversubscribed(w, to))
    cpu = c["cpu"]
    k0, k1 = w.layout.envs, to.envs
    if k0 and k1 and k0 != k1:
        # K envs per request: an actor's time per step is its env stepping (per env) plus its share of the request's
        # round trip (per request, over K envs); the learner process's CPU per step is its training (per step) plus
        # the inference server's per-request work, taken as half of it until the run measures it
        per = (k0 / k1)
        actors *= 1.0 / (w.actor_env + (1.0 - w.actor_env) * per)
        learner *= 1.0 / (0.5 + 0.5 * per)
        a_cpu = w.actor_cpu * (w.actor_env + (1.0 - w.actor_env) * per)
        cpu = w.cores / max((a_cpu + w.learner_cpu * (0.5 + 0.5 * per)) / max(w.sps, 1e-9), 1e-12)
    # more actor processes than cores: they take turns, and the CPU ceiling bounds them with everything else
    least = min((("actors", actors), ("learner", learner), ("cpu", cpu)), key=lambda kv: kv[1])
    why = (f"actors {actors:,.0f} ({n1} x {c['actors'] / n0:,.0f}/actor, held back {w.actor_wait:.0%}), "
           f"learner {learner:,.0f} (waits {w.learner_wait:.0%} at {w.layout.threads} threads), "
           f"CPU {cpu:,.0f} ({w.cores} cores, {(w.actor_cpu + w.learner_cpu) / max(w.sps, 1e-9) * 1e6:,.0f} "
           f"core-us/step measured)")
    return Prediction(least[1], least[0], why)


def neighbours(at: Layout, max_actors: int, max_threads: int, knobs: tuple[str, ...],
               envs: tuple[int, ...] = ()) -> list[Layout]:
    """The layouts one move away: an actor more or fewer (twice, one and a half times or half as many too, and as
    many as allowed where twice would pass it, from far off), a learner
    thread more or fewer, the inference wait off or on (1 ms), the envs per actor doubled or halved (within
    ``envs``, the counts the learner's batch allows)."""
    out: list[Layout] = []
    if "envs" in knobs and at.envs:
        for k in (at.envs * 2, at.envs // 2):
            if k in envs:
                out.append(replace(at, envs=k))
    if "actors" in knobs:
        for n in {at.actors + 1, at.actors - 1, at.actors * 2, at.actors // 2, round(at.actors * 1.5),
                  min(max_actors, at.actors * 2)}:
            if 1 <= n <= max_actors and n != at.actors:
                out.append(replace(at, actors=n))
    if "threads" in knobs:
        for h in (at.threads + 1, at.threads - 1):
            if 1 <= h <= max_threads:
                out.append(replace(at, threads=h))
    if "wait" in knobs:
        out.append(replace(at, wait_ms=0.0 if at.wait_ms else 1.0))
    return sorted(out)
