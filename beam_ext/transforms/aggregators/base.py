"""The shape every sliding-window aggregator has: add, remove, get."""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Aggregator(Protocol):
    """An invertible aggregate over a multiset of values.

    ``add(x)`` puts a value in, ``remove(x)`` takes out a value that was
    added, ``get()`` answers for the current multiset. Null values never
    reach an aggregator: the engine skips them. Aggregators whose
    ``fifo_only`` is true require values to be removed in the order they
    were added (the window's tail order); the engine rebuilds them when an
    out-of-order event lands inside a window.
    """

    fifo_only: bool

    def add(self, x: Any) -> None: ...

    def remove(self, x: Any) -> None: ...

    def get(self) -> Any: ...


def _check_not_empty(n: int, name: str) -> None:
    # Validate before mutating, so a bad remove leaves the state intact.
    if n <= 0:
        raise ValueError(f"{name}.remove: nothing to remove, the aggregate is empty")
