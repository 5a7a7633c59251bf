"""Arithmetic mean."""
from __future__ import annotations

from beam_ext.transforms.aggregators.sum import Sum


class Mean(Sum):
    """Mean of values, correctly rounded; None when empty. O(1) per operation.

    >>> m = Mean(); m.add(1.0); m.add(3.0); m.get()
    2.0
    """

    def get(self) -> float | None:
        return self._m.mean()
