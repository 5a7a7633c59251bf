"""Minimum and maximum: a monotonic deque over a FIFO window, a sparse table over a batch."""
from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from beam_ext.transforms.aggregators._columnar import Column, _none_where_empty


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


def _range_extreme(values: np.ndarray, lo: np.ndarray, hi: np.ndarray, use_max: bool) -> np.ndarray:
    """max (or min) of ``values[lo:hi]`` per query; NaN for empty ranges (sparse table)."""
    op = np.maximum if use_max else np.minimum
    fill = -np.inf if use_max else np.inf
    v = np.where(np.isnan(values), fill, values)
    length = hi - lo
    out = np.full(len(lo), fill)
    nonempty = length > 0
    if not nonempty.any():
        return np.full(len(lo), np.nan)
    level = np.zeros(len(lo), dtype=np.int64)
    level[nonempty] = np.floor(np.log2(length[nonempty])).astype(np.int64)
    # log2 of exact powers of two can round down; fix up.
    too_big = nonempty & ((np.int64(1) << level) > length)
    level[too_big] -= 1
    table = v
    max_level = int(level[nonempty].max())
    for k in range(max_level + 1):
        sel = nonempty & (level == k)
        if sel.any():
            out[sel] = op(table[lo[sel]], table[hi[sel] - (1 << k)])
        if k < max_level:
            half = 1 << k
            table = op(table[:-half], table[half:]) if len(table) > half else table[:0]
    out[~nonempty] = np.nan
    return out


def max_windows(col: Column, lo: np.ndarray, hi: np.ndarray) -> list:
    """:class:`Max` of every window ``[lo, hi)``; O(1) per window after O(n log n) set-up."""
    return _none_where_empty(_range_extreme(col.values, lo, hi, True).tolist(), col.count(lo, hi))


def min_windows(col: Column, lo: np.ndarray, hi: np.ndarray) -> list:
    """:class:`Min` of every window ``[lo, hi)``; O(1) per window after O(n log n) set-up."""
    return _none_where_empty(_range_extreme(col.values, lo, hi, False).tolist(), col.count(lo, hi))
