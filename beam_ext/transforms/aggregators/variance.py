"""Population variance and standard deviation with exact add and remove."""
from __future__ import annotations

import math

import numpy as np

from beam_ext.transforms.aggregators._columnar import Column
from beam_ext.transforms.aggregators._exact import _ExactPrefix, _MomentsAggregator


class Variance(_MomentsAggregator):
    """Population variance (divisor n), correctly rounded; None when empty.

    O(1) per operation. Welford's update with removal (Welford 1962; the
    form Railgun uses) keeps values around 1e9 with a spread of 1 accurate,
    but loses everything when a window slides from large values to small
    ones: ``m2`` drops from 1e17 to 1 by subtraction. Exact scaled-integer
    sums of x and x^2 (see ``_exact``) make add and remove exact inverses
    instead, and ``(n*S2 - S1^2) / n^2`` is then computed without rounding
    until the final division.

    >>> v = Variance(); [v.add(x) for x in (1e9 + 1, 1e9 + 3)]; v.get()
    [None, None]
    1.0
    >>> v.add(1e300); v.remove(1e9 + 1); v.remove(1e300); v.get()
    0.0
    """

    _squares = True

    def get(self) -> float | None:
        return self._m.variance()


class StdDev(Variance):
    """Population standard deviation: ``sqrt`` of :class:`Variance`.

    >>> s = StdDev(); [s.add(x) for x in (2.0, 4.0)]; s.get()
    [None, None]
    1.0
    """

    def get(self) -> float | None:
        v = super().get()
        return None if v is None else math.sqrt(v)


def variance_windows(col: Column, lo: np.ndarray, hi: np.ndarray) -> list:
    """:class:`Variance` of every window ``[lo, hi)`` from exact prefix sums; O(1) per window."""
    return col.shared(_ExactPrefix).variances(lo, hi, col.count(lo, hi))


def stddev_windows(col: Column, lo: np.ndarray, hi: np.ndarray) -> list:
    """:class:`StdDev` of every window ``[lo, hi)``: ``sqrt`` of :func:`variance_windows`."""
    return [None if v is None else math.sqrt(v) for v in variance_windows(col, lo, hi)]
