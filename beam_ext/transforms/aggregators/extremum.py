"""Minimum and maximum over a FIFO window with a monotonic deque."""
from __future__ import annotations

from collections import deque
from typing import Any


class Max:
    """Maximum of the window, None when empty; amortised O(1) per operation.

    The deque holds the values that can still become the maximum, in
    arrival order and non-increasing; equal values are all kept so that
    removing one of them leaves the other. Values must be removed in the
    order they were added (``fifo_only``).

    >>> m = Max(); [m.add(x) for x in (3, 1, 2)]; m.remove(3); m.get()
    [None, None, None]
    2
    """

    fifo_only = True

    def __init__(self) -> None:
        self._dq: deque[Any] = deque()
        self.n = 0

    def _dominates(self, new: Any, old: Any) -> bool:
        return new > old

    def add(self, x: Any) -> None:
        dq = self._dq
        while dq and self._dominates(x, dq[-1]):
            dq.pop()
        dq.append(x)
        self.n += 1

    def remove(self, x: Any) -> None:
        if self.n <= 0:
            raise ValueError(f"{type(self).__name__}.remove: nothing to remove, the aggregate is empty")
        self.n -= 1
        if self._dq[0] == x:
            self._dq.popleft()

    def get(self) -> Any:
        return self._dq[0] if self._dq else None


class Min(Max):
    """Minimum of the window, None when empty; see :class:`Max`.

    >>> m = Min(); [m.add(x) for x in (1, 3, 2)]; m.remove(1); m.get()
    [None, None, None]
    2
    """

    def _dominates(self, new: Any, old: Any) -> bool:
        return new < old
