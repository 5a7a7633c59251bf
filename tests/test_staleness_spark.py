"""StalenessRefire on SparkRunner gives the same panes as on DirectRunner.

SparkRunner runs batch pipelines (the watermark jumps to the end), so every
window gets exactly its on-time pane; late panes are covered on DirectRunner
with TestStream (tests/test_staleness_refire.py).
"""
from __future__ import annotations

import sys

import apache_beam as beam
from apache_beam.internal import cloudpickle
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window
from apache_beam.utils.windowed_value import PaneInfoTiming

from beam_ext.runner import SparkRunner
from beam_ext.transforms.staleness import StalenessRefire, StalenessTrigger

# Spark's Python workers cannot import this test module: ship its code by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class _WithPane(beam.DoFn):
    def process(self, element, pane=beam.DoFn.PaneInfoParam, w=beam.DoFn.WindowParam):
        key, values = element
        yield (key, float(w.start), tuple(sorted(values)), pane.is_first, pane.index,
               pane.timing == PaneInfoTiming.ON_TIME)


def _pipeline(p, events):
    trigger = StalenessTrigger(0.1, allowed_lateness=100.0, history=[[1.0, 5.0, 60.0]] * 3)
    return (p | beam.Create(events)
            | beam.Map(lambda e: window.TimestampedValue((e[0], e[1]), e[2]))
            | beam.WindowInto(window.FixedWindows(10))
            | StalenessRefire(trigger)) | beam.ParDo(_WithPane())


def test_spark_matches_direct_runner_and_the_oracle(spark):
    events = [(f"k{i % 4}", i, float(i * 13 % 70)) for i in range(24)]
    expected = {}
    for key, value, ts in events:
        expected.setdefault((key, ts - ts % 10), []).append(value)
    oracle = [(k, start, tuple(sorted(v)), True, 0, True) for (k, start), v in expected.items()]
    for runner in ("DirectRunner", SparkRunner()):
        with beam.Pipeline(runner=runner) as p:
            assert_that(_pipeline(p, events), equal_to(oracle))
