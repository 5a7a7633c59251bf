"""StalenessRefire on DirectRunner with TestStream, against a brute-force model."""
from __future__ import annotations

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window
from hypothesis import Phase, given, settings, strategies as st

from beam_ext.transforms.staleness import StalenessRefire, StalenessTrigger
from tests._staleness_stream import Stream, model, run

T = 100.0


def _trigger():
    # Arrivals cluster early: the plan fires densely after the window's end.
    return StalenessTrigger(0.2, allowed_lateness=T, history=[[5, 6, 7, 8, 9, 10, 40, 90]] * 3)


def test_transcript_on_time_late_close_and_dead_letter():
    trigger = _trigger()
    offsets = trigger.late_firing_offsets()
    assert len(offsets) == 3 and offsets[0] < 30 < offsets[1] < 60 < offsets[2] < 100
    stream = Stream(10.0, [
        ([("a", 1, 1.0), ("b", 1, 2.0)], 12.0),   # on time; watermark passes the end
        ([("a", 2, 2.0)], 30.0),                   # late, fires at the first offset
        ([("a", 3, 3.0)], 105.0),                  # late; second offset fires, third has nothing
        ([("a", 4, 4.0)], 150.0),                  # late at offset 95; the close at T fires it
        # a's window is closed: dead letter. c never had state in it: Beam shows a
        # DoFn no watermark, so its first element opens the window (documented limit).
        ([("a", 5, 5.0), ("c", 1, 6.0)], 200.0),
    ])
    panes, dead = model(stream, offsets, T)
    assert [p[2] for p in panes if p[0] == "a"] == [(1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)]
    assert [p for p in panes if p[0] != "a"] == [("b", 0.0, (1,), True, False, False, 0),
                                                ("c", 0.0, (1,), True, False, False, 0)]
    assert [p[4] for p in panes if p[0] == "a"] == [False, False, False, True]
    assert dead == [("a", 5)]
    # Counters are not asserted here: BundleBasedDirectRunner keeps only the first
    # bundle's metric updates of a stateful DoFn; the SparkRunner test checks them.
    run(stream, trigger, panes, dead)


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
    events = [("k%d" % (i % 3), i, float(i * 7 % 50)) for i in range(40)]
    expected = {}
    for key, value, ts in events:
        expected.setdefault((key, ts - ts % 10), []).append(value)
    with beam.Pipeline() as p:
        out = (p | beam.Create(events)
               | beam.Map(lambda e: window.TimestampedValue((e[0], e[1]), e[2]))
               | beam.WindowInto(window.FixedWindows(10))
               | StalenessRefire(_trigger()))
        got = out.panes | beam.MapTuple(lambda k, vs: (k, tuple(sorted(vs))))
        assert_that(got, equal_to([(k, tuple(sorted(v))) for (k, _), v in expected.items()]))


def test_rejects_windows_that_never_end_and_triggers_without_lateness():
    with pytest.raises(ValueError, match="allowed_lateness"):
        StalenessRefire(StalenessTrigger(0.1))
    with pytest.raises(TypeError, match="late_firing_offsets"):
        StalenessRefire(object())
    with pytest.raises(ValueError, match="non-merging windows"):
        with beam.Pipeline() as p:
            _ = p | beam.Create([("a", 1)]) | StalenessRefire(_trigger())

