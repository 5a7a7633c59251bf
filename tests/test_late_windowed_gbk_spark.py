"""LateWindowedGroupByKey on SparkRunner (spill-store native path) equals DirectRunner."""
from __future__ import annotations

import random

import apache_beam as beam
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window as beam_window

from beam_ext.runner import SparkRunner
from beam_ext.transforms import EveryNLateEvents, LateWindowedGroupByKey
from beam_ext.transforms.late_windowed_gbk import _late_panes_on_spark  # noqa: F401

from tests._late_model import model_panes
from tests.test_late_windowed_gbk import SIZE, TYPED_PAIRS, _pane_row, typed_inputs


def _events(seed: int, n: int):
    rng = random.Random(seed)
    return [(rng.choice(["a", "b", "c"]), round(rng.uniform(0, 60), 3), f"v{i}") for i in range(n)]


def _run(runner, events, budget, expected):
    with beam.Pipeline(runner=runner) as p:
        out = (p | beam.Create(events)
               | beam.Map(lambda e: beam_window.TimestampedValue((e[0], e[2]), e[1]))
               | beam.WindowInto(beam_window.FixedWindows(SIZE))
               | LateWindowedGroupByKey(trigger=EveryNLateEvents(2), cleanup=30.0,
                                        memory_budget_bytes=budget))
        assert_that(out | beam.FlatMap(_pane_row), equal_to(expected))


def test_spark_equals_direct_and_model(spark):
    events = _events(3, 120)
    transcript = [("add", k, ts, v) for k, ts, v in events]
    expected, _ = model_panes(transcript, SIZE, "every", 2, 30.0)
    assert all(row[5] == "ON_TIME" for row in expected)  # bounded input: nothing is late
    # Batch reference: the portable FnApiRunner. (The BundleBasedDirectRunner
    # releases the watermark past timer output when process() emits nothing.)
    _run(FnApiRunner(), events, 64 << 20, expected)
    # A 4 KiB budget forces the spill store to destage to LMDB inside the tasks.
    _run(SparkRunner(), events, 4096, expected)


def test_typed_input(spark):
    with beam.Pipeline(runner=SparkRunner()) as p:
        for i, (pcoll, expected) in enumerate(typed_inputs(p, TYPED_PAIRS)):
            out = pcoll | f"Panes{i}" >> LateWindowedGroupByKey(cleanup=0.0)
            assert_that(out | f"Rows{i}" >> beam.FlatMap(_pane_row), equal_to(expected),
                        label=f"Check{i}")
