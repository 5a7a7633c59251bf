"""Spark Python workers running SparkRunner's tasks collect cyclic garbage less often; the driver is left alone."""
from __future__ import annotations

import gc
import weakref

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


def _frozen(_):
    from beam_ext.runner.worker import _gc

    return _gc._freeze_between_tasks in gc.callbacks and gc.get_freeze_count() > 0


def test_workers_freeze_what_survives_the_collection_between_tasks(spark):
    # The first pipeline's tasks import beam_ext on every worker; a later
    # task runs after PySpark's collection between tasks has frozen it.
    with beam.Pipeline(runner=SparkRunner()) as p:
        _ = p | beam.Create(range(20)) | beam.Reshuffle() | beam.Map(_frozen)
    with beam.Pipeline(runner=SparkRunner()) as p:
        seen = p | beam.Create(range(20)) | beam.Reshuffle() | beam.Map(_frozen) | beam.Distinct()
        assert_that(seen, equal_to([True]))
    assert gc.get_freeze_count() == 0  # the driver's objects are never frozen


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_cycles_that_die_after_being_frozen_are_freed_within_a_thaw_period():
    from beam_ext.runner.worker import _gc

    gc.collect()
    kept = _Cycle()
    ref = weakref.ref(kept)
    try:
        _gc._freeze_between_tasks("stop", {"generation": 2})  # as after a task
        assert gc.get_freeze_count() > 0
        _gc._freeze_between_tasks("stop", {"generation": 0})  # a young collection freezes nothing
        del kept  # a cycle that dies while frozen
        gc.collect()
        assert ref() is not None
        for _ in range(_gc.THAW_EVERY):
            gc.collect()
            _gc._freeze_between_tasks("stop", {"generation": 2})
        assert ref() is None
    finally:
        gc.unfreeze()
