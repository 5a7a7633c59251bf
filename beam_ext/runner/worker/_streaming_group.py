"""GroupByKey in streaming: panes from Beam's trigger driver, state kept per key between batches.

This is the Python DirectRunner's streaming GroupAlsoByWindow
(``_StreamingGroupAlsoByWindowEvaluator``) inside a Spark task: one
``InMemoryUnmergedState`` per key, Beam's ``GeneralTriggerDriver`` deciding
panes (in windows that do not merge, the same driver doing part of its
per-element work once per window: :mod:`._trigger_driver`), elements processed under
the input watermark the group had before this batch, then timers (end of
window, garbage collection, processing-time triggers) fired under the new
one; a key new in the batch whose windows all close in it gets its panes
without the driver (:class:`_ClosingKeys`), a ``Reshuffle``'s keys pass
through (:func:`_passed_through`). The per-key states of a partition are
saved as one version per batch, like a stage's (:mod:`._streaming`). The
panes are encoded for the stage that reads them, or, where the executor runs
that stage in the same task (:func:`run_grouped_chain`), handed to its steps
as objects.
"""
from __future__ import annotations

import collections
from typing import Any, Iterable, Iterator

from apache_beam.coders.coder_impl import create_InputStream, create_OutputStream
from apache_beam.metrics import monitoring_infos
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.transforms import timeutil, trigger
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.window import GlobalWindow, IntervalWindow, Sessions, TimestampCombiner
from apache_beam.utils import windowed_value
from apache_beam.utils.timestamp import MAX_TIMESTAMP, TIME_GRANULARITY, Duration, Timestamp
from apache_beam.utils.windowed_value import create as new_windowed

from beam_ext.runner._batch_panes import ON_TIME, MergedOnTimePanes
from beam_ext.runner._element_batches import BATCH, BUNDLE_END
from beam_ext.runner._metrics import RUNNER_NAMESPACE
from beam_ext.runner._shuffle import windowed_records
from beam_ext.runner._window_sets import WindowSetCodec
from beam_ext.runner.state import _versioned as versioned
from beam_ext.runner.worker._direct import DirectChain
from beam_ext.runner.worker._setup import WorkerSetup
from beam_ext.runner.worker._streaming import BatchContext, ReportFn, TaskSummary, run_chain_on
from beam_ext.runner.worker._trigger_driver import (
    NonMergingTriggerDriver,
    expired_values,
    trigger_driver,
    watermark_hold,
)

_CHUNK_BYTES = 4 << 20


class _BatchClock:
    """Processing time as the driver fixed it for this batch (a TestStream's or the wall clock's)."""

    def __init__(self, now: Timestamp) -> None:
        self._now = float(now)

    def time(self) -> float:
        return self._now


def _freeze(state: trigger.InMemoryUnmergedState) -> tuple:
    # The state's defaultdicts hold lambdas, which do not pickle.
    return ({w: dict(t) for w, t in state.timers.items()},
            {w: dict(tags) for w, tags in state.state.items()},
            dict(state.global_state))


def _thaw(frozen: tuple, windows: _Windows) -> trigger.InMemoryUnmergedState:
    state = trigger.InMemoryUnmergedState()
    timers, tagged, global_state = frozen
    for window, table in timers.items():
        state.timers[window].update(table)
    for window, tags in tagged.items():
        state.state[window].update(tags)
    state.global_state.update(global_state)
    ids = state.global_state.get(_WINDOW_IDS)
    if ids:
        state.global_state[_WINDOW_IDS] = {windows.one(window): window_ids for window, window_ids in ids.items()}
    return state


_WINDOW_IDS = trigger.MergeableStateAdapter.WINDOW_IDS.tag


class _Windows:
    """One object per distinct window in a task.

    Beam's trigger driver finds a window's state by looking the window up in
    a dict (its ``MergeableStateAdapter``'s window ids) at every state
    access. Beam's ``IntervalWindow`` hashes and compares by reading
    ``MIN_TIMESTAMP.micros`` and ``MAX_TIMESTAMP.micros``, Python properties,
    each time, so a lookup with an equal window from another element costs
    a hash and a comparison; with the very object that is the key, Python's
    dict skips the comparison. Equal windows are interchangeable, so the
    state, timers and panes are unchanged.
    """

    def __init__(self) -> None:
        self._singles: dict[tuple[int, int], tuple] = {}  # (start, end) -> (the window,)

    def one(self, window: Any) -> Any:
        return self.of((window,))[0]

    def of(self, windows: tuple) -> tuple:
        """``windows`` (an element's), as the task's objects; the tuple too, for a single window."""
        if len(windows) != 1:
            return tuple(map(self.one, windows))
        window = windows[0]
        if type(window) is not IntervalWindow:
            return windows
        return self._singles.setdefault((window._start_micros, window._end_micros), windows)


def _reach(windowing: Any) -> Duration | None:
    """How long after its end a window of ``windowing`` can still take an
    element, or merge with one's window: the allowed lateness, and for
    sessions the gap too; None for other windows that merge."""
    windowfn = windowing.windowfn
    if not windowfn.is_merging():
        return windowing.allowed_lateness
    if isinstance(windowfn, Sessions):
        return windowing.allowed_lateness + windowfn.gap_size
    return None


def _forget_unreachable(state: trigger.InMemoryUnmergedState, watermark: Timestamp, reach: Duration) -> None:
    """Drops a key's windows no element can reach any more: ended more than
    ``reach`` before ``watermark``, no timer pending, no hold.

    Beam's Python driver keeps a fired window's pane counts and id as long as
    the key lives (its garbage collection is a to-do), so a key's state
    would grow by a window per window fired, saved again at every batch. The
    next batches' elements run under ``watermark`` or later: the driver drops
    an element whose window ended more than the allowed lateness before it
    without reading any state, and a session that could merge with a dropped
    one would start no later than that one's end, within the gap, so it is
    dropped as well. The panes are Beam's.
    """
    ids = state.global_state.get(_WINDOW_IDS)
    if not ids:
        return
    for window_id in [i for i, timers in state.timers.items() if not timers]:
        del state.timers[window_id]  # fired and cleared: the defaultdict keeps the empty table
    pending = set(state.timers)
    for window in [w for w in ids if watermark > w.end + reach]:
        window_ids = ids[window]
        if any(i in pending or state.state.get(i, {}).get("watermark") for i in window_ids):
            continue
        for window_id in window_ids:
            state.state.pop(window_id, None)
            state.timers.pop(window_id, None)
        del ids[window]
    if not ids:
        del state.global_state[_WINDOW_IDS]


# The pane Beam's driver fires for a key's first values under Always(),
# discarding: a key passing through keeps no state, so every pane is its first.
_FIRST_PANE = windowed_value.PaneInfo(True, False, windowed_value.PaneInfoTiming.EARLY, 0, -1)


def _passed_through(group: Any, blobs: Iterable[bytes]) -> Iterator[tuple[Any, list]]:
    """A Reshuffle's grouping (``GroupSpec.passes_through``): each key's values
    of the batch, in order, as the one pane Beam's driver fires for them, at
    their earliest timestamp in the global window."""
    pre_impl = group.pre_coder.get_impl()
    key_impl = group.pre_coder.wrapped_value_coder.key_coder().get_impl()
    by_key: dict[bytes, tuple[list, list]] = {}
    for encoded_key, encoded_windows, _count, data in windowed_records(blobs):
        if encoded_windows is not None:
            raise ValueError(f"{group.step}: values gathered by window where single pairs were expected")
        wv = pre_impl.decode_nested(data)
        found = by_key.get(encoded_key)
        if found is None:
            found = by_key[encoded_key] = ([], [])
        found[0].append(wv.timestamp)
        found[1].append(wv.value[1])
    for encoded_key, (timestamps, values) in by_key.items():
        yield key_impl.decode_nested(encoded_key), [
            windowed_value.WindowedValue(values, min(timestamps), _GLOBAL_WINDOWS, _FIRST_PANE)]


_GLOBAL_WINDOWS = (GlobalWindow(),)


class _ClosingKeys:
    """The panes of a key new in a batch whose windows all close in it, without Beam's driver.

    Under the default trigger, Beam's driver given values of a key it keeps
    no state for adds them to their windows (merged first, for sessions)
    and sets each window's end-of-window timer; the timer fires once the
    input watermark reaches the window's end, giving one on-time pane of all
    the window's values at its watermark hold; once the watermark is past
    the end plus the allowed lateness (and the gap, for sessions), the
    window is forgotten (:func:`_forget_unreachable`). Where no value's
    window has expired under the batch's previous input watermark, and each
    window (merged) ends after that watermark (so nothing fires before the
    timer) and more than that reach before the new one, that is the key's
    whole run in the batch: :meth:`panes` gives those panes, and the key
    keeps no state, as it would after the driver's run. Sessions are merged
    as batch merges them (:class:`~beam_ext.runner._batch_panes.MergedOnTimePanes`),
    under the end-of-window timestamp combiner only: the one whose output
    time is the merged window's alone (under the others the driver's hold
    leaves out values behind the output watermark, batch's has none to).

    A grouping of many keys each closed in the batch that brought them (a
    ``Distinct`` or a per-key combine over a bounded read, a backlog caught
    up) otherwise pays the driver's state, timer and pane bookkeeping per key.
    """

    def __init__(self, windowing: Any, previous_watermark: Timestamp, watermark: Timestamp,
                 output_watermark: Timestamp) -> None:
        self._combiner = TimestampCombiner.get_impl(windowing.timestamp_combiner, windowing.windowfn)
        self._by_time = not isinstance(self._combiner, timeutil.DependsOnlyOnWindow)
        self._previous, self._watermark = previous_watermark, watermark
        self._lateness = windowing.allowed_lateness
        self._reach = _reach(windowing)
        self._output_watermark = output_watermark
        self._sessions = MergedOnTimePanes(windowing) if windowing.windowfn.is_merging() else None
        # window -> whether it closes in the batch, and its output time in
        # microseconds where that depends on the window alone (else None).
        self._windows: dict[Any, tuple[bool, int | None]] = {}

    @staticmethod
    def of(windowing: Any, previous_watermark: Timestamp, watermark: Timestamp,
           output_watermark: Timestamp) -> _ClosingKeys | None:
        """For a grouping of ``windowing`` in a batch moving its input
        watermark from ``previous_watermark`` to ``watermark``, its output
        watermark at ``output_watermark``; None where it does not apply."""
        if windowing.triggerfn != trigger.DefaultTrigger():
            return None
        windowfn = windowing.windowfn
        if windowfn.is_merging() and not (type(windowfn) is Sessions
                                          and windowing.timestamp_combiner == TimestampCombiner.OUTPUT_AT_EOW):
            return None
        return _ClosingKeys(windowing, previous_watermark, watermark, output_watermark)

    def _closes(self, end: Timestamp) -> bool:
        return self._previous < end and self._watermark > end + self._reach

    def _window(self, window: Any) -> tuple[bool, int | None]:
        found = self._windows.get(window)
        if found is None:
            closes = self._closes(window.end)
            at = None
            if closes and not self._by_time:
                hold = watermark_hold(self._combiner, window, None, self._output_watermark)
                at = (window.max_timestamp() if hold is None else hold).micros
            found = self._windows[window] = (closes, at)
        return found

    def panes(self, values: Iterable[Any], records: Iterable[tuple[tuple, list]]) -> list | None:
        """The key's panes, as Beam's driver fires them, for its windowed
        ``values`` and gathered ``records`` (as ``process_elements`` takes
        them); None where a window of theirs does not close in the batch."""
        if self._sessions is not None:
            return self._session_panes(values)
        by_time = self._by_time
        # window -> (values, their timestamps where the hold reads them), in arrival order
        by_window: dict[Any, tuple[list, list]] = {}

        def entry_of(window: Any) -> tuple[list, list] | None:
            """The window's entry; None if it does not close in the batch."""
            entry = by_window.get(window)
            if entry is None and self._window(window)[0]:
                entry = by_window[window] = ([], [])
            return entry

        last, last_entry = None, None  # consecutive values mostly share their window object
        for wv in values:
            for window in wv.windows:
                entry = last_entry if window is last else entry_of(window)
                if entry is None:
                    return None
                entry[0].append(wv.value)
                if by_time:
                    entry[1].append(wv.timestamp)  # a new Timestamp at each read
                last, last_entry = window, entry
        for windows, gathered in records:
            for window in windows:
                entry = entry_of(window)
                if entry is None:
                    return None
                entry[0].extend(gathered)
        panes = []
        for window, (grouped, timestamps) in by_window.items():
            at = self._windows[window][1]
            if at is not None:
                panes.append(new_windowed(grouped, at, (window,), ON_TIME))
                continue
            hold = watermark_hold(self._combiner, window, timestamps, self._output_watermark)
            panes.append(windowed_value.WindowedValue(
                grouped, window.max_timestamp() if hold is None else hold, (window,), ON_TIME))
        return panes

    def _session_panes(self, values: list) -> list | None:
        ends = [window._end_micros for wv in values for window in wv.windows]
        # A value whose own session ended more than the lateness before the
        # previous watermark is dropped before any merge: counted, by the
        # driver. The last merged session ends with the last value's: while
        # it is open (a stream keeping up) nothing is merged here.
        if (self._previous.micros > min(ends) + self._lateness.micros
                or self._watermark.micros <= max(ends) + self._reach.micros):
            return None
        panes = []
        for pane in self._sessions.process_entire_key(None, values):
            if not self._closes(pane.windows[0].end):
                return None
            panes.append(pane.with_value(pane.value[1]))
        return panes


def run_streaming_group(group: Any, context: BatchContext, previous_output_watermark: Timestamp,
                        report: ReportFn, partition: int, blobs: Iterable[bytes]) -> Iterator[bytes]:
    """Groups one shuffled partition of one batch; yields encoded chunks of panes, reports a summary."""
    out_impl = group.post_coder.get_impl()
    out = create_OutputStream()
    written = 0
    summary = TaskSummary()
    for key, panes in _panes_by_key(group, context, previous_output_watermark, partition, blobs, summary):
        for pane in panes:
            out_impl.encode_to_stream(pane.with_value((key, pane.value)), out, True)
        if out.size() >= _CHUNK_BYTES:
            written += out.size()
            yield out.get()
            out = create_OutputStream()
    if out.size():
        written += out.size()
        yield out.get()
    if written:
        summary.output_bytes = {0: written}
    report(partition, summary)


def run_grouped_chain(group: Any, context: BatchContext, previous_output_watermark: Timestamp,
                      group_report: ReportFn, chain: DirectChain, setup: WorkerSetup | None, bundle_bytes: int,
                      side_inputs: list[list[bytes]] | None, chain_report: ReportFn, partition: int,
                      blobs: Iterable[bytes]) -> Iterator[tuple[int, Any]]:
    """Groups one shuffled partition of one batch and runs the grouping's one
    reader, a stage of steps on element objects that keeps nothing between
    batches, on its panes in the same task: the panes are never encoded.
    ``side_inputs``: the reader's, as :func:`run_streaming_chain` takes them.

    Yields and reports what :func:`run_streaming_chain` does for the reader;
    reports the grouping's summary as :func:`run_streaming_group` does (with
    no output bytes: the grouping has no output of its own to read).
    """
    summary = TaskSummary()
    panes = _panes_by_key(group, context, previous_output_watermark, partition, blobs, summary)
    yield from run_chain_on(chain, setup, _pane_batches(panes, group, bundle_bytes if chain.sees_bundles() else 0),
                            side_inputs, chain_report, partition)
    group_report(partition, summary)


def _pane_batches(panes: Iterator[tuple[Any, list]], group: Any, bundle_bytes: int) -> Iterator[Any]:
    """The grouped elements of ``panes`` as the reader's input: lists of at
    most ``BATCH`` ``WindowedValue``s of ``(key, values)``.

    With ``bundle_bytes``, a :data:`BUNDLE_END` between two bundles, each
    closed once its values reach about that many encoded bytes, as Beam's
    bundle processor cuts its input (none left empty at the end); the size
    is estimated from the first values' encodings, so that no pane is
    encoded whole.
    """
    value_impl = group.pre_coder.wrapped_value_coder.value_coder().get_impl()
    per_value = None
    batch: list = []
    size = 0
    ended = False
    for key, key_panes in panes:
        for pane in key_panes:
            if ended:
                yield BUNDLE_END
                ended = False
            # A list of its own: the trigger's state may still hold the pane's (accumulating panes).
            values = list(pane.value)
            if bundle_bytes and values:
                if per_value is None:
                    sample = values[:16]
                    per_value = max(1, sum(value_impl.estimate_size(v, True) for v in sample) // len(sample))
                size += per_value * len(values)
            batch.append(pane.with_value((key, values)))
            if bundle_bytes and size >= bundle_bytes:
                yield batch
                batch, size, ended = [], 0, True
            elif len(batch) == BATCH:
                yield batch
                batch = []
    if batch:
        yield batch


def _panes_by_key(group: Any, context: BatchContext, previous_output_watermark: Timestamp, partition: int,
                  blobs: Iterable[bytes], summary: TaskSummary) -> Iterator[tuple[Any, list]]:
    """Each key's panes of one shuffled partition of one batch, as ``(key,
    panes)``: the elements', then the timers'. Once exhausted, the partition's
    state is saved as this batch's version and ``summary`` is complete."""
    if group.passes_through:
        yield from _passed_through(group, blobs)
        versioned.write(context.state_root, context.owner, partition, context.batch, {})
        return
    saved = versioned.read(context.state_root, context.owner, partition, context.read_version) \
        if context.read_version is not None else None
    windows = _Windows()
    states = {key: _thaw(frozen, windows) for key, frozen in (saved or {}).items()}
    driver = trigger_driver(group.windowing, _BatchClock(context.processing_time))
    pre_impl = group.pre_coder.get_impl()
    key_impl = group.pre_coder.wrapped_value_coder.key_coder().get_impl()

    # Late values dropped: ours counts them; Beam's driver (merging windows) does not.
    counts_elsewhere, dropped = not isinstance(driver, NonMergingTriggerDriver), 0
    by_key: dict[bytes, list] = collections.defaultdict(list)
    gathered: dict[bytes, list] = collections.defaultdict(list)  # (windows, values) records, by key
    # Each distinct encoding decoded once, as the task's window objects.
    decode_windows = WindowSetCodec(group.pre_coder.window_coder, windows.of).decode
    value_impl = group.pre_coder.wrapped_value_coder.value_coder().get_impl()
    for encoded_key, encoded_windows, count, data in windowed_records(blobs):
        if encoded_windows is None:
            wv = pre_impl.decode_nested(data)
            value = wv.with_value(wv.value[1])
            value.windows = windows.of(value.windows)
            by_key[encoded_key].append(value)
        else:
            stream = create_InputStream(data)
            decode = value_impl.decode_from_stream
            gathered[encoded_key].append((decode_windows(encoded_windows), [decode(stream, True)
                                                                            for _ in range(count)]))
    closing = _ClosingKeys.of(group.windowing, context.previous_watermark, context.watermark,
                              previous_output_watermark)
    for encoded_key in dict.fromkeys([*by_key, *gathered]) if gathered else by_key:
        state = states.get(encoded_key)
        if state is None:
            panes = closing.panes(by_key.get(encoded_key, ()), gathered.get(encoded_key, ())) if closing else None
            if panes is not None:
                yield key_impl.decode_nested(encoded_key), panes
                continue
            state = states[encoded_key] = trigger.InMemoryUnmergedState()
        key = key_impl.decode_nested(encoded_key)
        records = gathered.get(encoded_key)
        if counts_elsewhere and encoded_key in by_key:
            dropped += expired_values(group.windowing, by_key[encoded_key], context.previous_watermark)
        values = by_key.get(encoded_key, ())
        # Only our driver takes gathered records (GroupSpec.by_window).
        panes = (driver.process_elements(state, values, previous_output_watermark, context.previous_watermark,
                                         gathered=records) if records else
                 driver.process_elements(state, values, previous_output_watermark, context.previous_watermark))
        yield key, panes
    now = float(context.processing_time)
    for encoded_key, state in states.items():
        key = None
        while True:
            fired, _ = state.get_timers(clear=True, watermark=context.watermark, processing_time=now)
            if not fired:
                break
            if key is None:
                key = key_impl.decode_nested(encoded_key)
            for window, (name, domain, timestamp, _tag) in fired:
                yield key, driver.process_timer(window, name, domain, timestamp, state, context.watermark)
    dropped += 0 if counts_elsewhere else driver.dropped
    if dropped:
        # As Beam's Java runners count droppedDueToLateness: per value and window.
        summary.metrics.append(beam_fn_api_pb2.ProcessBundleResponse(monitoring_infos=[
            monitoring_infos.int64_user_counter(RUNNER_NAMESPACE, "dropped_due_to_lateness", dropped,
                                                ptransform=group.step)]).SerializeToString())
    kept = {}
    reach = _reach(group.windowing)
    for encoded_key, state in states.items():
        if reach is not None:
            _forget_unreachable(state, context.watermark, reach)
        if not state.state and not state.timers and not state.global_state:
            continue  # the key's windows are all done: nothing to keep
        kept[encoded_key] = _freeze(state)
        summary.hold = min(summary.hold, state.get_earliest_hold())
        # Each window's hold, as get_earliest_hold computes the earliest one.
        summary.holds |= {min(tags["watermark"]) - TIME_GRANULARITY
                          for tags in state.state.values() if tags.get("watermark")}
        for timers in state.timers.values():
            for (_name, domain, _tag), timestamp in timers.items():
                if domain == TimeDomain.REAL_TIME:
                    summary.next_processing_timer = min(
                        summary.next_processing_timer, Timestamp.of(timestamp))
                else:
                    summary.next_event_timer = min(summary.next_event_timer, Timestamp.of(timestamp))
    versioned.write(context.state_root, context.owner, partition, context.batch, kept)
    if summary.hold > MAX_TIMESTAMP:
        summary.hold = MAX_TIMESTAMP
