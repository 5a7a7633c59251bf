"""Beam's Reshuffle on SparkRunner, each element as Beam's expansion gives it back: in batch,
one native step dealing the elements over the tasks; in streaming, Beam's
expansion with its grouping passing each key's values through."""
from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import trigger, window
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue
from hypothesis import given, settings
from hypothesis import strategies as st
from pipeline_outputs import keyed_test_stream, spark_equals_direct, streaming_equals_direct

from beam_ext.runner import SparkRunner
from beam_ext.runner._element_batches import BATCH, Columns, Marker, Same, windowed
from beam_ext.runner.native import RESHUFFLE_URN
from beam_ext.runner.native._reshuffle import deal
from beam_ext.runner.planning import plan_pipeline


def _described(value, ts=beam.DoFn.TimestampParam, w=beam.DoFn.WindowParam, pane=beam.DoFn.PaneInfoParam):
    yield repr(value), int(ts.micros), repr(w), repr(pane)


def _stamped(p, n: int = 60):
    return (p | beam.Create(range(n), reshuffle=False)
            | "Stamp" >> beam.Map(lambda x: window.TimestampedValue(x, x)))


class _CountedCalls(beam.DoFn):
    """Counts its calls: a DoFn not reading its window is called once for all of an element's windows."""

    def __init__(self):
        self.calls = Metrics.counter("reshuffle_test", "calls")

    def process(self, x):
        self.calls.inc()
        yield x


class _AtMinWithPane(beam.DoFn):
    """Outputs each element at the minimum timestamp with an on-time pane: Beam's
    Reshuffle in the default windowing gives such an element back with the unknown pane."""

    def process(self, x):
        yield WindowedValue(x, MIN_TIMESTAMP, (window.GlobalWindow(),),
                            PaneInfo(True, True, PaneInfoTiming.ON_TIME, 0, 0))


@pytest.mark.parametrize("windowing", ["global", "fixed", "sliding", "sessions_grouped", "early_panes", "min_pane"])
def test_a_reshuffle_gives_each_element_as_beams_expansion_does(spark, tmp_path, windowing):
    def build(p):
        if windowing == "min_pane":
            values = p | beam.Create(range(20), reshuffle=False) | beam.ParDo(_AtMinWithPane())
        elif windowing == "global":
            values = _stamped(p)
        elif windowing == "fixed":
            values = _stamped(p) | beam.WindowInto(window.FixedWindows(7))
        elif windowing == "sliding":
            values = _stamped(p) | beam.WindowInto(window.SlidingWindows(10, 3))
        elif windowing == "sessions_grouped":
            values = (_stamped(p) | beam.Map(lambda x: (x % 3, x)) | beam.WindowInto(window.Sessions(2))
                      | beam.GroupByKey() | beam.MapTuple(lambda k, vs: (k, sorted(vs))))
        else:
            values = (_stamped(p) | beam.Map(lambda x: (x % 2, x))
                      | beam.WindowInto(window.FixedWindows(30), trigger=trigger.AfterWatermark(
                          early=trigger.AfterCount(4)), accumulation_mode=trigger.AccumulationMode.DISCARDING)
                      | beam.GroupByKey() | beam.MapTuple(lambda k, vs: (k, sorted(vs))))
        return values | beam.Reshuffle() | beam.ParDo(_described)

    got = spark_equals_direct(build, tmp_path)
    assert len(got) == {"global": 60, "fixed": 60, "sliding": 200, "min_pane": 20}.get(windowing, len(got)) > 0
    p = beam.Pipeline()
    build(p)
    assert [s.native.urn for s in plan_pipeline(p.to_runner_api(), 1 << 20, 2).stages
            if s.native is not None and s.label == "Reshuffle"] == [RESHUFFLE_URN]


@pytest.mark.parametrize("windowing", ["global", "fixed", "sliding", "early_panes"])
def test_a_reshuffle_in_streaming_gives_each_element_and_later_panes_as_the_direct_runner(
        spark, tmp_path, windowing):
    """In streaming the grouping inside Beam's Reshuffle hands each key's
    values of a micro-batch on without Beam's trigger driver: each element
    still leaves with its timestamp, windows and pane, and a grouping after
    the Reshuffle fires the panes it fires on the DirectRunner, late values
    dropped alike (4 at 5 s, behind the watermark at 10 s)."""
    events = [("elements", [("a", 1, 1), ("b", 2, 2), ("a", 3, 12)]), ("watermark", 10),
              ("elements", [("a", 4, 5), ("b", 5, 25), ("b", 6, 14)]), ("watermark", 30),
              ("elements", [("a", 7, 31), ("a", 8, 33)])]

    def build(p):
        values = p | keyed_test_stream(events)
        if windowing == "fixed":
            values = values | beam.WindowInto(window.FixedWindows(10))
        elif windowing == "sliding":
            values = values | beam.WindowInto(window.SlidingWindows(20, 10))
        elif windowing == "early_panes":
            values = (values | beam.WindowInto(window.FixedWindows(30), trigger=trigger.AfterWatermark(
                early=trigger.AfterCount(1)), accumulation_mode=trigger.AccumulationMode.DISCARDING,
                # Whole seconds: Beam's coder of the windowed values inside the
                # Reshuffle keeps milliseconds, a window's end has microseconds.
                timestamp_combiner=window.TimestampCombiner.OUTPUT_AT_EARLIEST)
                | beam.GroupByKey() | beam.MapTuple(lambda k, vs: (k, sum(vs))))
        reshuffled = values | beam.Reshuffle()
        grouped = (reshuffled | "Tens" >> beam.WindowInto(window.FixedWindows(10)) | "Again" >> beam.GroupByKey()
                   | beam.MapTuple(lambda k, vs: ("grouped", k, sorted(vs))))
        return ([pcoll | f"Described{i}" >> beam.ParDo(_described)
                 | f"Global{i}" >> beam.WindowInto(window.GlobalWindows())
                 for i, pcoll in enumerate((reshuffled, grouped))] | beam.Flatten())

    got = streaming_equals_direct(build, tmp_path)
    assert len(got) > {"global": 11, "fixed": 11, "sliding": 19, "early_panes": 6}[windowing]
    p = beam.Pipeline(options=PipelineOptions(["--streaming"]))
    build(p)
    assert [g.passes_through for g in plan_pipeline(p.to_runner_api(), 1 << 20, 2, streaming=True).groups.values()
            if g.step.startswith("Reshuffle")] == [True]


def test_an_element_in_several_windows_is_processed_once_per_window_after_it(spark):
    def calls(runner) -> int:
        p = beam.Pipeline(runner=runner)
        _ = (_stamped(p, 30) | beam.WindowInto(window.SlidingWindows(10, 5)) | beam.Reshuffle()
             | beam.ParDo(_CountedCalls()))
        result = p.run()
        result.wait_until_finish()
        [counter] = result.metrics().query(MetricsFilter().with_name("calls"))["counters"]
        return counter.committed

    assert calls(SparkRunner()) == calls(FnApiRunner()) == 60


def test_a_few_elements_are_spread_over_every_task(spark):
    from pyspark import TaskContext

    with beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(["--spark_parallelism", "3"])) as p:
        tasks = (p | beam.Create(range(10), reshuffle=False) | beam.FlatMap(lambda s: [s] * 3)
                 | beam.Reshuffle() | beam.Map(lambda x: TaskContext.get().partitionId())
                 | beam.combiners.Count.PerElement())
        # 30 elements in one task before, dealt one by one over three.
        assert_that(tasks, equal_to([(0, 10), (1, 10), (2, 10)]))


_TEMPLATES = [WindowedValue(None, MIN_TIMESTAMP, (window.GlobalWindow(),)),
              WindowedValue(None, 5, (window.IntervalWindow(0, 10), window.IntervalWindow(5, 15))),
              WindowedValue(None, MIN_TIMESTAMP, (window.GlobalWindow(),),
                            PaneInfo(True, False, PaneInfoTiming.EARLY, 0, -1))]


@st.composite
def _batches(draw):
    batches, counter = [], 0
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["same", "list", "columns", "marker"]))
        size = draw(st.integers(1, 3 * BATCH // 2))
        values = list(range(counter, counter + size))
        counter += size
        if kind == "marker":
            batches.append(Marker("BUNDLE_END"))
        elif kind == "columns":
            batches.append(Columns(((("v", values),),), "value", size))
        elif kind == "same":
            batches.append(Same(draw(st.sampled_from(_TEMPLATES)), values))
        else:
            batches.append([draw(st.sampled_from(_TEMPLATES)).with_value(v) for v in values])
    return batches


@settings(max_examples=200, deadline=None)
@given(batches=_batches(), partitions=st.integers(1, 5), index=st.integers(0, 4),
       default_windowing=st.booleans())
def test_deal_sends_each_element_once_round_robin(batches, partitions, index, default_windowing):
    def per_window(wv):
        if default_windowing:
            if wv.timestamp == MIN_TIMESTAMP:
                return [WindowedValue(wv.value, wv.timestamp, wv.windows)]
            return [wv]
        return [WindowedValue(wv.value, wv.timestamp, (w,), wv.pane_info) for w in wv.windows]

    # Each element as Beam's expansion gives it back, then dealt.
    elements = [e for b in batches if type(b) is not Marker for wv in windowed(b) for e in per_window(wv)]
    out: dict[int, list] = {t: [] for t in range(partitions)}
    for target, batch in deal(partitions, default_windowing, index, batches):
        assert 0 <= target < partitions and (type(batch) is Same or type(batch) is list)
        out[target] += windowed(batch)
    for t in range(partitions):
        # The k-th element goes to task (index + k) % partitions, in order.
        want = [wv for k, wv in enumerate(elements) if (index + k) % partitions == t]
        assert out[t] == want
