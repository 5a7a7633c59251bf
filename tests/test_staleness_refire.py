"""StalenessRefire on DirectRunner with TestStream, against a brute-force model."""
from __future__ import annotations

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from beam_ext.transforms.lateness import LateWindowedGroupByKey
from beam_ext.transforms.staleness import StalenessRefire, StalenessTrigger
from tests._staleness_stream import Stream, model, run

T = 100.0


def _trigger():
    # Arrivals cluster early: the plan fires densely after the window's end.
    return StalenessTrigger(0.2, allowed_lateness=T, history=[[5, 6, 7, 8, 9, 10, 40, 90]] * 3)


TRANSCRIPT = Stream(10.0, [
    ([("a", 1, 1.0), ("b", 1, 2.0)], 12.0),   # on time; watermark passes the end
    ([("a", 2, 2.0)], 30.0),                   # late, fires at the first offset
    ([("a", 3, 3.0)], 105.0),                  # late; second offset fires, third has nothing
    ([("a", 4, 4.0)], 150.0),                  # late at offset 95; the close at T fires it
    # a's window is closed: dead letter. c never had state in it: Beam shows a
    # DoFn no watermark, so its first element opens the window (documented limit).
    ([("a", 5, 5.0), ("c", 1, 6.0)], 200.0),
])


def test_transcript_on_time_late_close_and_dead_letter():
    trigger = _trigger()
    offsets = trigger.late_firing_offsets()
    assert len(offsets) == 3 and offsets[0] < 30 < offsets[1] < 60 < offsets[2] < 100
    stream = TRANSCRIPT
    panes, dead = model(stream, offsets, T)
    assert [p[2] for p in panes if p[0] == "a"] == [(1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)]
    assert [p for p in panes if p[0] != "a"] == [("b", 0.0, (1,), True, False, False, 0),
                                                ("c", 0.0, (1,), True, False, False, 0)]
    assert [p[4] for p in panes if p[0] == "a"] == [False, False, False, True]
    assert dead == [("a", 5)]
    # Counters are not asserted here: BundleBasedDirectRunner loses the metric
    # updates of TestStream bundles; the counting step is checked on bounded input.
    run(stream, trigger, panes, dead)


class _Plan:
    """A trigger firing a fixed plan, learning nothing."""

    def __init__(self, offsets):
        self.offsets = offsets

    def late_firing_offsets(self, allowed_lateness):
        return self.offsets


def test_late_windowed_group_by_key_with_the_same_plan_gives_the_same_outputs():
    # One pane engine, one output shape: LateWindowedGroupByKey firing the
    # trigger's plan with allowed lateness T emits StalenessRefire's panes and
    # dead letters.
    trigger = _trigger()
    offsets = trigger.late_firing_offsets()
    panes, dead = model(TRANSCRIPT, offsets, T)
    run(TRANSCRIPT, trigger, panes, dead,
        transform=LateWindowedGroupByKey(trigger=_Plan(offsets), cleanup=T))


class _AsStatefulOutput(beam.DoFn):
    """Tagged elements with a pane, as the stateful step emits them."""

    def process(self, element):
        tag, payload, timing = element
        yield WindowedValue((tag, payload), 0, [window.GlobalWindow()],
                            PaneInfo(timing == PaneInfoTiming.ON_TIME, False, timing, 0, 0))


class _GivenStatefulOutput(StalenessRefire):
    def _tagged(self, pcoll):
        return pcoll | beam.ParDo(_AsStatefulOutput())


def test_panes_and_dead_letters_are_split_and_counted_in_the_staleness_namespace():
    p = beam.Pipeline()
    panes, dead = (p | beam.Create([("pane", ("k", [1]), PaneInfoTiming.ON_TIME),
                                    ("pane", ("k", [1, 2]), PaneInfoTiming.LATE),
                                    ("pane", ("j", [7]), PaneInfoTiming.ON_TIME),
                                    ("dead", ("k", 3), PaneInfoTiming.UNKNOWN),
                                    ("dead", ("k", 4), PaneInfoTiming.UNKNOWN)])
                   | _GivenStatefulOutput(_trigger()).with_dead_letters())
    assert_that(panes, equal_to([("k", [1]), ("k", [1, 2]), ("j", [7])]), label="panes")
    assert_that(dead, equal_to([("k", 3), ("k", 4)]), label="dead")
    result = p.run()
    result.wait_until_finish()
    counters = result.metrics().query(
        MetricsFilter().with_namespace("beam_ext.staleness"))["counters"]
    assert {c.key.metric.name: c.committed for c in counters} == {"dead_letter": 2,
                                                                 "late_panes": 1}


def test_discarding_mode_emits_only_new_values():
    trigger = _trigger()
    stream = Stream(10.0, [([("a", 1, 1.0)], 12.0), ([("a", 2, 2.0), ("a", 3, 3.0)], 40.0)])
    panes, dead = model(stream, trigger.late_firing_offsets(), T, accumulate=False)
    assert [p[2] for p in panes] == [(1,), (2, 3)]
    run(stream, trigger, panes, dead, accumulate=False)


@settings(max_examples=4, deadline=None, derandomize=True, phases=[Phase.generate])
@given(seed=st.integers(0, 2**32 - 1))
def test_random_late_streams_match_the_model(seed):
    rng = np.random.default_rng(seed)
    trigger = StalenessTrigger(0.1, allowed_lateness=T,
                               history=[rng.lognormal(2.5, 1, 50).tolist() for _ in range(4)])
    batches, watermark = [], 0.0
    for _ in range(rng.integers(3, 12)):
        watermark = round(watermark + float(rng.exponential(25)) + 0.013, 3)  # TestStream: ms
        batch = [(str(rng.integers(0, 3)), int(rng.integers(0, 100)),
                  round(max(0.0, watermark - rng.exponential(40)), 3)) for _ in range(rng.integers(0, 4))]
        batches.append((batch, watermark))
    stream = Stream(10.0, batches)
    panes, dead = model(stream, trigger.late_firing_offsets(), T)
    run(stream, trigger, panes, dead)


def test_batch_pipeline_gives_one_on_time_pane_per_key_and_window():
    events = [(f"k{i % 3}", i, float(i * 7 % 50)) for i in range(40)]
    expected = {}
    for key, value, ts in events:
        expected.setdefault((key, ts - ts % 10), []).append(value)
    with beam.Pipeline() as p:
        out = (p | beam.Create(events)
               | beam.Map(lambda e: window.TimestampedValue((e[0], e[1]), e[2]))
               | beam.WindowInto(window.FixedWindows(10))
               | StalenessRefire(_trigger()))
        got = out | beam.MapTuple(lambda k, vs: (k, tuple(sorted(vs))))
        assert_that(got, equal_to([(k, tuple(sorted(v))) for (k, _), v in expected.items()]))


def test_rejects_windows_that_never_end_and_triggers_without_lateness():
    with pytest.raises(ValueError, match="allowed_lateness"):
        StalenessRefire(StalenessTrigger(0.1))
    with pytest.raises(TypeError, match="late_firing_offsets"):
        StalenessRefire(object())
    with pytest.raises(ValueError, match="non-merging windows"):
        with beam.Pipeline() as p:
            _ = p | beam.Create([("a", 1)]) | StalenessRefire(_trigger())

