"""A record of a whole run in bounded memory: at most ``cap`` items, spread evenly over everything appended.

Hardware samples, verdicts and metrics records arrive at a steady rate for as long as a run goes (days, for some):
kept whole they grow without bound. ``Thinned`` keeps every item until ``cap`` are held, then every other one, and
from then on one append in 2 (4, 8, ...): the items held are always those whose index is a multiple of the stride,
so a plot of them spans the whole run at an even spacing. The last item appended is kept apart (``last``), so the
end of a run is never thinned away.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Thinned(Generic[T]):
    def __init__(self, cap: int = 2048, items: Iterable[T] = ()):
        if cap < 2:
            raise ValueError(f"cap={cap}: must be at least 2")
        self.cap, self.stride, self.count = cap, 1, 0
        self._items: list[T] = []
        self.last: T | None = None
        for x in items:
            self.append(x)

    def append(self, item: T) -> None:
        if self.count % self.stride == 0:
            self._items.append(item)
            if len(self._items) >= self.cap:
                del self._items[1::2]
                self.stride *= 2
        self.count += 1
        self.last = item

    def items(self) -> list[T]:
        """The items held, and the last one appended where thinning dropped it: the whole run, first to last."""
        if self.count and (self.count - 1) % self.stride:
            return [*self._items, self.last]
        return list(self._items)

    def __len__(self) -> int:
        return len(self._items) + (1 if self.count and (self.count - 1) % self.stride else 0)

    def __iter__(self) -> Iterator[T]:
        return iter(self.items())

    def __bool__(self) -> bool:
        return self.count > 0
