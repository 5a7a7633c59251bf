"""Number of distinct values: a value -> multiplicity map, or a merge-sort tree over a batch."""
from __future__ import annotations

from typing import Hashable

import numpy as np

from beam_ext.transforms.aggregators._columnar import Column


class CountDistinct:
    """Distinct values in the window; O(1) per operation, memory O(distinct).

    >>> d = CountDistinct(); [d.add(x) for x in "aba"]; d.remove("a"); d.get()
    [None, None, None]
    2
    """

    fifo_only = False

    def __init__(self) -> None:
        self._counts: dict[Hashable, int] = {}

    def add(self, x: Hashable) -> None:
        counts = self._counts
        counts[x] = counts.get(x, 0) + 1

    def remove(self, x: Hashable) -> None:
        counts = self._counts
        c = counts.get(x)
        if c is None:
            raise ValueError(f"CountDistinct.remove: value {x!r:.200} is not in the window")
        if c == 1:
            del counts[x]
        else:
            counts[x] = c - 1

    def get(self) -> int:
        return len(self._counts)


def _distinct_counts(prev: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """#{j in [lo, hi): prev[j] < lo} per query (merge-sort tree, level by level)."""
    n = len(prev)
    out = np.zeros(len(lo), dtype=np.int64)
    if n == 0:
        return out
    span = np.int64(n + 2)
    shifted = prev + 1  # in [0, n + 1]
    left, right = lo.copy(), hi.copy()
    thresh = lo + 1  # prev < lo  <=>  prev + 1 < lo + 1
    positions = np.arange(n, dtype=np.int64)
    level = 0
    while True:
        active = left < right
        if not active.any():
            break
        block = positions >> level
        merged = np.sort(block * span + shifted)
        for take_left in (True, False):
            if take_left:
                sel = active & ((left & 1) == 1)
                bid = left[sel]
            else:
                sel = active & ((right & 1) == 1)
                bid = right[sel] - 1
            if sel.any():
                found = np.searchsorted(merged, bid * span + thresh[sel], side="left")
                out[sel] += found - (bid << level)
        left = np.where(active & ((left & 1) == 1), left + 1, left) >> 1
        right = np.where(active & ((right & 1) == 1), right - 1, right) >> 1
        level += 1
    return out


def _previous_occurrence(col: Column) -> np.ndarray:
    """Index of the previous row with the same key and value; -1 if none, n for nulls."""
    kc, codes = col.keys, col.values
    n = len(codes)
    prev = np.full(n, -1, dtype=np.int64)
    idx = np.arange(n, dtype=np.int64)
    order = np.lexsort((idx, codes, kc))
    same = (kc[order][1:] == kc[order][:-1]) & (codes[order][1:] == codes[order][:-1])
    prev[order[1:][same]] = order[:-1][same]
    prev[codes < 0] = n  # never "first in window": nulls are not counted
    return prev


def count_distinct_windows(col: Column, lo: np.ndarray, hi: np.ndarray) -> list:
    """:class:`CountDistinct` of every window ``[lo, hi)``: the values whose previous
    occurrence is before the window, counted in O(log^2 n) per window."""
    return _distinct_counts(col.shared(_previous_occurrence), lo, hi).tolist()
