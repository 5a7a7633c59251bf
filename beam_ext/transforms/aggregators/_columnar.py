"""One column of a whole batch, as the vectorised forms of the aggregators read it.

The vectorised form of a kind answers every window of a batch at once:
``fn(column, lo, hi)`` returns, for each ``i``, what the kind's incremental
aggregator's ``get()`` returns over the non-null values of
``column.values[lo[i]:hi[i]]``, equal bit for bit. Rows are sorted by key,
then time, and a window never spans two keys.
"""
from __future__ import annotations

from typing import Any, Callable, TypeVar

import numpy as np

_T = TypeVar("_T")


def _prefix(x: np.ndarray, dtype: Any = np.int64) -> np.ndarray:
    """``out[i] = sum(x[:i])``, so a range sum is ``out[hi] - out[lo]``."""
    out = np.zeros(len(x) + 1, dtype=dtype)
    np.cumsum(x, out=out[1:], dtype=dtype)
    return out


class Column:
    """The values of one column, with helpers built once and shared by every kind.

    ``values`` is float64 with NaN for nulls (numeric kinds) or int64 codes,
    equal codes for equal values and -1 for nulls (the others); ``keys`` are
    the rows' key codes, non-decreasing.

    >>> col = Column(np.array([1.0, np.nan, 3.0]), np.zeros(3, dtype=np.int64))
    >>> col.count(np.array([0, 1]), np.array([3, 2])).tolist()
    [2, 0]
    """

    def __init__(self, values: np.ndarray, keys: np.ndarray) -> None:
        self.values = values
        self.keys = keys
        self._shared: dict[Callable[[Column], Any], Any] = {}

    @classmethod
    def every_event(cls, keys: np.ndarray) -> Column:
        """The column of a field-less aggregation (``agg.count()``): every row is a value."""
        return cls(np.zeros(len(keys), dtype=np.int64), keys)

    def shared(self, build: Callable[[Column], _T]) -> _T:
        """``build(self)``, computed once per column: kinds over one field share it.

        O(1) after the first call; the first costs what ``build`` costs.
        """
        try:
            return self._shared[build]
        except KeyError:
            got = self._shared[build] = build(self)
            return got

    def count(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """Non-null values in each ``[lo, hi)``; O(1) per window after an O(n) prefix sum."""
        nonnull = self.shared(_nonnull_prefix)
        return nonnull[hi] - nonnull[lo]


def _nonnull_prefix(col: Column) -> np.ndarray:
    x = col.values
    return _prefix(~np.isnan(x) if x.dtype == np.float64 else x >= 0)


def _none_where_empty(out: list, cnt: np.ndarray) -> list:
    """``None`` for every window without values, as the incremental ``get()`` answers."""
    for i in np.flatnonzero(cnt == 0).tolist():
        out[i] = None
    return out
