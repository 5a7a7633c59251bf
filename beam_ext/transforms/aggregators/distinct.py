"""Number of distinct values, from a value -> multiplicity map."""
from __future__ import annotations

from typing import Any, Hashable


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
