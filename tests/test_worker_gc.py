"""Spark Python workers running SparkRunner's tasks collect cyclic garbage less often; the driver is left alone."""
from __future__ import annotations

import gc

import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to

from beam_ext.runner import SparkRunner
from beam_ext.runner.worker._gc import WORKER_GC_THRESHOLD


def _threshold(_):
    return gc.get_threshold()[0]


def test_workers_raise_the_young_generation_threshold_and_the_driver_keeps_its_own(spark):
    before = gc.get_threshold()
    with beam.Pipeline(runner=SparkRunner()) as p:
        seen = p | beam.Create(range(20)) | beam.Reshuffle() | beam.Map(_threshold) | beam.Distinct()
        assert_that(seen, equal_to([WORKER_GC_THRESHOLD]))
    assert gc.get_threshold() == before
