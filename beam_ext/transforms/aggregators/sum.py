"""Exact sum."""
from __future__ import annotations

import numpy as np

from beam_ext.transforms.aggregators._columnar import Column
from beam_ext.transforms.aggregators._exact import _ExactPrefix, _MomentsAggregator


class Sum(_MomentsAggregator):
    """Sum of values, correctly rounded; 0.0 when empty. O(1) per operation.

    Accumulates exactly (see ``_exact``), so removing a large value leaves
    the small ones intact: plain float running sums (and Kahan's) leave
    residue when a window slides from 1e16 to 1.0.

    >>> s = Sum(); s.add(1e16); s.add(1.0); s.remove(1e16); s.get()
    1.0
    """

    def get(self) -> float:
        return self._m.total() if self._m.n else 0.0


def sum_windows(col: Column, lo: np.ndarray, hi: np.ndarray) -> list:
    """:class:`Sum` of every window ``[lo, hi)`` from exact prefix sums; O(1) per window."""
    return col.shared(_ExactPrefix).totals(lo, hi)
