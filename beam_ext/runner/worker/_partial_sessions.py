"""The partial combine of a ``CombinePerKey`` in sessions: sessions merged before the shuffle.

Beam's partial combine (``PGBKCVOperation``) keeps an accumulator per key
and window. In sessions every element has its own window (from its
timestamp to timestamp + gap), so it combines nothing: each element becomes
an accumulator, shuffled with its window, and the sessions are merged only
by the grouping after the shuffle. :class:`PartialSessions` merges the
windows a task holds of a key first, as ``Sessions.merge`` would (sorted by
start, each run of overlapping windows merged into one from the run's
first start to its greatest end), and shuffles an accumulator per merged
window.

The result after the shuffle is the same. A merged window covers exactly
the windows merged into it, with no gap, so it overlaps another window
exactly when one of them does: the grouping's merge makes the same sessions
of merged windows as of the elements' own. Each session's accumulator is
the merge of accumulators over the same values, which a ``CombineFn``
promises gives the same result in any grouping.

Only Beam's exact ``Sessions`` (a subclass may merge otherwise), at the end
of the window (another timestamp combiner would need each value's output
time carried) and under the default trigger. The held elements are bounded:
at :data:`HELD` they are all merged and emitted, which only makes the merged
windows finer.
"""
from __future__ import annotations

from collections import defaultdict
from operator import itemgetter
from typing import Any, Callable

from apache_beam.utils.windowed_value import create as new_windowed

from beam_ext.runner._element_batches import Same
from beam_ext.runner._session_runs import session_runs
from beam_ext.runner._window_assign import interval
from beam_ext.runner._window_keys import max_timestamp_micros

#: Elements held across keys before all are merged and emitted; as many
#: entries (a tuple of a value and its window's bounds) take some 25 MB.
HELD = 200_000

_start = itemgetter(0)
_value = itemgetter(2)


def merges_partially(windowing: Any) -> bool:
    """Whether a partial combine in ``windowing`` may merge sessions before the shuffle."""
    from apache_beam.transforms.trigger import DefaultTrigger
    from apache_beam.transforms.window import Sessions, TimestampCombiner

    return (type(windowing.windowfn) is Sessions and windowing.triggerfn == DefaultTrigger()
            and windowing.timestamp_combiner == TimestampCombiner.OUTPUT_AT_EOW)


class PartialSessions:
    """A task's elements of each key, merged into sessions and combined when emitted.

    ``create``, ``add_all`` and ``compact`` are the ``CombineFn``'s
    (``compact`` None where it has none); :meth:`add` takes a batch of
    ``(key, value)`` elements in session windows or, given the sessions'
    ``gap`` in microseconds, elements not yet windowed: the ``WindowInto``
    before the combine folded in, each element in the session from its
    timestamp to timestamp + gap once per window it was in (as Beam's
    ``AssignWindows`` outputs it), with no window object made for it.
    """

    def __init__(self, create: Callable[[], Any], add_all: Callable[[Any, list], Any],
                 compact: Callable[[Any], Any] | None, held: int = HELD, gap: int | None = None) -> None:
        self._create, self._add_all, self._compact = create, add_all, compact
        self._bound = held
        self._gap = gap
        self._held = 0
        # key -> [(start micros, end micros, value, window or None)] in arrival order.
        self._by_key: defaultdict[Any, list] = defaultdict(list)

    def add(self, batch: Same | list) -> list:
        """Holds a batch's elements; the merged accumulators of all held elements
        once :data:`HELD` are held, else nothing."""
        by_key = self._by_key
        if self._gap is not None:
            self._add_unwindowed(batch)
        elif type(batch) is Same:
            windows = batch.template.windows
            for key, value in batch.values:
                by_key[key] += [(window._start_micros, window._end_micros, value, window) for window in windows]
            self._held += len(batch.values) * len(windows)
        else:
            count = 0
            for wv in batch:
                key, value = wv.value
                by_key[key] += [(window._start_micros, window._end_micros, value, window) for window in wv.windows]
                count += len(wv.windows)
            self._held += count
        return self.flush() if self._held >= self._bound else []

    def _add_unwindowed(self, batch: Same | list) -> None:
        # Each in the session from its timestamp to timestamp + gap; its
        # window is made only if it stays a session of its own.
        by_key, gap = self._by_key, self._gap
        if type(batch) is Same:
            start = batch.template.timestamp_micros
            entries = len(batch.template.windows)
            for key, value in batch.values:
                by_key[key] += [(start, start + gap, value, None)] * entries
            self._held += len(batch.values) * entries
            return
        count = 0
        for wv in batch:
            key, value = wv.value
            start = wv.timestamp_micros
            entries = len(wv.windows)
            if entries == 1:
                by_key[key].append((start, start + gap, value, None))
            else:
                by_key[key] += [(start, start + gap, value, None)] * entries
            count += entries
        self._held += count

    def flush(self) -> list:
        """Every held element merged into its key's sessions: one element
        ``(key, accumulator)`` per session, stamped at its end; none held after."""
        out: list = []
        emit = self._emit
        for key, held in self._by_key.items():
            held.sort(key=_start)  # stable: a session's values in arrival order where starts tie
            values = list(map(_value, held))
            for first, stop, start, end in session_runs(held):
                # A window merged from several is new, as Sessions.merge makes it.
                window = held[first][3] if stop - first == 1 else None
                out.append(emit(key, values[first:stop], start, end, window))
        self._by_key.clear()
        self._held = 0
        return out

    def _emit(self, key: Any, values: list, start: int, end: int, window: Any) -> Any:
        accumulator = self._add_all(self._create(), values)
        if self._compact is not None:
            accumulator = self._compact(accumulator)
        if window is None:
            window = interval(start, end)
        return new_windowed((key, accumulator), max_timestamp_micros(window), (window,))
