"""Beam's trigger driver, with its per-element work done once per window where the result is the same.

A streaming GroupByKey runs Beam's ``GeneralTriggerDriver`` for every key
(:mod:`._streaming_group`). For each element it checks whether the
element's window has expired (a window's end plus the allowed lateness, a
new ``Timestamp`` each time), adds the value to the window's state and calls
the trigger's ``on_element``, through two layers of state adapters that
define a class (Beam's ``without_extraction``) at every access to a
combining state, such as ``AfterCount``'s count: most of the driver's time
on a grouping of many small elements.

:class:`NonMergingTriggerDriver` is the same driver, for any trigger in
windows that do not merge, with these changes, which leave its state,
timers and panes as Beam's:

* whether a window has expired is computed once per window, not per element;
* a window's elements are appended to its list state at once, before the
  trigger sees them (no trigger reads the elements' state), and their
  timestamps are not read where the hold does not depend on them (the
  end-of-window timestamp combiner);
* under the default trigger, ``on_element`` is called once per window of a
  call instead of once per element: it only sets the window's end-of-window
  timer, the same timer each time; other triggers get it per element, as
  in Beam;
* the merging of windows, a no-op for a window function that does not
  merge, is skipped;
* a combining state tag's accumulator view (``without_extraction``) is made
  once per driver, not at every state access;
* a window's state ids are found by the window object first: the group
  task hands the driver one object per window (``_Windows`` in
  :mod:`._streaming_group`), and Beam's ``IntervalWindow`` is slow to hash
  and compare.

Everything else (watermark holds, tombstones, firing, panes, timers) is
Beam's own code. ``tests/test_trigger_driver.py`` compares the two drivers'
panes and states on random inputs and triggers.

:class:`MergingTriggerDriver`, for windows that merge (sessions), is Beam's
driver run through the same adapter: Beam's wraps the state in its own
adapter at every call, whose combining state views define a class at every
access. Each timer's window is found by its id in an index instead of a
scan of the key's windows: Beam's ``process_timer`` scans every window the
key has (``get_window``, then ``known_windows``), so a key with many
sessions costs the square of their number. Its ``process_elements`` is
Beam's steps (merging included), each window's expiry computed once and
its values appended before the trigger sees them, as above.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator

from apache_beam.transforms import timeutil, trigger
from apache_beam.transforms import window as window_fns
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.utils.timestamp import MIN_TIMESTAMP, Timestamp


def expired_values(windowing: Any, windowed_values: Iterable[Any], input_watermark: Timestamp) -> int:
    """How many of ``windowed_values``' (value, window) pairs Beam's driver drops as
    past their window's allowed lateness (what :class:`NonMergingTriggerDriver` counts
    in ``dropped``)."""
    lateness = windowing.allowed_lateness
    return sum(1 for wv in windowed_values for window in wv.windows if input_watermark > window.end + lateness)


def trigger_driver(windowing: Any, clock: Any) -> trigger.TriggerDriver:
    """The driver a streaming GroupByKey runs: :class:`NonMergingTriggerDriver`
    where the windows do not merge, else :class:`MergingTriggerDriver`."""
    if not windowing.windowfn.is_merging():
        return NonMergingTriggerDriver(windowing, clock)
    return MergingTriggerDriver(windowing, clock)


def watermark_hold(combiner: timeutil.TimestampCombinerImpl, window: Any, timestamps: Iterable[Timestamp] | None,
                   output_watermark: Timestamp) -> Timestamp | None:
    """The watermark hold Beam's driver adds for elements of ``timestamps``
    added to ``window``: the merge of their output times not behind
    ``output_watermark`` (None if none is); ``timestamps`` None where the
    hold depends only on the window (``combiner`` is ``DependsOnlyOnWindow``),
    so that no element's timestamp need be read."""
    return combiner.merge(window, (
        output for output in (combiner.assign_output_time(window, timestamp) for timestamp in timestamps)
        if output >= output_watermark) if timestamps is not None else ())


def _add_hold(driver: trigger.GeneralTriggerDriver, state: Any, window: Any, elements: list,
              output_watermark: Timestamp, by_time: bool) -> None:
    """Beam's watermark hold for ``elements`` added to ``window``
    (:func:`watermark_hold`); without ``by_time`` no element's timestamp is read."""
    output_time = watermark_hold(driver.timestamp_combiner_impl, window,
                                 (wv.timestamp for wv in elements) if by_time else None, output_watermark)
    if output_time is not None:
        state.add_state(window, driver.WATERMARK_HOLD, output_time)


class _StateAdapter(trigger.MergeableStateAdapter):
    """Beam's state adapter, with each combining tag's accumulator view made
    once per driver: Beam's makes it (``without_extraction``, which defines
    a class) at every access, several times per pane fired."""

    def __init__(self, raw_state: Any, views: dict[tuple[str, int], tuple[Any, Any]]) -> None:
        super().__init__(raw_state)
        self._views = views
        self._by_object: dict[int, tuple[Any, list]] = {}

    def _view(self, tag: Any) -> Any:
        # Keyed by what the view is made of: a nested trigger's context makes
        # a new tag (``with_prefix``) at every access, with the same name and
        # CombineFn.
        key = (tag.tag, id(tag.combine_fn))
        found = self._views.get(key)
        if found is None or found[0] is not tag.combine_fn:
            found = self._views[key] = (tag.combine_fn, tag.without_extraction())
        return found[1]

    # A trigger's every state access and timer looks its window up in the
    # window ids, and hashing Beam's IntervalWindow reads two Timestamp
    # properties each time. The group task hands the driver one object per
    # window (:mod:`._streaming_group`), so the ids are also found by the
    # window object's identity; an equal window of another object is looked
    # up as Beam does.
    def _ids(self, window: Any) -> list | None:
        found = self._by_object.get(id(window))
        if found is not None and found[0] is window:
            return found[1]
        ids = self.window_ids.get(window)
        if ids is not None:
            self._by_object[id(window)] = (window, ids)
        return ids

    def _get_id(self, window: Any) -> Any:
        ids = self._ids(window)
        if ids is not None:
            return ids[0]
        return super()._get_id(window)

    def _get_ids(self, window: Any) -> list:
        return self._ids(window) or []

    def clear_state(self, window: Any, tag: Any) -> None:
        super().clear_state(window, tag)
        if tag is None:  # the window's ids are gone
            self._by_object.clear()

    def add_state(self, window: Any, tag: Any, value: Any) -> None:
        if not isinstance(tag, trigger._CombiningValueStateTag):
            super().add_state(window, tag, value)
            return
        self.raw_state.add_state(self._get_id(window), self._view(tag), value)

    def add_all(self, window: Any, tag: Any, values: list) -> None:
        """``add_state`` of each value to a list state, in one step where the
        state is Beam's in-memory one (which appends each value to a list)."""
        raw = self.raw_state
        if type(raw) is not trigger.InMemoryUnmergedState or raw.defensive_copy:
            for value in values:
                self.add_state(window, tag, value)
            return
        raw.state[self._get_id(window)][tag.tag].extend(values)

    def get_state(self, window: Any, tag: Any) -> Any:
        if not isinstance(tag, trigger._CombiningValueStateTag):
            return super().get_state(window, tag)
        view = self._view(tag)
        values = [self.raw_state.get_state(window_id, view) for window_id in self._get_ids(window)]
        return tag.combine_fn.extract_output(tag.combine_fn.merge_accumulators(values))


class NonMergingTriggerDriver(trigger.GeneralTriggerDriver):
    """Beam's ``GeneralTriggerDriver`` for windows that do not merge (see the module)."""

    def __init__(self, windowing: Any, clock: Any) -> None:
        super().__init__(windowing, clock)
        self._default = windowing.triggerfn == trigger.DefaultTrigger()
        # The state is wrapped here, in the adapter above, not by Beam's code.
        self.is_merging = False
        self._views: dict[tuple[str, int], tuple[Any, Any]] = {}
        # Values dropped in windows past their allowed lateness, one per window.
        self.dropped = 0

    def process_timer(self, window_id: Any, name: str, time_domain: Any, timestamp: Timestamp, state: Any,
                      input_watermark: Timestamp | None = None) -> Iterator[Any]:
        return super().process_timer(window_id, name, time_domain, timestamp, _StateAdapter(state, self._views),
                                     input_watermark)

    def process_elements(self, state: Any, windowed_values: Iterable[Any], output_watermark: Timestamp,
                         input_watermark: Timestamp = MIN_TIMESTAMP,
                         gathered: Iterable[tuple[tuple, list]] = ()) -> Iterator[Any]:
        """Beam's ``process_elements``; ``gathered``: more elements, as
        ``(windows, values)`` of values that share their windows, where the
        hold does not read timestamps (the end-of-window combiner), as a
        streaming grouping's task reads them from the shuffle
        (``GroupSpec.by_window``)."""
        state = _StateAdapter(state, self._views)
        lateness = self.allowed_lateness
        expired: set[Any] = set()
        by_window: dict[Any, list] = {}
        values_of: dict[Any, list] = {}  # a window's gathered values
        last, last_elements = None, []  # consecutive elements mostly share their window object
        for wv in windowed_values:
            for window in wv.windows:
                if window is last:
                    last_elements.append(wv)
                    continue
                elements = by_window.get(window)
                if elements is None:
                    if window in expired:
                        self.dropped += 1
                        continue
                    if input_watermark > window.end + lateness:
                        expired.add(window)
                        self.dropped += 1
                        continue
                    elements = by_window[window] = []
                elements.append(wv)
                last, last_elements = window, elements
        for windows, values in gathered:
            for window in windows:
                found = values_of.get(window)
                if found is None:
                    if window in expired:
                        self.dropped += len(values)
                        continue
                    if window not in by_window:
                        if input_watermark > window.end + lateness:
                            expired.add(window)
                            self.dropped += len(values)
                            continue
                        by_window[window] = []
                    found = values_of[window] = []
                found.extend(values)
        # A window's hold under the end-of-window combiner does not depend on its
        # elements (Beam's merge ignores them), so their timestamps, which a
        # WindowedValue builds on each read, are not read.
        by_time = not isinstance(self.timestamp_combiner_impl, timeutil.DependsOnlyOnWindow)
        assert not (values_of and by_time), "gathered values carry no timestamps for this hold"
        for window, elements in by_window.items():
            if state.get_state(window, self.TOMBSTONE):
                continue
            _add_hold(self, state, window, elements, output_watermark, by_time)
            context = state.at(window, self.clock)
            values = [wv.value for wv in elements]
            if window in values_of:
                values += values_of[window]
            state.add_all(window, self.ELEMENTS, values)
            if self._default:
                self.trigger_fn.on_element(values[-1], window, context)
            else:
                for value in values:
                    self.trigger_fn.on_element(value, window, context)
            if self.trigger_fn.should_fire(TimeDomain.WATERMARK, input_watermark, window, context):
                finished = self.trigger_fn.on_fire(input_watermark, window, context)
                yield self._output(window, finished, state, output_watermark, False)


class _MergingStateAdapter(_StateAdapter):
    """The adapter, finding a window by one of its ids through an index of
    the key's window ids (``by_ids``: per driver, by the ids' dict)."""

    def __init__(self, raw_state: Any, views: dict[tuple[str, int], tuple[Any, Any]],
                 by_ids: dict[int, tuple[dict, dict]]) -> None:
        super().__init__(raw_state, views)
        self._by_ids = by_ids

    def merge(self, to_be_merged: Iterable[Any], merge_result: Any) -> None:
        super().merge(to_be_merged, merge_result)
        # The merged-away windows' ids moved to the result: none may be found by its object any more.
        self._by_object.clear()

    def get_window(self, window_id: Any) -> Any:
        ids = self.window_ids
        found = self._by_ids.get(id(ids))
        if found is not None and found[0] is ids:
            window = found[1].get(window_id)
            # Merges and clears change the ids in place: an entry is checked before it is used.
            if window is not None and window_id in (self._ids(window) or ()):
                return window
        index = {i: w for w, window_ids in ids.items() for i in window_ids}
        self._by_ids[id(ids)] = (ids, index)
        if window_id not in index:
            raise ValueError(f"No window for {window_id}")
        return index[window_id]


class MergingTriggerDriver(trigger.GeneralTriggerDriver):
    """Beam's ``GeneralTriggerDriver`` for windows that merge, its timers run as the module says."""

    def __init__(self, windowing: Any, clock: Any) -> None:
        super().__init__(windowing, clock)
        self._views: dict[tuple[str, int], tuple[Any, Any]] = {}
        self._by_ids: dict[int, tuple[dict, dict]] = {}

    def process_elements(self, state: Any, windowed_values: Iterable[Any], output_watermark: Timestamp,
                         input_watermark: Timestamp = MIN_TIMESTAMP) -> Iterator[Any]:
        """Beam's ``process_elements``, in the adapter of this module, each
        window's expiry computed once and its values appended at once."""
        state = _MergingStateAdapter(state, self._views, self._by_ids)
        lateness = self.allowed_lateness
        live: dict[Any, bool] = {}
        windows_to_elements: dict[Any, list] = {}
        for wv in windowed_values:
            for window in wv.windows:
                alive = live.get(window)
                if alive is None:
                    alive = live[window] = not input_watermark > window.end + lateness
                if alive:
                    windows_to_elements.setdefault(window, []).append(wv)

        old_windows = set(state.known_windows())
        all_windows = old_windows.union(windows_to_elements)
        if all_windows != old_windows:
            merged_away: dict[Any, Any] = {}
            driver = self

            class TriggerMergeContext(window_fns.WindowFn.MergeContext):
                def merge(self, to_be_merged: Any, merge_result: Any) -> None:
                    for window in to_be_merged:
                        if window != merge_result:
                            merged_away[window] = merge_result
                            # Pane indexes are not kept across merges.
                            state.clear_state(window, driver.INDEX)
                            state.clear_state(window, driver.NONSPECULATIVE_INDEX)
                    state.merge(to_be_merged, merge_result)
                    driver.trigger_fn.on_merge(to_be_merged, merge_result, state.at(merge_result, driver.clock))

            self.window_fn.merge(TriggerMergeContext(all_windows))
            merged: dict[Any, list] = {}
            for window, elements in windows_to_elements.items():
                while window in merged_away:
                    window = merged_away[window]
                merged.setdefault(window, []).extend(elements)
            windows_to_elements = merged
            for window in merged_away:
                state.clear_state(window, self.WATERMARK_HOLD)

        # As in NonMergingTriggerDriver: the end-of-window hold reads no timestamps.
        by_time = not isinstance(self.timestamp_combiner_impl, timeutil.DependsOnlyOnWindow)
        for window, elements in windows_to_elements.items():
            if state.get_state(window, self.TOMBSTONE):
                continue
            _add_hold(self, state, window, elements, output_watermark, by_time)
            context = state.at(window, self.clock)
            values = [wv.value for wv in elements]
            # No trigger reads the elements' state: they are added before the trigger sees them.
            state.add_all(window, self.ELEMENTS, values)
            for value in values:
                self.trigger_fn.on_element(value, window, context)
            if self.trigger_fn.should_fire(TimeDomain.WATERMARK, input_watermark, window, context):
                finished = self.trigger_fn.on_fire(input_watermark, window, context)
                yield self._output(window, finished, state, output_watermark, False)

    def process_timer(self, window_id: Any, name: str, time_domain: Any, timestamp: Timestamp, state: Any,
                      input_watermark: Timestamp | None = None) -> Iterator[Any]:
        """Beam's ``process_timer``, in the adapter of this module."""
        if input_watermark is None:
            input_watermark = timestamp
        state = _MergingStateAdapter(state, self._views, self._by_ids)
        window = state.get_window(window_id)
        if state.get_state(window, self.TOMBSTONE):
            return
        if time_domain not in (TimeDomain.WATERMARK, TimeDomain.REAL_TIME):
            raise ValueError(f"Unexpected time domain: {time_domain}")
        # Beam checks that the window is among the key's windows: get_window found it there.
        context = state.at(window, self.clock)
        if self.trigger_fn.should_fire(time_domain, timestamp, window, context):
            finished = self.trigger_fn.on_fire(timestamp, window, context)
            yield self._output(window, finished, state, timestamp, time_domain == TimeDomain.WATERMARK)
