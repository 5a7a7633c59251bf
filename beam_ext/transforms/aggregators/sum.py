"""Exact sum."""
from __future__ import annotations

from beam_ext.transforms.aggregators._exact import _ExactMoments
from beam_ext.transforms.aggregators.base import _check_not_empty


class Sum:
    """Sum of values, correctly rounded; 0.0 when empty. O(1) per operation.

    Accumulates exactly (see ``_exact``), so removing a large value leaves
    the small ones intact: plain float running sums (and Kahan's) leave
    residue when a window slides from 1e16 to 1.0.

    >>> s = Sum(); s.add(1e16); s.add(1.0); s.remove(1e16); s.get()
    1.0
    """

    fifo_only = False

    def __init__(self) -> None:
        self._m = _ExactMoments(squares=False)

    @property
    def n(self) -> int:
        return self._m.n

    def add(self, x: float) -> None:
        self._m.update(x, 1)

    def remove(self, x: float) -> None:
        _check_not_empty(self._m.n, type(self).__name__)
        self._m.update(x, -1)

    def get(self) -> float:
        return self._m.total() if self._m.n else 0.0
