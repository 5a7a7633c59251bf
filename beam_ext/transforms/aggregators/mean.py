"""Arithmetic mean."""
from __future__ import annotations

import numpy as np

from beam_ext.transforms.aggregators._columnar import Column
from beam_ext.transforms.aggregators._exact import _ExactPrefix
from beam_ext.transforms.aggregators.sum import Sum


class Mean(Sum):
    """Mean of values, correctly rounded; None when empty. O(1) per operation.

    >>> m = Mean(); m.add(1.0); m.add(3.0); m.get()
    2.0
    """

    def get(self) -> float | None:
        return self._m.mean()


def mean_windows(col: Column, lo: np.ndarray, hi: np.ndarray) -> list:
    """:class:`Mean` of every window ``[lo, hi)`` from exact prefix sums; O(1) per window."""
    return col.shared(_ExactPrefix).means(lo, hi, col.count(lo, hi))
