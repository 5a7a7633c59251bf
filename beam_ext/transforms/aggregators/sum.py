"""Exact sum."""
from __future__ import annotations

from beam_ext.transforms.aggregators._exact import _MomentsAggregator


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
