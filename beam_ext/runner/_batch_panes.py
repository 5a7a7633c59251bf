"""A batch GroupByKey's panes under the default trigger, without Beam's general driver.

In batch Beam groups a key's values with a trigger driver: the global
window under the default windowing takes a pass-through driver, every other
windowing Beam's ``GeneralTriggerDriver``, which keeps per-window state and
timers and fires them one by one. For fixed or sliding windows under the
default trigger (the common windowed aggregation) that costs tens to
hundreds of microseconds per value, growing with the number of windows a key
has (``benchmarks/batch_panes.py`` times it), so a key spread over a day of
one-minute windows takes minutes; sessions pay the same.

All of a batch's input is there before the watermark moves, so under the
default trigger each window of a key fires exactly once, on time, with every
value the key has in it. :func:`pane_driver` gives, for such windowings, a
driver that makes those panes directly: the same windows, values in arrival
order, the pane Beam's driver gives (first, on time, index 0, not last) and
the output timestamp its timestamp combiner gives. Merging windows
(sessions) are merged first, in one call of the window function's ``merge``
as Beam's driver makes it (:class:`MergedOnTimePanes`). Other triggers keep
Beam's driver, in windows that do not merge as the streaming grouping runs
it (``NonMergingTriggerDriver``: the same state, timers and panes, with
its per-element state work done once per window; ``tests/test_batch_panes.py``
compares their panes).
"""
from __future__ import annotations

from operator import itemgetter
from typing import Any, Iterable, Iterator

from apache_beam.transforms import trigger
from apache_beam.transforms.window import WindowFn
from apache_beam.utils import windowed_value
from apache_beam.utils.windowed_value import create as new_windowed

from beam_ext.runner._session_runs import session_runs
from beam_ext.runner._window_assign import interval
from beam_ext.runner._window_keys import max_timestamp_micros, window_key

_start = itemgetter(0)

# What Beam's GeneralTriggerDriver gives the one firing of the default
# trigger in batch (the trigger never finishes, so the pane is not the last).
ON_TIME = windowed_value.PaneInfo(is_first=True, is_last=False, timing=windowed_value.PaneInfoTiming.ON_TIME,
                                  index=0, nonspeculative_index=0)


class OnTimePanes:
    """One on-time pane per window of a key, as Beam's driver fires them in batch."""

    def __init__(self, windowing: Any) -> None:
        from apache_beam.transforms.window import TimestampCombiner

        self._output_time = TimestampCombiner.get_impl(windowing.timestamp_combiner, windowing.windowfn)
        # At the end of the window the output time depends on the window alone.
        self._end_of_window = windowing.timestamp_combiner == TimestampCombiner.OUTPUT_AT_EOW

    def process_entire_key(self, key: Any, values: Iterable[windowed_value.WindowedValue]
                           ) -> Iterator[windowed_value.WindowedValue]:
        """``(key, [values])`` per window, as ``GeneralTriggerDriver.process_entire_key``."""
        if self._end_of_window:
            yield from self.panes_at_end(key, [(wv.windows, wv.value) for wv in values])
            return
        # Keyed by window_key: equal windows decoded separately compare slowly.
        by_window: dict[Any, list] = {}
        assign = self._output_time.assign_output_time
        combine = self._output_time.combine
        for wv in values:
            value, timestamp = wv.value, wv.timestamp
            for window in wv.windows:
                k = window_key(window)
                pane = by_window.get(k)
                output_time = assign(window, timestamp)
                if pane is None:
                    by_window[k] = [window, [value], output_time]
                else:
                    pane[1].append(value)
                    pane[2] = combine(pane[2], output_time)
        for window, grouped, output_time in by_window.values():
            yield windowed_value.WindowedValue((key, grouped), output_time, (window,), ON_TIME)


    def panes_at_end(self, key: Any, elements: Iterable[tuple[tuple, Any]]) -> Iterator[windowed_value.WindowedValue]:
        """:meth:`process_entire_key` where the output time is the end of the
        window (:func:`reads_windows_and_values`), of each element's
        ``(windows, value)``."""
        assert self._end_of_window
        by_window: dict[Any, tuple] = {}
        for windows, value in elements:
            for window in windows:
                k = window_key(window)
                pane = by_window.get(k)
                if pane is None:
                    by_window[k] = (window, [value])
                else:
                    pane[1].append(value)
        for window, grouped in by_window.values():
            yield new_windowed((key, grouped), max_timestamp_micros(window), (window,), ON_TIME)


def reads_windows_and_values(windowing: Any) -> bool:
    """Whether the batch driver of ``windowing`` reads of an element only its
    windows and value: :class:`OnTimePanes` at the end of the window (windows
    that do not merge, the default trigger, end-of-window output times)."""
    from apache_beam.transforms.window import TimestampCombiner

    return (not windowing.is_default() and windowing.triggerfn == trigger.DefaultTrigger()
            and not windowing.windowfn.is_merging()
            and windowing.timestamp_combiner == TimestampCombiner.OUTPUT_AT_EOW)


class MergedOnTimePanes:
    """One on-time pane per merged window of a key (sessions, or any merging
    window function), as Beam's driver fires them in batch.

    Beam's driver gets all of a key's values at once: it merges their
    distinct windows in one call of the window function's ``merge``, then
    adds each window's values to the window it merged into, window by window
    in the order the windows first appeared, each window's values in arrival
    order; the output time is the timestamp combiner's ``merge`` over the
    merged window. This does the same, without its state and timers.
    """

    def __init__(self, windowing: Any) -> None:
        from apache_beam.transforms.window import Sessions, TimestampCombiner

        self._windowfn = windowing.windowfn
        self._output_time = TimestampCombiner.get_impl(windowing.timestamp_combiner, windowing.windowfn)
        self._sessions = type(windowing.windowfn) is Sessions  # merged in integers, as Sessions.merge
        self._end_of_window = windowing.timestamp_combiner == TimestampCombiner.OUTPUT_AT_EOW

    def _merges(self, windows: list) -> dict[Any, Any]:
        """window_key -> the window it merges into, for windows that merge into another."""
        # The set Beam's driver passes (its known windows, none yet, and these).
        context = _MergedAway(set().union(windows))
        self._windowfn.merge(context)
        return context.merged_away

    def process_entire_key(self, key: Any, values: Iterable[windowed_value.WindowedValue]
                           ) -> Iterator[windowed_value.WindowedValue]:
        """``(key, [values])`` per merged window, as ``GeneralTriggerDriver.process_entire_key``."""
        # window_key -> (window, values, their timestamps); no timestamps
        # at the end of the window, where the output time is the window's.
        end_of_window = self._end_of_window
        by_window: dict[Any, tuple] = {}
        for wv in values:
            value = wv.value
            timestamp = None if end_of_window else wv.timestamp
            for window in wv.windows:
                k = window_key(window)
                entry = by_window.get(k)
                if entry is None:
                    entry = by_window[k] = (window, [], [])
                entry[1].append(value)
                if not end_of_window:
                    entry[2].append(timestamp)
        windows = [entry[0] for entry in by_window.values()]
        merged_away = _session_merges(windows) if self._sessions else self._merges(windows)
        merged: dict[Any, tuple] = {}
        for window, grouped, timestamps in by_window.values():
            k = window_key(window)
            while k in merged_away:
                window = merged_away[k]
                k = window_key(window)
            into = merged.get(k)
            if into is None:
                merged[k] = (window, grouped, timestamps)  # by_window's lists, each read once
            else:
                into[1].extend(grouped)
                into[2].extend(timestamps)
        impl = self._output_time
        for window, grouped, timestamps in merged.values():
            if end_of_window:
                yield new_windowed((key, grouped), max_timestamp_micros(window), (window,), ON_TIME)
                continue
            output_time = impl.merge(window, (impl.assign_output_time(window, t) for t in timestamps))
            yield windowed_value.WindowedValue(
                (key, grouped), window.max_timestamp() if output_time is None else output_time, (window,), ON_TIME)


class _MergedAway(WindowFn.MergeContext):
    """A merge context that records, by window_key, the window each merged window went into."""

    def __init__(self, windows: Iterable[Any]) -> None:
        super().__init__(windows)
        self.merged_away: dict[Any, Any] = {}

    def merge(self, to_be_merged: Iterable[Any], merge_result: Any) -> None:
        for window in to_be_merged:
            if window != merge_result:
                self.merged_away[window_key(window)] = merge_result


def _session_merges(windows: list) -> dict[Any, Any]:
    """What ``Sessions.merge`` merges, as :meth:`MergedOnTimePanes._merges`
    gives it, computed on the windows' microseconds (:func:`session_runs`)
    instead of ``Timestamp`` objects."""
    merged_away: dict[Any, Any] = {}
    bounds = sorted(((window._start_micros, window._end_micros, window) for window in windows), key=_start)
    for first, stop, start, end in session_runs(bounds):
        if stop - first > 1:
            result = interval(start, end)
            kept = window_key(result)
            for _, _, window in bounds[first:stop]:
                k = window_key(window)
                if k != kept:
                    merged_away[k] = result
    return merged_away


def pane_driver(windowing: Any) -> Any:
    """The batch driver for ``windowing``: :class:`OnTimePanes` or
    :class:`MergedOnTimePanes` where they give Beam's panes (the default
    trigger), else Beam's own (``create_trigger_driver(windowing, True)``),
    as the streaming grouping runs it (``trigger_driver``) where that is
    Beam's general driver."""
    from beam_ext.runner.worker._trigger_driver import trigger_driver

    if not windowing.is_default() and windowing.triggerfn == trigger.DefaultTrigger():
        return MergedOnTimePanes(windowing) if windowing.windowfn.is_merging() else OnTimePanes(windowing)
    driver = trigger.create_trigger_driver(windowing, True)
    if type(driver) is trigger.GeneralTriggerDriver:
        # The same driver with its per-element state work done once per
        # window: Beam's makes a class at each count an AfterCount keeps.
        return trigger_driver(windowing, None)
    return driver
