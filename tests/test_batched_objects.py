"""Batched DoFns (``process_batch``) on element objects (``beam_ext/runner/worker/_batched.py``).

The batches must be those Beam's bundle processor makes: at most 4,096
elements a flush, grouped by windowing in the order each came, flushed at
bundle ends; each output batch exploded with its input's windowing.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterator

import apache_beam as beam
import numpy as np
from apache_beam.transforms import window
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pipeline_outputs import planned_on_objects, run_and_collect, spark_equals_direct

from beam_ext.runner import SparkRunner


class _Doubled(beam.DoFn):
    def process_batch(self, batch):
        yield batch * 2

    def infer_output_type(self, input_element_type):
        return input_element_type


class _Sized(beam.DoFn):
    """Each batch's size: not element-wise, so it shows how the elements were batched."""

    def process_batch(self, batch):
        yield np.array([len(batch)], dtype=np.int64)

    def infer_output_type(self, input_element_type):
        return input_element_type


class _Both(_Doubled):
    """Defines ``process`` too: Beam picks by its neighbours, so it keeps Beam's path."""

    def process(self, x):
        yield x * 2


class _Ranges(beam.DoFn):
    """Each element ``n`` as one batch of its ``n`` numbers: ``process`` yields batches."""

    @beam.DoFn.yields_batches
    def process(self, n):
        yield np.arange(n, dtype=np.int64)

    def infer_output_type(self, input_element_type):
        return np.int64


class _Largest(beam.DoFn):
    """Elements from each batch (``yields_elements``, as Beam's ``to_dataframe``
    yields frames): its size, and its largest value stamped at that value."""

    @beam.DoFn.yields_elements
    def process_batch(self, batch):
        yield np.int64(len(batch))
        yield window.TimestampedValue(np.int64(batch.max()), int(batch.max()))

    def infer_output_type(self, input_element_type):
        return np.int64


# Beam reads the batch types from annotations as objects; this module's are strings.
for _fn in (_Doubled, _Sized):
    _fn.process_batch.__annotations__ = {"batch": np.ndarray, "return": Iterator[np.ndarray]}
_Largest.process_batch.__annotations__ = {"batch": np.ndarray, "return": Iterator[np.int64]}
_Ranges.process.__annotations__ = {"n": np.int64, "return": Iterator[np.ndarray]}


def _windowed(p, values: list[int], dofn: beam.DoFn, stamp=lambda v: v):
    return (p | beam.Create(values) | "Stamp" >> beam.Map(lambda v: window.TimestampedValue(v, stamp(v)))
            | beam.WindowInto(window.FixedWindows(10))
            | "Typed" >> beam.Map(lambda v: v).with_output_types(np.int64) | "Batched" >> beam.ParDo(dofn)
            | "Out" >> beam.Map(lambda v, w=beam.DoFn.WindowParam: [int(v), int(w.start)]))


def _on_objects(build) -> list[bool]:
    return planned_on_objects(build, "Batched")


def test_a_batched_dofn_equals_beam_and_python(tmp_path):
    values = list(range(-20, 60, 3))
    assert _on_objects(lambda p: _windowed(p, values, _Doubled())) == [True]
    got = spark_equals_direct(lambda p: _windowed(p, values, _Doubled()), tmp_path)
    assert sorted(got) == sorted([2 * v, v - v % 10] for v in values)


def test_batches_are_cut_and_grouped_by_window_as_beam_cuts_them(tmp_path):
    # 10,000 elements alternating between two windows, one task: Beam flushes
    # every 4,096 elements received and groups each flush by window.
    values = list(range(10_000))

    def build(p):
        return _windowed(p, values, _Sized(), stamp=lambda v: 10 * (v % 2))

    got = spark_equals_direct(build, tmp_path, ["--spark_parallelism=1"])
    assert Counter(map(tuple, got)) == Counter({(2048, 0): 2, (2048, 10): 2, (904, 0): 1, (904, 10): 1})


def test_a_dofn_with_process_and_process_batch_keeps_beams_path(tmp_path):
    assert _on_objects(lambda p: _windowed(p, [1, 2, 3], _Both())) == [False]
    assert sorted(spark_equals_direct(lambda p: _windowed(p, [1, 2, 3], _Both()), tmp_path)) == [
        [2, 0], [4, 0], [6, 0]]


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.integers(-1000, 1000), max_size=80))
def test_random_batches_equal_python(tmp_path_factory, values):
    got = run_and_collect(SparkRunner(), lambda p: _windowed(p, values, _Doubled()),
                          str(tmp_path_factory.mktemp("batched")))
    assert sorted(got) == sorted([2 * v, v - v % 10] for v in values)


def test_a_dofn_yielding_batches_from_elements_runs_on_objects_as_beam(tmp_path):
    values = [0, 3, 5, 12, 25]
    got = spark_equals_direct(lambda p: _windowed(p, values, _Ranges()), tmp_path)
    # Each number in its element's window: a batch keeps its input's windowing.
    assert sorted(got) == sorted([i, v - v % 10] for v in values for i in range(v))
    assert _on_objects(lambda p: _windowed(p, values, _Ranges())) == [True]


def test_a_batched_dofn_yielding_elements_runs_on_objects_as_beam(tmp_path):
    # As in the test above: 10,000 elements alternating between two windows,
    # one task. Each batch gives its size in its window, and its largest value
    # in the window of that value's own timestamp.
    values = list(range(10_000))

    def build(p):
        return _windowed(p, values, _Largest(), stamp=lambda v: 10 * (v % 2))

    assert _on_objects(build) == [True]
    got = spark_equals_direct(build, tmp_path, ["--spark_parallelism=1"])
    sizes = Counter(tuple(row) for row in got if row[0] in (2048, 904))
    assert sizes == Counter({(2048, 0): 2, (2048, 10): 2, (904, 0): 1, (904, 10): 1})
    assert sorted(row for row in got if row[0] not in (2048, 904)) == sorted(
        [m, m - m % 10] for m in (4094, 8190, 9998, 4095, 8191, 9999))
