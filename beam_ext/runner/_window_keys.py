"""Windows as dict keys, without the cost of hashing Beam's ``IntervalWindow``.

A windowed aggregation looks up a table by window once per element: the
partial combine by ``(window, key)``, the grouping by window within a key.
``IntervalWindow.__hash__`` reads ``MIN_TIMESTAMP.micros`` and
``MAX_TIMESTAMP.micros`` through Python properties on every call, and its
``__eq__`` between two equal windows decoded separately reads them four
times. :func:`window_key` gives a key that is equal exactly when the windows
are: the clamped bounds Beam's own ``__eq__`` compares, as a tuple of ints.
Other windows are their own key (the global window hashes cheaply).
"""
from __future__ import annotations

from typing import Any, Hashable

from apache_beam.transforms.window import IntervalWindow
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP

_MIN = MIN_TIMESTAMP.micros
_MAX = MAX_TIMESTAMP.micros


def window_key(window: Any) -> Hashable:
    """A key equal to another window's exactly when the windows are equal.

    >>> from apache_beam.utils.timestamp import Timestamp
    >>> window_key(IntervalWindow(Timestamp(60), Timestamp(120)))
    (60000000, 120000000)
    """
    if type(window) is IntervalWindow:
        # Beam's own fields; __eq__ clamps them to the timestamp range.
        start, end = window._start_micros, window._end_micros
        return start if start > _MIN else _MIN, end if end < _MAX else _MAX
    return window


def max_timestamp_micros(window: Any) -> int:
    """``window.max_timestamp()`` in microseconds, for an interval window without building it."""
    if type(window) is IntervalWindow and window._end_micros < _MAX:
        return window._end_micros - 1
    return window.max_timestamp().micros
