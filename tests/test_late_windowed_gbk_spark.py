"""LateWindowedGroupByKey on SparkRunner (spill-store native path) equals DirectRunner."""
from __future__ import annotations

import itertools
import logging
import pickle
import random

import apache_beam as beam
import pytest
from apache_beam import coders
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window as beam_window
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_ext import SlidingAggregate, SlidingWindow, agg
from beam_ext.runner import SparkRunner
from beam_ext.runner.native import NativeContext
from beam_ext.runner.native._lateness import late_panes_on_spark
from beam_ext.transforms import EveryNLateEvents, FixedLateness, LateWindowedGroupByKey
from beam_ext.transforms.lateness._gbk import NATIVE_URN
from tests._late_model import model_panes
from tests.test_late_windowed_gbk import SIZE, TYPED_PAIRS, _pane_row, typed_inputs


def _events(seed: int, n: int):
    rng = random.Random(seed)
    return [(rng.choice(["a", "b", "c"]), round(rng.uniform(0, 60), 3), f"v{i}") for i in range(n)]


def _run(runner, events, budget, expected):
    with beam.Pipeline(runner=runner) as p:
        out, dead = (p | beam.Create(events)
                     | beam.Map(lambda e: beam_window.TimestampedValue((e[0], e[2]), e[1]))
                     | beam.WindowInto(beam_window.FixedWindows(SIZE))
                     | LateWindowedGroupByKey(trigger=EveryNLateEvents(2), cleanup=30.0,
                                              memory_budget_bytes=budget).with_dead_letters())
        assert_that(out | beam.FlatMap(_pane_row), equal_to(expected), label="panes")
        assert_that(dead, equal_to([]), label="dead")


def test_spark_equals_direct_and_model(spark, caplog):
    events = _events(3, 120)
    transcript = [("add", k, ts, v) for k, ts, v in events]
    expected, _ = model_panes(transcript, SIZE, "every", 2, 30.0)
    assert all(row[5] == "ON_TIME" for row in expected)  # bounded input: nothing is late
    # Batch reference: the portable FnApiRunner. (The BundleBasedDirectRunner
    # releases the watermark past timer output when process() emits nothing.)
    _run(FnApiRunner(), events, 64 << 20, expected)
    # A 4 KiB budget forces the spill store to destage to LMDB inside the tasks.
    with caplog.at_level(logging.INFO, logger="beam_ext.runner"):
        _run(SparkRunner(), events, 4096, expected)
    assert f"runs Spark-natively ({NATIVE_URN})" in caplog.text


class _Offsets:
    """A scheduled trigger: late panes at fixed offsets after the window's end."""

    def late_firing_offsets(self, allowed_lateness):
        return [5.0, 20.0]


def _counters(runner, events) -> dict:
    """Counters of LateWindowedGroupByKey's namespace, summed over steps."""
    p = beam.Pipeline(runner=runner)
    _ = (p | beam.Create(events)
         | beam.Map(lambda e: beam_window.TimestampedValue((e[0], e[2]), e[1]))
         | beam.WindowInto(beam_window.FixedWindows(SIZE))
         | LateWindowedGroupByKey(trigger=_Offsets(), cleanup=30.0).with_dead_letters())
    result = p.run()
    result.wait_until_finish()
    totals: dict = {}
    for c in result.metrics().query(MetricsFilter().with_namespace("beam_ext.lateness"))["counters"]:
        totals[c.key.metric.name] = totals.get(c.key.metric.name, 0) + c.committed
    return totals


def test_spark_counts_what_direct_runner_counts(spark, caplog):
    events = _events(5, 40)
    windows = {(k, ts - ts % SIZE) for k, ts, _ in events}
    # Bounded input: nothing is late, and each (key, window) reaches its
    # three firing points (5, 20 and the close at 30) with no late data.
    expected = {"firings_without_new_data": 3 * len(windows)}
    assert _counters("DirectRunner", events) == expected
    with caplog.at_level(logging.INFO, logger="beam_ext.runner"):
        assert _counters(SparkRunner(), events) == expected
    assert f"runs Spark-natively ({NATIVE_URN})" in caplog.text


def test_typed_input(spark):
    with beam.Pipeline(runner=SparkRunner()) as p:
        for i, (pcoll, expected) in enumerate(typed_inputs(p, TYPED_PAIRS)):
            out = pcoll | f"Panes{i}" >> LateWindowedGroupByKey(cleanup=0.0)
            assert_that(out | f"Rows{i}" >> beam.FlatMap(_pane_row), equal_to(expected),
                        label=f"Check{i}")


class _CountingLateness(FixedLateness):
    """FixedLateness counting, per Python process, the on-time firings (each asks it)."""

    asked = 0

    def allowed_lateness(self) -> float:
        _CountingLateness.asked += 1
        return super().allowed_lateness()


def _window_values(i: int) -> list[WindowedValue]:
    window = beam_window.IntervalWindow(i * SIZE, (i + 1) * SIZE)
    return [WindowedValue(("k", f"v{i}-{j}"), Timestamp(i * SIZE + j), [window]) for j in range(3)]


def _firings_when_each_output_arrives(outputs):
    # Pipelined with the native path in the same Python worker: pulls its
    # outputs one by one and notes how many windows had fired by then.
    yield [(output.value[1][0], _CountingLateness.asked) for output in outputs]


def test_native_path_streams_panes_as_windows_fire(spark):
    # The docs promise a task's memory bounded by the spill store's budget:
    # each pane must leave the task before the next window fires, not wait
    # in a list until the whole partition has fired.
    n_windows = 20
    config = (EveryNLateEvents(1), _CountingLateness(0.0), 1 << 20,
              coders.StrUtf8Coder(), coders.StrUtf8Coder())
    ctx = NativeContext(sc=spark.sparkContext, parallelism=1, step_name="Panes",
                        counter=lambda namespace, name: None)
    events = spark.sparkContext.parallelize(range(n_windows), 2).flatMap(_window_values)
    panes = late_panes_on_spark(pickle.dumps(config), events, ctx)
    [seen] = panes.mapPartitions(_firings_when_each_output_arrives).collect()
    assert [key for key, _ in seen] == ["k"] * n_windows
    fired = [asked for _, asked in seen]
    assert [b - a for a, b in itertools.pairwise(fired)] == [1] * (n_windows - 1)


class _Card:
    """A key type with no deterministic encoding (no coder, no __setstate__)."""

    def __init__(self, number: int) -> None:
        self.number = number


def _native_step(name: str) -> beam.PTransform:
    if name == "LateWindowedGroupByKey":
        return (beam.Map(lambda e: beam_window.TimestampedValue((_Card(e), e), e))
                | LateWindowedGroupByKey())
    return SlidingAggregate(key=lambda e: _Card(e), windows={"w": SlidingWindow(5)},
                            aggregations={"n": agg.count()})


@pytest.mark.parametrize("name", ["LateWindowedGroupByKey", "SlidingAggregate"])
def test_key_without_deterministic_encoding_fails_naming_the_step(spark, name):
    # Grouping by a pickled key could split it: the native paths refuse it, as GroupByKey does.
    with pytest.raises(Exception, match=rf"(?s)step '{name}.*Unable to deterministically encode"):
        with beam.Pipeline(runner=SparkRunner()) as p:
            _ = p | beam.Create([1, 2, 3]) | name >> _native_step(name)
