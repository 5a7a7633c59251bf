"""Beam's standard window functions' ``assign``, in integer microseconds.

``FixedWindows.assign`` builds five ``Timestamp`` and ``Duration`` objects
and an ``IntervalWindow`` for every element it is called on (``Sessions``
three), and a ``TimestampedValue`` output in the global window builds
``GlobalWindow()``, whose ``__init__`` re-reads the end of the global window
from Beam's protos each time. In a windowed aggregation that was the largest share of a
task (``benchmarks/runner_profile.py --only windows``). The windows of
:class:`GlobalWindows`, :class:`FixedWindows`, :class:`SlidingWindows` and
:class:`Sessions` depend on the timestamp alone, so :func:`assigner`
computes them from the timestamp's microseconds with Beam's arithmetic and,
but for sessions (a window per timestamp), hands out the same window tuples
again for timestamps in the same windows.

Only those exact classes: a subclass may assign otherwise, and any other
window function keeps its own ``assign``. :func:`keyed_assigner` gives fixed
and sliding windows with their table keys (:mod:`._window_keys`), for a
partial combine that takes the windows of a ``WindowInto`` folded into it;
:data:`interval` makes an ``IntervalWindow`` from microseconds as Beam's
window coder does.
"""
from __future__ import annotations

from typing import Any, Callable

from apache_beam.transforms.window import (
    FixedWindows,
    GlobalWindow,
    GlobalWindows,
    IntervalWindow,
    Sessions,
    SlidingWindows,
)
from apache_beam.utils.timestamp import Timestamp

from beam_ext.runner._window_keys import window_key

#: Distinct window tuples kept per window function before the cache starts
#: over: a task's data rarely spans more, and memory stays bounded if it does.
CACHED = 1 << 16

_GLOBAL = (GlobalWindow(),)


def assigner(windowfn: Any) -> Callable[[int], tuple] | None:
    """``windows(timestamp_micros)``: the windows ``windowfn`` assigns an element
    at that time, as a tuple in Beam's order; None unless ``windowfn`` is one of
    Beam's global, fixed, sliding or session window functions (not a subclass).

    >>> from apache_beam.transforms.window import FixedWindows
    >>> assigner(FixedWindows(60))(90_000_000)
    ([60.0, 120.0),)
    """
    kind = type(windowfn)
    if kind is GlobalWindows:
        return lambda micros: _GLOBAL
    if kind is FixedWindows:
        return _fixed(windowfn.size.micros, windowfn.offset.micros)
    if kind is SlidingWindows:
        return _sliding(windowfn.size.micros, windowfn.period.micros, windowfn.offset.micros)
    if kind is Sessions:
        gap = windowfn.gap_size.micros
        # Beam: IntervalWindow(timestamp, timestamp + gap_size).
        return lambda micros: (interval(micros, micros + gap),)
    return None


def keyed_assigner(windowfn: Any) -> Callable[[int], tuple] | None:
    """``pairs(timestamp_micros)``: ``(window_key(w), w)`` for each window ``w``
    :func:`assigner` gives, for Beam's fixed and sliding windows (None for
    others); for a table keyed by window, with no key computed per element.

    >>> from apache_beam.transforms.window import FixedWindows
    >>> keyed_assigner(FixedWindows(60))(90_000_000)
    (((60000000, 120000000), [60.0, 120.0)),)
    """
    kind = type(windowfn)
    if kind is FixedWindows:
        return _fixed(windowfn.size.micros, windowfn.offset.micros, _keyed)
    if kind is SlidingWindows:
        return _sliding(windowfn.size.micros, windowfn.period.micros, windowfn.offset.micros, _keyed)
    return None


def _itself(window: IntervalWindow) -> IntervalWindow:
    return window


def _keyed(window: IntervalWindow) -> tuple:
    return window_key(window), window


def _fixed(size: int, offset: int, made: Callable[[IntervalWindow], Any] = _itself) -> Callable[[int], tuple]:
    cache: dict[int, tuple] = {}

    def windows(micros: int) -> tuple:
        # Beam: start = timestamp - (timestamp - offset) % size, Python's modulo.
        start = micros - (micros - offset) % size
        found = cache.get(start)
        if found is None:
            if len(cache) >= CACHED:
                cache.clear()
            found = cache[start] = (made(interval(start, start + size)),)
        return found
    return windows


def _sliding(size: int, period: int, offset: int,
             made: Callable[[IntervalWindow], Any] = _itself) -> Callable[[int], tuple]:
    cache: dict[tuple[int, int], tuple] = {}

    def windows(micros: int) -> tuple:
        last = micros - (micros - offset) % period
        # Beam: one window per start in range(last, timestamp - size, -period).
        count = len(range(last, micros - size, -period))
        found = cache.get((last, count))
        if found is None:
            if len(cache) >= CACHED:
                cache.clear()
            found = cache[last, count] = tuple(
                made(interval(start, start + size)) for start in range(last, micros - size, -period))
        return found
    return windows


def _interval_of_timestamps(start: int, end: int) -> IntervalWindow:
    return IntervalWindow(Timestamp(micros=start), Timestamp(micros=end))


def _interval_of_micros(start: int, end: int) -> IntervalWindow:
    # As Beam's window coder decodes one: the bounds' microseconds set, their
    # Timestamps left to be made when read (``start``, ``end``). The public
    # constructor builds two pure-Python Timestamps and reads them back,
    # ten times the cost, once per session a partial combine emits.
    window = IntervalWindow(None, None)
    try:
        window.__setstate_cython__((end, None, start, None))
    except OverflowError:  # beyond 64 bits: Beam's constructor clamps such a bound
        return _interval_of_timestamps(start, end)
    return window


def _sets_micros() -> bool:
    """Whether this Beam's ``IntervalWindow`` takes its bounds' microseconds
    as above: the state its Cython pickling declares, the same window."""
    try:
        made, want = _interval_of_micros(-5, 70), _interval_of_timestamps(-5, 70)
        return (made == want and (made._start_micros, made._end_micros) == (-5, 70)
                and (made.start, made.end) == (want.start, want.end))
    except Exception:  # noqa: BLE001 - another layout: the public constructor
        return False


#: ``interval(start, end)``: the ``IntervalWindow`` from ``start`` to ``end`` microseconds.
interval: Callable[[int, int], IntervalWindow] = (
    _interval_of_micros if _sets_micros() else _interval_of_timestamps)
