"""ApproximateWindowAggregate gives the same panes on SparkRunner as on
DirectRunner for the same seed (needs beam_ext.runner.SparkRunner)."""
from __future__ import annotations

import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to

from beam_ext import ApproximateWindowAggregate
from beam_ext.io import ReadSimulatedEvents, StreamSpec, generate
from beam_ext.transforms.sampling._sampler import SamplerConfig, replay


def _pipeline(p, spec):
    return (p | ReadSimulatedEvents(spec)
            | ApproximateWindowAggregate(window=1.2, substream=0.4, value="value",
                                         aggregate="sum", history=3, seed=5,
                                         event_time="gen_ts", corrections=True))


def test_spark_runner_equals_direct_runner(spark):
    from beam_ext.runner import SparkRunner

    spec = StreamSpec("nyt", "EG", rate=300.0, duration=8.0, seed=21)
    batch = generate(spec)
    cfg = SamplerConfig(window=1.2, substream=0.4, aggregate="sum", history=3, seed=5,
                        corrections=True)
    expected = replay(batch.gen_ts, batch.arr_ts, batch.value, cfg).results
    with beam.Pipeline(runner="BundleBasedDirectRunner") as p:
        assert_that(_pipeline(p, spec), equal_to(expected))
    with beam.Pipeline(runner=SparkRunner()) as p:
        assert_that(_pipeline(p, spec), equal_to(expected))
