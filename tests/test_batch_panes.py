"""A batch GroupByKey's panes: the fast drivers against Beam's own.

Oracle: Beam's ``GeneralTriggerDriver`` (what ``create_trigger_driver(windowing,
is_batch=True)`` gives these windowings) on the same key and values: the
same panes, with the same windows, values in the same order, timestamps and
pane infos; under other triggers, in the same order too.
"""
from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.transforms import trigger, window
from apache_beam.transforms.core import Windowing
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from pipeline_outputs import spark_equals_direct

from beam_ext.runner._batch_panes import MergedOnTimePanes, OnTimePanes, pane_driver
from beam_ext.runner.worker._trigger_driver import MergingTriggerDriver


class _Sessions(window.Sessions):
    """Merged through its own ``merge``, not the integer copy of ``Sessions.merge``."""


WINDOW_FNS = {
    "fixed": window.FixedWindows(5),
    "fixed_offset": window.FixedWindows(7, offset=3),
    "sliding": window.SlidingWindows(6, 2),
    "global": window.GlobalWindows(),
    "sessions": window.Sessions(10),
    "sessions_subclass": _Sessions(10),
}
COMBINERS = [window.TimestampCombiner.OUTPUT_AT_EOW, window.TimestampCombiner.OUTPUT_AT_EARLIEST,
             window.TimestampCombiner.OUTPUT_AT_LATEST]


def _panes(driver, key, values) -> list:
    return sorted(((repr(wv.windows), wv.value, wv.timestamp.micros, repr(wv.pane_info))
                   for wv in driver.process_entire_key(key, values)), key=repr)


@settings(max_examples=200, deadline=None)
@given(windows=st.sampled_from(sorted(WINDOW_FNS)), combiner=st.sampled_from(COMBINERS),
       events=st.lists(st.tuples(st.integers(-20, 40), st.integers(-10_000_000, 60_000_000)), max_size=30))
def test_panes_equal_beams_general_driver(windows, combiner, events):
    windowing = Windowing(WINDOW_FNS[windows], timestamp_combiner=combiner)
    assume(not windowing.is_default())  # Beam's pass-through driver, kept
    fn = windowing.windowfn
    values = []
    for value, micros in events:
        ts = Timestamp(micros=micros)
        values.append(WindowedValue(value, ts, tuple(fn.assign(window.WindowFn.AssignContext(ts, value)))))
    assert isinstance(pane_driver(windowing), MergedOnTimePanes if fn.is_merging() else OnTimePanes)
    beams = trigger.GeneralTriggerDriver(windowing, None)
    assert _panes(pane_driver(windowing), "k", values) == _panes(beams, "k", values)


@pytest.mark.parametrize("windowing", [
    Windowing(window.GlobalWindows()),                                    # Beam's pass-through
    Windowing(window.GlobalWindows(), triggerfn=trigger.AfterCount(1),  # Beam's pass-through too
              accumulation_mode=trigger.AccumulationMode.DISCARDING),
], ids=["default", "global_after_count_1"])
def test_other_windowings_keep_beams_driver(windowing):
    assert type(pane_driver(windowing)) is type(trigger.create_trigger_driver(windowing, True))


def test_merging_windows_under_another_trigger_get_the_streaming_groupings_driver():
    windowing = Windowing(window.Sessions(10), triggerfn=trigger.AfterCount(2),
                          accumulation_mode=trigger.AccumulationMode.DISCARDING)
    assert type(pane_driver(windowing)) is MergingTriggerDriver


# Triggers whose state is nested or counted per element (no processing
# time: a batch driver has no clock, in Beam as here).
_TRIGGERS = [
    lambda n: trigger.AfterWatermark(early=trigger.AfterCount(n)),
    lambda n: trigger.AfterWatermark(early=trigger.AfterCount(n), late=trigger.AfterCount(1)),
    lambda n: trigger.Repeatedly(trigger.AfterCount(n)),
    lambda n: trigger.AfterCount(n),
    lambda n: trigger.Repeatedly(trigger.AfterAny(trigger.AfterCount(n), trigger.AfterWatermark())),
    lambda n: trigger.AfterEach(trigger.AfterCount(n), trigger.AfterCount(1)),
    lambda n: trigger.OrFinally(trigger.Repeatedly(trigger.AfterCount(1)), trigger.AfterCount(n + 2)),
    lambda n: trigger.AfterAll(trigger.AfterCount(n), trigger.AfterWatermark()),
]


@settings(max_examples=300, deadline=None)
@given(windows=st.sampled_from(sorted(WINDOW_FNS)), combiner=st.sampled_from(COMBINERS),
       make_trigger=st.sampled_from(_TRIGGERS), count=st.integers(1, 4), lateness=st.sampled_from([0, 5]),
       mode=st.sampled_from([trigger.AccumulationMode.DISCARDING, trigger.AccumulationMode.ACCUMULATING]),
       events=st.lists(st.tuples(st.integers(-20, 40), st.integers(-10_000_000, 60_000_000)), max_size=30))
def test_other_triggers_give_beams_panes_in_order(windows, combiner, make_trigger, count, lateness, mode, events):
    windowing = Windowing(WINDOW_FNS[windows], triggerfn=make_trigger(count), accumulation_mode=mode,
                          timestamp_combiner=combiner, allowed_lateness=lateness)
    beams = trigger.create_trigger_driver(windowing, True)
    assume(type(beams) is trigger.GeneralTriggerDriver)  # not the global window's pass-through
    fn = windowing.windowfn
    values = []
    for value, micros in events:
        ts = Timestamp(micros=micros)
        values.append(WindowedValue(value, ts, tuple(fn.assign(window.WindowFn.AssignContext(ts, value)))))
    ours = pane_driver(windowing)
    assert type(ours) is not trigger.GeneralTriggerDriver
    assert ([_pane(wv) for wv in ours.process_entire_key("k", values)]
            == [_pane(wv) for wv in beams.process_entire_key("k", values)])


def _pane(wv) -> tuple:
    return wv.value, wv.timestamp, wv.windows, wv.pane_info


@pytest.mark.parametrize("windowfn", [window.FixedWindows(60), window.Sessions(2)], ids=["fixed", "sessions"])
def test_an_early_counting_trigger_equals_direct_runner(spark, tmp_path, windowfn):
    def build(p):
        return (p | beam.Create([(k, i) for i in range(500) for k in "ab"])
                | beam.Map(lambda kv: window.TimestampedValue(kv, kv[1] * 13 % 300 // 60 * 60))
                | beam.WindowInto(windowfn, trigger=trigger.AfterWatermark(
                    early=trigger.AfterCount(20)), accumulation_mode=trigger.AccumulationMode.ACCUMULATING)
                | beam.GroupByKey()
                | beam.Map(lambda kv, w=beam.DoFn.WindowParam, pane=beam.DoFn.PaneInfoParam:
                           (kv[0], len(kv[1]), repr(w), pane.timing, pane.index)))
    out = spark_equals_direct(build, tmp_path)
    # Per key and minute (five timestamps, 100 elements each): an early pane and the on-time one.
    assert len(out) == 2 * 5 * 2


def test_a_windowed_aggregation_equals_direct_runner(spark, tmp_path):
    def build(p):
        return (p | beam.Create([(k, i) for i in range(400) for k in "abc"])
                | beam.Map(lambda kv: window.TimestampedValue(kv, kv[1] * 7 % 600))
                | beam.WindowInto(window.SlidingWindows(60, 20),
                                  timestamp_combiner=window.TimestampCombiner.OUTPUT_AT_EARLIEST)
                | beam.CombinePerKey(sum)
                | beam.Map(lambda kv, w=beam.DoFn.WindowParam, t=beam.DoFn.TimestampParam:
                           (kv, repr(w), float(t))))
    out = spark_equals_direct(build, tmp_path)
    assert len(out) == 3 * 32  # 600 s of 60-s windows every 20 s: 32 windows per key


def test_a_sessions_aggregation_equals_direct_runner(spark, tmp_path):
    # Runs of a key's events 3 s apart, runs 20 s apart: sessions of a 10-s gap
    # merge each run; the grouping's panes come from MergedOnTimePanes.
    def build(p):
        return (p | beam.Create([(k, i) for i in range(300) for k in "abc"])
                | beam.Map(lambda kv: window.TimestampedValue(kv, kv[1] * 3 + kv[1] // 7 * 20))
                | beam.WindowInto(window.Sessions(10),
                                  timestamp_combiner=window.TimestampCombiner.OUTPUT_AT_EARLIEST)
                | beam.GroupByKey()
                | beam.Map(lambda kv, w=beam.DoFn.WindowParam, t=beam.DoFn.TimestampParam:
                           (kv[0], sorted(kv[1]), repr(w), float(t))))
    out = spark_equals_direct(build, tmp_path)
    assert len(out) == 3 * 43  # 300 events in runs of 7: 43 sessions per key
