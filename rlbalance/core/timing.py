"""A cheap lap timer owned by each role: total seconds and count per named stage."""

from __future__ import annotations

import time
from collections import defaultdict


class StageTimer:
    """``enabled=False`` makes every stage a no-op (used to measure the telemetry's own overhead)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._stages: dict[str, _Stage] = {}
        self.total: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)
        self.t0 = time.perf_counter()

    def stage(self, name: str) -> "_Stage":
        """``with timer.stage("env_step"): ...`` adds the block's time to that stage (not re-entrant per name)."""
        s = self._stages.get(name)
        if s is None:
            s = self._stages[name] = (_Stage(self, name) if self.enabled else _NULL)
        return s

    def add(self, name: str, seconds: float, n: int = 1) -> None:
        self.total[name] += seconds
        self.count[name] += n

    def elapsed(self) -> float:
        """Seconds since the last reset (cheap: no copy of the totals)."""
        return time.perf_counter() - self.t0

    def snapshot(self, reset: bool = False) -> dict:
        wall = time.perf_counter() - self.t0
        snap = {"wall_s": wall, "seconds": dict(self.total), "count": dict(self.count)}
        if reset:
            self.total.clear()
            self.count.clear()
            self.t0 = time.perf_counter()
        return snap

    @staticmethod
    def shares(snap: dict) -> dict[str, float]:
        wall = max(snap["wall_s"], 1e-9)
        return {k: v / wall for k, v in snap["seconds"].items()}


class _Stage:
    """A reusable, allocation-free context manager (a generator-based one costs microseconds per use)."""

    __slots__ = ("timer", "name", "t")

    def __init__(self, timer: StageTimer, name: str):
        self.timer, self.name, self.t = timer, name, 0.0

    def __enter__(self) -> None:
        self.t = time.perf_counter()

    def __exit__(self, *exc) -> None:
        self.timer.total[self.name] += time.perf_counter() - self.t
        self.timer.count[self.name] += 1


class _NullStage:
    __slots__ = ()

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc) -> None:
        pass


_NULL = _NullStage()
