"""The partial combine in sessions merges a task's sessions before the shuffle, with Beam's results.

Oracle: Beam's ``GeneralTriggerDriver`` grouping the elements themselves
into sessions, each session's values combined by the ``CombineFn``; against
it, the partial combine's accumulators grouped by the same driver (as the
grouping after the shuffle does) and merged. Also a sessions
``CombinePerKey`` on SparkRunner against DirectRunner.
"""
from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.internal import pickler
from apache_beam.metrics.execution import MetricsContainer
from apache_beam.transforms import combiners, core, trigger, window
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pipeline_outputs import spark_equals_direct

from beam_ext.runner import _element_batches as element_batches
from beam_ext.runner.worker import _direct
from beam_ext.runner.worker._partial_sessions import PartialSessions, merges_partially

GAP = 10
SESSIONS = core.Windowing(window.Sessions(GAP))
COMBINE_FNS = {
    "sum": core.CombineFn.maybe_from_callable(sum),
    "mean": combiners.MeanCombineFn(),
    "top": combiners.TopCombineFn(2),
    "count": combiners.CountCombineFn(),
}
# Whole seconds too, so windows that only touch (one ends as the next starts,
# and stay apart) are common.
EVENTS = st.lists(st.tuples(st.integers(0, 2), st.integers(-50, 50), st.one_of(
    st.integers(-30, 60).map(lambda seconds: seconds * 1_000_000), st.integers(-30_000_000, 60_000_000))),
    max_size=50)
# A key's windows [0, 10), [10, 20) and [25, 35), [30, 40): the first two only
# touch and stay two sessions; the last two merge.
TOUCHING = [(0, 1, 0), (0, 2, 10_000_000), (0, 3, 25_000_000), (0, 4, 30_000_000)]


def _elements(events) -> list:
    out = []
    for key, value, micros in events:
        ts = Timestamp(micros=micros)
        out.append(WindowedValue((key, value), ts, tuple(SESSIONS.windowfn.assign(
            window.WindowFn.AssignContext(ts, (key, value))))))
    return out


def _sessions(elements, fn, accumulators: bool) -> dict:
    """(key, window) -> output, grouped by Beam's driver; ``accumulators``:
    the values are accumulators to merge, not inputs to add."""
    by_key: dict = {}
    for wv in elements:
        by_key.setdefault(wv.value[0], []).append(WindowedValue(wv.value[1], wv.timestamp, wv.windows))
    out = {}
    for key, values in by_key.items():
        for pane in trigger.GeneralTriggerDriver(SESSIONS, None).process_entire_key(key, values):
            grouped = list(pane.value[1])
            acc = fn.merge_accumulators(grouped) if accumulators else fn.add_inputs(fn.create_accumulator(), grouped)
            out[key, pane.windows[0]] = fn.extract_output(acc)
    return out


def _in_batches(elements, sizes):
    """``elements`` cut into batches of ``sizes`` (cycled), as the task hands them over."""
    batches, i, n = [], 0, 0
    while i < len(elements):
        size = sizes[n % len(sizes)]
        batches.append(element_batches.as_batch(elements[i:i + size]))
        i, n = i + size, n + 1
    return batches


@pytest.mark.parametrize("name", sorted(COMBINE_FNS))
@settings(max_examples=60, deadline=None)
@given(events=EVENTS, sizes=st.lists(st.integers(1, 9), min_size=1, max_size=4),
       held=st.sampled_from([1, 3, 7, 10_000]))
@example(events=TOUCHING, sizes=[9], held=10_000)
def test_partial_sessions_merged_after_the_shuffle_equal_beams_sessions(name, events, sizes, held):
    fn = COMBINE_FNS[name]
    elements = _elements(events)
    partial = PartialSessions(fn.create_accumulator, fn.add_inputs, fn.compact, held=held)
    out = [wv for batch in _in_batches(elements, sizes) for wv in partial.add(batch)] + partial.flush()
    assert partial.flush() == []  # nothing held after a flush
    assert len(out) <= len(elements)
    assert all(len(wv.windows) == 1 and wv.timestamp == wv.windows[0].max_timestamp() for wv in out)
    if held >= len(elements):
        # One flush: a key's sessions are fully merged, so none overlap.
        for key in {wv.value[0] for wv in out}:
            spans = sorted((wv.windows[0].start, wv.windows[0].end) for wv in out if wv.value[0] == key)
            assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))
    assert _sessions(out, fn, accumulators=True) == _sessions(elements, fn, accumulators=False)


@settings(max_examples=40, deadline=None)
@given(events=EVENTS, sizes=st.lists(st.integers(1, 9), min_size=1, max_size=4),
       held=st.sampled_from([1, 3, 10_000]), copies=st.integers(1, 3))
@example(events=TOUCHING, sizes=[9], held=10_000, copies=1)
def test_partial_sessions_of_elements_not_yet_windowed_equal_beams_sessions(events, sizes, held, copies):
    # The WindowInto folded in: elements in the windows they had before (one
    # copy per window, as Beam's AssignWindows outputs them), each put in the
    # session from its timestamp to timestamp + gap.
    fn = COMBINE_FNS["sum"]
    before = window.SlidingWindows(copies, 1) if copies > 1 else window.GlobalWindows()
    elements, unwindowed = [], []
    for wv in _elements(events):
        windows = tuple(before.assign(window.WindowFn.AssignContext(wv.timestamp)))
        assert len(windows) == copies
        unwindowed.append(WindowedValue(wv.value, wv.timestamp, windows))
        elements += [wv] * copies
    partial = PartialSessions(fn.create_accumulator, fn.add_inputs, fn.compact, held=held, gap=GAP * 1_000_000)
    out = [wv for batch in _in_batches(unwindowed, sizes) for wv in partial.add(batch)] + partial.flush()
    assert all(len(wv.windows) == 1 and wv.timestamp == wv.windows[0].max_timestamp() for wv in out)
    assert _sessions(out, fn, accumulators=True) == _sessions(elements, fn, accumulators=False)


@settings(max_examples=40, deadline=None)
@given(events=EVENTS, size=st.integers(1, 9))
def test_the_partial_combine_step_merges_sessions(events, size):
    # Through the step as a task runs it: batches of elements with their own
    # windows, and of elements sharing one (the same timestamp).
    fn = COMBINE_FNS["sum"]
    combine = _direct.DirectCombine("Sum/Precombine", pickler.dumps((fn, [], {})), SESSIONS)
    elements = _elements(events + [(1, v, 5_000_000) for v in range(size)])
    out = [wv for batch in _direct._precombine(
        combine, _direct._Tracker(), _direct._State(MetricsContainer("t")), iter(_in_batches(elements, [size])))
        for wv in element_batches.windowed(batch)]
    assert len({(wv.value[0], wv.windows[0]) for wv in out}) == len(out)
    assert _sessions(out, fn, accumulators=True) == _sessions(elements, fn, accumulators=False)


@pytest.mark.parametrize("windowing,merges", [
    (SESSIONS, True),
    (core.Windowing(type("MySessions", (window.Sessions,), {})(GAP)), False),  # may merge otherwise
    (core.Windowing(window.Sessions(GAP), timestamp_combiner=window.TimestampCombiner.OUTPUT_AT_EARLIEST), False),
    (core.Windowing(window.Sessions(GAP), triggerfn=trigger.AfterWatermark(late=trigger.AfterCount(1)),
                    accumulation_mode=trigger.AccumulationMode.DISCARDING), False),
    (core.Windowing(window.FixedWindows(GAP)), False),
], ids=["sessions", "subclass", "earliest", "late_firings", "fixed"])
def test_only_beams_sessions_at_the_end_of_the_window_merge_partially(windowing, merges):
    assert merges_partially(windowing) is merges


@pytest.mark.parametrize("between", [False, True], ids=["window_into_folded_in", "a_map_between"])
def test_a_sessions_combine_equals_direct_runner(spark, tmp_path, between):
    # Runs of a key's events 3 s apart, runs 20 s apart, spread over the
    # input's partitions, so each session's events are partly merged in
    # several tasks before the shuffle. The WindowInto is folded into the
    # combine, or kept (a step between).
    def build(p):
        events = (p | beam.Create([(k, i) for i in range(600) for k in "abcd"])
                  | beam.Reshuffle()
                  | beam.Map(lambda kv: window.TimestampedValue(kv, kv[1] * 3 + kv[1] // 7 * 20))
                  | beam.WindowInto(window.Sessions(10)))
        if between:
            events = events | "Between" >> beam.Map(lambda kv: kv)
        return (events
                | beam.CombinePerKey(combiners.MeanCombineFn())
                | beam.Map(lambda kv, w=beam.DoFn.WindowParam, t=beam.DoFn.TimestampParam:
                           (kv[0], kv[1], repr(w), float(t))))
    out = spark_equals_direct(build, tmp_path)
    assert len(out) == 4 * 86  # 600 events in runs of 7: 86 sessions per key
