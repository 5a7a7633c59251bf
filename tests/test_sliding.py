"""SlidingAggregate as a Beam composite on the DirectRunner."""
from __future__ import annotations

import random

import apache_beam as beam
import pytest
from _sliding_oracle import every_kind, oracle
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing.test_stream import TestStream as _TestStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import TimestampedValue
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_ext import SlidingAggregate, SlidingWindow, agg
from beam_ext.transforms.aggregators import Sum

WINDOWS = {"2s": (2, 0), "5s": (5, 0), "2s_late": (2, 3)}
AGGS = every_kind("amount", "shop")  # every registered kind


def transform(**kw):
    args = dict(key="card", timestamp="ts",
                windows={n: SlidingWindow(s, d) for n, (s, d) in WINDOWS.items()},
                aggregations={n: getattr(agg, k)(f) for n, (k, f) in AGGS.items()})
    args.update(kw)
    return SlidingAggregate(**args)


def payments(seed: int, n: int = 120) -> list[dict]:
    rng = random.Random(seed)
    return [{"id": i, "card": rng.choice("abc"), "ts": float(rng.randint(0, 20)),
             "amount": rng.choice([None, rng.uniform(-10, 100), 1e9 + rng.random()]),
             "shop": rng.choice(["s1", "s2", "s3", None])} for i in range(n)]


def by_id(expected: dict):
    def check(actual):
        got = {e["id"]: f for e, f in actual}
        assert got == expected, {k: (got.get(k), v) for k, v in expected.items() if got.get(k) != v}
    return check


def run_batch(events, expected, runner="BundleBasedDirectRunner", **kw):
    with beam.Pipeline(runner=runner) as p:
        out = p | beam.Create(events) | transform(**kw)
        assert_that(out, by_id(expected))


def test_batch_equals_the_oracle_in_any_input_order(runner="BundleBasedDirectRunner"):
    events = payments(1)
    expected = {e["id"]: f for e, f in zip(events, oracle(events, "card", "ts", WINDOWS, AGGS))}
    shuffled = events[:]
    random.Random(2).shuffle(shuffled)
    run_batch(events, expected, runner)
    run_batch(shuffled, expected, runner)


@settings(max_examples=3, deadline=None, derandomize=True)
@given(st.integers(0, 10_000))
def test_batch_random_data_equals_the_oracle(seed):
    events = payments(seed, 40)
    where = lambda e: e["amount"] is None or e["amount"] < 50  # noqa: E731
    expected = {e["id"]: f for e, f in zip(events, oracle(events, "card", "ts", WINDOWS, AGGS, where))}
    run_batch(events, expected, runner=None, where=where)


def test_default_timestamp_is_the_element_timestamp_and_is_kept():
    events = [{"id": i, "card": "c", "t": t} for i, t in enumerate([10.0, 11.0, 13.5])]
    with beam.Pipeline() as p:
        out = (p | beam.Create(events) | beam.Map(lambda e: TimestampedValue(e, e["t"]))
               | SlidingAggregate(key="card", windows={"3s": SlidingWindow(3)},
                                  aggregations={"n": agg.count()})
               | beam.Map(lambda ef, ts=beam.DoFn.TimestampParam: (ef[0]["id"], ef[1]["n_3s"], float(ts))))
        assert_that(out, equal_to([(0, 1, 10.0), (1, 2, 11.0), (2, 2, 13.5)]))


class _Product:
    fifo_only = False

    def __init__(self):
        self.p = 1.0

    def add(self, x):
        self.p *= x

    def remove(self, x):
        self.p /= x

    def get(self):
        return self.p


class Pay:
    def __init__(self, card, ts, amount):
        self.card, self.ts, self.amount = card, ts, amount


def test_custom_aggregate_and_attribute_fields():
    with beam.Pipeline() as p:
        out = (p | beam.Create([Pay("a", 1.0, 2.0), Pay("a", 2.0, 4.0), Pay("a", 9.0, 0.5)])
               | SlidingAggregate(key="card", timestamp="ts", windows={"5s": SlidingWindow(5)},
                                  aggregations={"prod": agg.custom("amount", _Product),
                                                "sum": agg.custom(lambda e: e.amount, Sum)})
               | beam.Map(lambda ef: (ef[0].ts, ef[1])))
        assert_that(out, equal_to([(1.0, {"prod_5s": 2.0, "sum_5s": 2.0}),
                                   (2.0, {"prod_5s": 8.0, "sum_5s": 6.0}),
                                   (9.0, {"prod_5s": 0.5, "sum_5s": 0.5})]))


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(windows={"w": SlidingWindow(1)}, aggregations={"x": "median"}), ValueError, "unknown aggregation"),
    (dict(windows={"w": SlidingWindow(1)}, aggregations={"a_b": agg.count(), "a": agg.count()},
          extra_windows={"b_w": SlidingWindow(2)}), ValueError, "duplicate feature name 'a_b_w'"),
    (dict(windows={}, aggregations={"n": agg.count()}), ValueError, "windows"),
    (dict(windows={"w": (1, 0)}, aggregations={"n": agg.count()}), TypeError, r"windows\['w'\]"),
    (dict(windows={"w": SlidingWindow(1)}, aggregations={"n": agg.count()}, late_policy="keep"),
     ValueError, "late_policy"),
    (dict(windows={"w": SlidingWindow(1)}, aggregations={"n": agg.count()}, allowed_disorder=-1),
     ValueError, "allowed_disorder"),
    (dict(windows={"w": SlidingWindow(1)}, aggregations={"n": agg.count()}, deterministic=True),
     NotImplementedError, "deterministic=True"),
])
def test_bad_specs_are_rejected_with_the_reason(kwargs, error, match):
    extra = kwargs.pop("extra_windows", None)
    if extra:
        kwargs["windows"] = {**kwargs["windows"], **extra}
    with pytest.raises(error, match=match):
        SlidingAggregate(key="card", **kwargs)


@pytest.mark.parametrize("args, match", [
    ((0,), "size must be > 0"), ((-5,), "size must be > 0"), ((5, -1), "delay must be >= 0"),
    ((float("inf"),), "finite"), (("5m",), "finite number")])
def test_bad_windows(args, match):
    with pytest.raises((ValueError, TypeError), match=match):
        SlidingWindow(*args)


def test_unknown_aggregation_kind():
    with pytest.raises(ValueError, match="unknown aggregation 'median'"):
        agg.AggSpec("median", "x")
    with pytest.raises(ValueError, match="a field is required"):
        agg.AggSpec("sum")


def test_missing_field_names_the_field_and_shows_the_event():
    with pytest.raises(Exception, match=r"agg.sum\('amount'\): event has no field 'amount': \{'card': 'a', 'ts': 1.0\}"):
        with beam.Pipeline() as p:
            _ = p | beam.Create([{"card": "a", "ts": 1.0}]) | SlidingAggregate(
                key="card", timestamp="ts", windows={"w": SlidingWindow(1)},
                aggregations={"s": agg.sum("amount")})


def _late_events(result) -> int:
    counters = result.metrics().query(
        MetricsFilter().with_namespace("beam_ext.sliding").with_name("late_events"))["counters"]
    return sum(c.committed for c in counters)


@pytest.mark.parametrize("policy, expected", [
    ("drop", [(0, 1), (1, 2), (2, 2)]),
    # id 3 (ts 1) is 9 s older than ts 10: rewritten to 10 - 5 = 5, where (0, 5] holds ts 1, 5.
    ("rewrite", [(0, 1), (1, 2), (2, 2), (3, 2)]),
])
def test_streaming_answers_immediately_and_counts_late_events(policy, expected):
    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = True
    stream = (_TestStream()
              .add_elements([{"id": 0, "card": "a", "ts": 1.0}])
              .add_elements([{"id": 1, "card": "a", "ts": 10.0}])
              .add_elements([{"id": 2, "card": "a", "ts": 7.0}])   # out of order, within 5 s
              .add_elements([{"id": 3, "card": "a", "ts": 1.0}])   # late
              .advance_watermark_to_infinity())
    p = beam.Pipeline(runner="BundleBasedDirectRunner", options=options)
    out = (p | stream
           | SlidingAggregate(key="card", timestamp="ts", windows={"w": SlidingWindow(10)},
                              aggregations={"n": agg.count()}, allowed_disorder=5, late_policy=policy)
           | beam.Map(lambda ef: (ef[0]["id"], ef[1]["n_w"])))
    assert_that(out, equal_to(expected))
    p.run().wait_until_finish()


@pytest.mark.parametrize("policy, outputs", [("drop", 2), ("rewrite", 3)])
def test_late_events_are_counted_in_a_metric(policy, outputs):
    # The streaming DirectRunner reports no metrics; the immediate DoFn runs
    # the same way in a batch pipeline when asked to (streaming=True).
    p = beam.Pipeline()
    out = (p | beam.Create([{"card": "a", "ts": 1.0}, {"card": "a", "ts": 10.0}, {"card": "a", "ts": 1.0}])
           | SlidingAggregate(key="card", timestamp="ts", windows={"w": SlidingWindow(10)},
                              aggregations={"n": agg.count()}, allowed_disorder=5, late_policy=policy,
                              streaming=True)
           | beam.combiners.Count.Globally())
    assert_that(out, equal_to([outputs]))
    result = p.run()
    result.wait_until_finish()
    assert _late_events(result) == 1
