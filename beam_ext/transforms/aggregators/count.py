"""Count of values."""
from __future__ import annotations

from typing import Any

import numpy as np

from beam_ext.transforms.aggregators._columnar import Column
from beam_ext.transforms.aggregators.base import _check_not_empty


class Count:
    """Number of values; O(1) per operation.

    >>> c = Count(); c.add(3); c.add(5); c.remove(3); c.get()
    1
    """

    fifo_only = False

    def __init__(self) -> None:
        self.n = 0

    def add(self, x: Any) -> None:
        self.n += 1

    def remove(self, x: Any) -> None:
        _check_not_empty(self.n, "Count")
        self.n -= 1

    def get(self) -> int:
        return self.n


def count_windows(col: Column, lo: np.ndarray, hi: np.ndarray) -> list:
    """:class:`Count` of every window ``[lo, hi)``; O(1) per window."""
    return col.count(lo, hi).tolist()
