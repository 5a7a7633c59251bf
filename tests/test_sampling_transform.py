"""ApproximateWindowAggregate on DirectRunner: the same panes as the replay
engine, per key, windows, validation and metrics."""
from __future__ import annotations

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_ext import ApproximateResult, ApproximateWindowAggregate
from beam_ext.io import ReadSimulatedEvents, StreamSpec, generate
from beam_ext.transforms.sampling._sampler import SamplerConfig, replay


def _expected_per_campaign(batch, cfg):
    # Beam timestamps keep whole microseconds (Timestamp truncates).
    gen = np.trunc(batch.gen_ts * 1e6) / 1e6
    out = []
    for code in np.unique(batch.campaign):
        m = batch.campaign == code
        out += replay(gen[m], batch.arr_ts[m], batch.value[m], cfg,
                      key=f"campaign-{code}").results
    return out


def test_mean_matches_replay_and_counts_stragglers():
    spec = StreamSpec("nyt", "EG", rate=800.0, duration=15.0, seed=11)
    batch = generate(spec)
    cfg = SamplerConfig(window=3.0, substream=0.6, seed=2, history=5)
    expected = replay(batch.gen_ts, batch.arr_ts, batch.value, cfg)
    p = beam.Pipeline(runner="BundleBasedDirectRunner")
    out = (p | ReadSimulatedEvents(spec)
           | ApproximateWindowAggregate(window=3.0, value="trip_distance", history=5,
                                        event_time="gen_ts", seed=2))
    assert_that(out, equal_to(expected.results))
    result = p.run()
    result.wait_until_finish()
    counters = {c.key.metric.name: c.committed for c in
                result.metrics().query(MetricsFilter().with_namespace("beam_ext.sampling"))["counters"]}
    assert counters["late_events"] == expected.late > 0
    assert counters["stragglers_after_emission"] == expected.stragglers_after_emission
    assert counters["observed_events"] == len(batch)


def test_sum_per_key_with_element_timestamps_and_fixed_windows():
    spec = StreamSpec("ysb", "GG", rate=1500.0, duration=12.0, seed=4, campaigns=3)
    batch = generate(spec)
    cfg = SamplerConfig(window=2.4, substream=0.6, aggregate="sum", history=4,
                        offset=1.2, corrections=True)
    expected = _expected_per_campaign(batch, cfg)
    with beam.Pipeline() as p:
        out = (p | ReadSimulatedEvents(spec)  # timestamped by gen_ts
               | ApproximateWindowAggregate(
                   window=window.FixedWindows(2.4, offset=1.2), value="value",
                   aggregate="sum", history=4, key="campaign", corrections=True))
        assert_that(out, equal_to(expected))
        # each pane lands in the window it describes
        assert_that(out | beam.ParDo(_WindowCheck()), equal_to([]), label="windows")


class _WindowCheck(beam.DoFn):
    def process(self, r: ApproximateResult, w=beam.DoFn.WindowParam):
        if (abs(float(w.start) - r.window_start) > 1e-6
                or abs(float(w.end) - r.window_end) > 1e-6):
            yield (r.window_start, float(w.start))


def test_count_without_value():
    spec = StreamSpec("ysb", "CC", rate=500.0, duration=9.0, seed=1, campaigns=1)
    batch = generate(spec)
    cfg = SamplerConfig(window=3.0, substream=0.6, aggregate="count", history=3)
    with beam.Pipeline() as p:
        out = (p | beam.Create(list(batch.events()))
               | ApproximateWindowAggregate(window=3.0, aggregate="count", history=3,
                                            event_time="gen_ts"))
        assert_that(out, equal_to(replay(batch.gen_ts, batch.arr_ts, batch.value, cfg).results))


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(error=1.5), ValueError, "error"),
    (dict(confidence=0.0), ValueError, "confidence"),
    (dict(substream=0.7), ValueError, "divide"),
    (dict(value=None), ValueError, "value is required"),
    (dict(window=window.SlidingWindows(3.0, 1.0)), ValueError, "tumbling"),
    (dict(window="3s"), TypeError, "window"),
    (dict(aggregate="p99"), ValueError, "aggregate"),
    (dict(window=float("inf")), ValueError, "window must be a finite number of seconds > 0"),
    (dict(window=float("nan")), ValueError, "window must be a finite number of seconds > 0"),
    (dict(substream=float("inf")), ValueError, "substream must be a finite number"),
    (dict(substream=1e-9), ValueError, "substream must be at least 1 microsecond"),
    (dict(error=float("nan")), ValueError, "error"),
    (dict(safety=float("inf")), ValueError, "safety"),
    (dict(history=float("inf")), ValueError, "history"),
    (dict(seed=1.5), TypeError, "seed must be an int"),
])
def test_rejects_bad_arguments(kwargs, exc, match):
    args = {"window": 3.0, "value": "v", **kwargs}
    with pytest.raises(exc, match=match):
        ApproximateWindowAggregate(**args)


@pytest.mark.parametrize("event,match", [
    ({"gen_ts": 1.0, "v": 2.0}, r"arrival_time: event has no field 'arr_ts': \{'gen_ts'"),
    ({"arr_ts": 1.0, "v": 2.0}, r"event_time: event has no field 'gen_ts'"),
    ({"gen_ts": 2.0, "arr_ts": 1.0, "v": 2.0}, r"before event_time .*'gen_ts': 2.0"),
    ({"gen_ts": 1.0, "arr_ts": 1.5, "v": "x"}, r"value: not a number \('x'\)"),
])
def test_bad_events_fail_showing_the_event(event, match):
    with pytest.raises(Exception, match=match):
        with beam.Pipeline() as p:
            _ = (p | beam.Create([event])
                 | ApproximateWindowAggregate(window=3.0, value="v", event_time="gen_ts"))


@settings(max_examples=4, deadline=None, derandomize=True)
@given(seed=st.integers(0, 1000), setting=st.sampled_from(["GG", "EG", "UU"]),
       aggregate=st.sampled_from(["mean", "sum", "count"]))
def test_random_streams_match_replay(seed, setting, aggregate):
    spec = StreamSpec("nyt", setting, rate=300.0, duration=8.0, seed=seed)
    batch = generate(spec)
    cfg = SamplerConfig(window=1.2, substream=0.4, aggregate=aggregate, history=3,
                        seed=seed, corrections=True)
    with beam.Pipeline() as p:
        out = (p | ReadSimulatedEvents(spec)
               | ApproximateWindowAggregate(window=1.2, substream=0.4, value="value",
                                            aggregate=aggregate, history=3, seed=seed,
                                            event_time="gen_ts", corrections=True))
        assert_that(out, equal_to(replay(batch.gen_ts, batch.arr_ts, batch.value, cfg).results))
