"""SlidingAggregate's columnar route on SparkRunner: Arrow tables in, equal to the element route.

A native Parquet read hands SlidingAggregate its rows as Arrow tables
(``ArrowRows``). The columnar route must give every event the features the
element route gives the same rows as dicts, whatever the column types (a
type it cannot read by column goes row by row), the cut of the rows into
tables and the number of partitions; and raise the same errors.
"""
from __future__ import annotations

import math
import random

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_ext import SlidingWindow, agg
from beam_ext.runner._element_batches import ElementBatches
from beam_ext.runner.native import ArrowRows
from beam_ext.runner.native._sliding import sliding_on_arrow_rows, sliding_on_rdd
from beam_ext.transforms.sliding._plan import _Plan

WINDOWS = {"3s": SlidingWindow(3), "8s_d1": SlidingWindow(8, 1)}
AGGS = {"n": agg.count(), "total": agg.sum("amount"), "mu": agg.mean("amount"), "top": agg.max("amount"),
        "shops": agg.count_distinct("shop")}


def _plan(key="card", timestamp="ts", **kw):
    return _Plan(key, timestamp, WINDOWS, kw.pop("aggs", AGGS), kw.pop("where", None))


def _table(rows: list[dict], schema: pa.Schema | None = None) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schema)


def _features(out) -> dict:
    rdd = out.elements() if isinstance(out, ElementBatches) else out
    # repr: NaN keys and features compare equal to themselves
    return {wv.value[0]["id"]: repr((wv.value[0], wv.value[1], wv.timestamp, wv.windows)) for wv in rdd.collect()}


def _both(spark, plan, tables, partitions=3):
    rows = ArrowRows(spark.sparkContext.parallelize(tables, max(1, len(tables))))
    columnar = _features(sliding_on_arrow_rows(plan, rows, partitions))
    by_element = _features(sliding_on_rdd(plan, rows.values(), partitions))
    return columnar, by_element


def _rows(seed: int, n: int, card=None) -> list[dict]:
    rng = random.Random(seed)
    return [{"id": i, "card": (card or (lambda: rng.choice(["a", "b", "c", None])))(),
             "ts": rng.randint(0, 40) / 4, "amount": rng.choice([None, rng.uniform(-9, 9), 3, 1e12]),
             "shop": rng.choice(["s1", "s2", None])} for i in range(n)]


def test_columns_give_the_features_the_row_dicts_give(spark):
    rows = _rows(1, 300)
    schema = pa.schema([("id", pa.int64()), ("card", pa.string()), ("ts", pa.float64()),
                        ("amount", pa.float64()), ("shop", pa.string())])
    tables = [_table(rows[i:i + 70], schema) for i in range(0, len(rows), 70)]
    columnar, by_element = _both(spark, _plan(), tables)
    assert len(columnar) == len(rows)
    assert columnar == by_element


@pytest.mark.parametrize("card, ts", [
    (lambda rng: rng.choice([1, 2, 3]), lambda rng: rng.randint(0, 30)),  # integer key and time columns
    (lambda rng: rng.choice([1.0, math.nan, -0.0, 0.0]), lambda rng: rng.randint(0, 30) / 2),  # float key: by rows
    (lambda rng: rng.choice([True, False]), lambda rng: rng.randint(0, 30) / 2),
], ids=["int", "float-key", "bool-key"])
def test_every_key_and_time_type_groups_as_by_encoding(spark, card, ts):
    rng = random.Random(3)
    rows = [{"id": i, "card": card(rng), "ts": ts(rng), "amount": rng.uniform(0, 5), "shop": "s"} for i in range(200)]
    columnar, by_element = _both(spark, _plan(), [_table(rows[:120]), _table(rows[120:])])
    assert columnar == by_element


def test_types_read_row_by_row_still_agree(spark):
    # Decimal amounts and a struct key: the columnar route reads them as the
    # element route does, row by row.
    import decimal

    rng = random.Random(4)
    rows = [{"id": i, "card": {"bank": rng.choice(["x", "y"])}, "ts": float(rng.randint(0, 20)),
             "amount": decimal.Decimal(rng.randint(0, 999)) / 100, "shop": None} for i in range(80)]
    columnar, by_element = _both(spark, _plan(), [_table(rows[:50]), _table(rows[50:])])
    assert len(columnar) == len(rows)
    assert columnar == by_element


def test_a_missing_or_unreadable_field_fails_naming_it(spark):
    rows = [{"id": 1, "card": "a", "ts": 1.0, "shop": "s"}]
    with pytest.raises(Exception, match=r"event has no field 'amount'"):
        _both(spark, _plan(), [_table(rows)])
    rows = [{"id": 1, "card": "a", "ts": None, "amount": 1.0, "shop": "s"}]
    with pytest.raises(Exception, match=r"timestamp: expected seconds as a number, got None"):
        _both(spark, _plan(), [_table(rows, pa.schema([("id", pa.int64()), ("card", pa.string()),
                                                       ("ts", pa.float64()), ("amount", pa.float64()),
                                                       ("shop", pa.string())]))])


def test_no_timestamp_field_uses_the_read_timestamp(spark):
    rows = _rows(6, 50)
    columnar, by_element = _both(spark, _plan(timestamp=None), [_table(rows)])
    assert columnar == by_element


def test_callable_fields_are_not_read_by_column():
    assert _plan().reads_named_fields
    assert not _plan(key=lambda e: e["card"]).reads_named_fields
    assert not _plan(where=lambda e: True).reads_named_fields
    assert not _plan(aggs={"s": agg.sum(lambda e: e["amount"])}).reads_named_fields


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), n=st.integers(1, 120), cut=st.integers(1, 60), partitions=st.integers(1, 5))
def test_any_cut_into_tables_and_partitions_gives_the_same_features(spark, seed, n, cut, partitions):
    rows = _rows(seed, n)
    schema = pa.schema([("id", pa.int64()), ("card", pa.string()), ("ts", pa.float64()),
                        ("amount", pa.float64()), ("shop", pa.string())])
    tables = [_table(rows[i:i + cut], schema) for i in range(0, n, cut)]
    columnar, by_element = _both(spark, _plan(), tables, partitions)
    whole, _ = _both(spark, _plan(), [_table(rows, schema)], 1)
    assert columnar == by_element == whole
