"""A cheap lap timer owned by each role: total seconds and count per named stage."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager


class StageTimer:
    """``enabled=False`` makes every stage a no-op (used to measure the telemetry's own overhead)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.total: dict[str, float] = defaultdict(float)
        self.count: dict[str, int] = defaultdict(int)
        self.t0 = time.perf_counter()

    @contextmanager
    def stage(self, name: str):
        if not self.enabled:
            yield
            return
        t = time.perf_counter()
        try:
            yield
        finally:
            self.total[name] += time.perf_counter() - t
            self.count[name] += 1

    def add(self, name: str, seconds: float, n: int = 1) -> None:
        self.total[name] += seconds
        self.count[name] += n

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
