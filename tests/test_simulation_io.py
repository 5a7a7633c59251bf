"""Simulated delay-setting streams: determinism, delay statistics, Beam source."""
from __future__ import annotations

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_ext.io import (
    DELAY_SETTINGS,
    ReadSimulatedEvents,
    StreamSpec,
    generate,
    generate_chunk,
    iter_events,
)


@pytest.mark.parametrize("setting,delay_mean,delay_sd,gap_mean", [
    ("CC", 0.150, 0.0, 0.001), ("GG", 0.240, 0.031, 0.001), ("EC", 0.240, 0.240, 0.001),
    ("EG", 0.240, 0.240, 0.001), ("UU", 0.150, 0.0866, 0.001),
])
def test_delay_settings_have_the_thesis_moments(setting, delay_mean, delay_sd, gap_mean):
    b = generate(StreamSpec("nyt", setting, rate=1000.0, duration=20.0, seed=1))
    delays = b.arr_ts - b.gen_ts
    assert delays.mean() == pytest.approx(delay_mean, rel=0.03)
    assert delays.std() == pytest.approx(delay_sd, rel=0.05, abs=1e-9)
    assert len(b) == pytest.approx(20.0 / gap_mean, rel=0.03)
    assert np.all(np.diff(b.arr_ts) >= 0)


def test_rate_scales_gaps_not_delays():
    b = generate(StreamSpec("nyt", "EG", rate=25_000.0, duration=2.0, seed=2))
    assert len(b) == pytest.approx(50_000, rel=0.02)
    assert (b.arr_ts - b.gen_ts).mean() == pytest.approx(0.240, rel=0.03)


def test_streams_are_deterministic_per_seed_and_chunk():
    spec = StreamSpec("ysb", "GG", rate=500.0, duration=3.0, seed=7)
    a, b = generate(spec), generate(spec)
    assert np.array_equal(a.gen_ts, b.gen_ts) and np.array_equal(a.value, b.value)
    other = generate(StreamSpec("ysb", "GG", rate=500.0, duration=3.0, seed=8))
    assert not np.array_equal(a.gen_ts[:10], other.gen_ts[:10])
    chunks = sorted(np.concatenate([generate_chunk(spec, c).gen_ts for c in range(3)]))
    assert np.array_equal(np.sort(a.gen_ts), chunks)
    assert a.gen_ts.max() < 3.0


def test_workload_fields():
    ysb = list(iter_events(StreamSpec("ysb", "CC", rate=300.0, duration=1.0, campaigns=4)))
    assert {e["event_type"] for e in ysb} == {"view", "click", "purchase"}
    assert {e["campaign"] for e in ysb} == {f"campaign-{i}" for i in range(4)}
    assert all(e["value"] == (1.0 if e["event_type"] == "view" else 0.0) for e in ysb)
    nyt = generate(StreamSpec("nyt", "CC", rate=5000.0, duration=2.0))
    # heavy tail: the largest trip is many times the mean
    assert nyt.value.max() > 10 * nyt.value.mean() and nyt.value.min() > 0


@pytest.mark.parametrize("kwargs,match", [
    (dict(workload="tpc"), "workload"), (dict(delays="XX"), "delays"),
    (dict(rate=0.0), "rate"), (dict(duration=-1.0), "duration"), (dict(campaigns=0), "campaigns"),
])
def test_spec_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StreamSpec(**{"workload": "nyt", "delays": "EG", **kwargs})


def test_beam_source_yields_the_same_events_timestamped_by_generation():
    spec = StreamSpec("nyt", "EG", rate=400.0, duration=3.0, seed=3)
    expected = [(e["gen_ts"], e["arr_ts"], e["value"]) for e in iter_events(spec)]
    with beam.Pipeline() as p:
        out = (p | ReadSimulatedEvents(spec)
               | beam.Map(lambda e, ts=beam.DoFn.TimestampParam:
                          (e["gen_ts"], e["arr_ts"], e["value"], abs(float(ts) - e["gen_ts"]) < 1e-6)))
        assert_that(out, equal_to([x + (True,) for x in expected]))


def test_all_settings_documented():
    assert set(DELAY_SETTINGS) == {"CC", "GG", "EC", "EG", "UU"}
