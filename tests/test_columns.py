"""Batches held as columns: the elements made from them, a ``Map`` that only picks fields, the Parquet write.

Each columnar route must give exactly what the elements would: a picking
``Map`` on columns what the ``Map`` gives per element, the Parquet write of
columns the tables Beam's ``_RowDictionariesToArrowTable`` makes of the
row dicts.
"""
from __future__ import annotations

import os

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.internal import pickler
from apache_beam.transforms import window
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_ext.runner._element_batches import PAIR, ROW, TUPLE, VALUE, Columns, as_batches, values_per_window, windowed
from beam_ext.runner.native._arrow_rows import row_dicts
from beam_ext.runner.worker import _direct
from beam_ext.runner.worker._projection import project, projection, traceable

_TYPES = {"i": pa.int64(), "f": pa.float64(), "s": pa.string(), "l": pa.list_(pa.int32())}


def _value(kind: str, draw_int: int) -> object:
    if draw_int % 5 == 0:
        return None
    return {"i": draw_int - 50, "f": draw_int / 7 - 3.0, "s": f"v{draw_int % 4}", "l": [draw_int % 3] * (draw_int % 3)}[kind]


_EVENTS = st.integers(0, 30).flatmap(lambda n: st.lists(
    st.tuples(st.integers(0, 99), st.integers(0, 99), st.integers(0, 99), st.integers(0, 99)), min_size=n, max_size=n))


def _pairs_batch(events: list) -> Columns:
    """(event, features) pairs: the events' columns in Arrow (as SlidingAggregate reads them), the features in lists."""
    table = pa.table({name: pa.array([_value(kind, e[k]) for e in events], type=_TYPES[kind])
                      for k, (name, kind) in enumerate((("id", "i"), ("amount", "f"), ("card", "s"), ("tags", "l")))})
    features = (("n", [e[0] % 7 for e in events]), ("mu", [None if e[1] % 4 == 0 else e[1] / 3 for e in events]))
    return Columns((tuple(zip(table.column_names, table.columns)), features), PAIR, len(events))


def test_pairs_are_the_events_row_dicts_and_the_features():
    batch = _pairs_batch([(1, 2, 3, 4), (5, 0, 7, 8)])
    events = [{"id": -49, "amount": 2 / 7 - 3.0, "card": "v3", "tags": [1]}, {"id": None, "amount": None,
                                                                                 "card": "v3", "tags": [2, 2]}]
    assert batch.values() == [(events[0], {"n": 1, "mu": 2 / 3}), (events[1], {"n": 5, "mu": None})]
    assert [wv.value for wv in windowed(batch)] == batch.values()
    assert list(values_per_window([batch])) == batch.values()
    assert [v for b in as_batches([batch]) for v in b.values] == batch.values()


def test_a_group_of_repeated_names_keeps_the_last_value_as_a_row_dict_does():
    table = pa.Table.from_arrays([pa.array([1, 2]), pa.array(["a", "b"])], names=["x", "x"])
    batch = Columns((tuple(zip(table.column_names, table.columns)),), ROW, 2)
    assert batch.values() == row_dicts(table) == [{"x": "a"}, {"x": "b"}]


PICKS = [
    lambda ef: {"id": ef[0]["id"], **ef[1]},
    lambda ef: {**ef[1], "id": ef[0]["id"], "n": ef[0]["card"]},  # a later key wins
    lambda ef: {"tags": ef[0]["tags"], "source": "sliding", "one": 1, "none": None},
]


def _picks_unpacked(ef):
    event, features = ef
    return {"card": event["card"], "mu": features["mu"]}


PICKS.append(_picks_unpacked)


@pytest.mark.parametrize("fn", PICKS, ids=["id and features", "overwritten", "constants", "unpacked"])
@settings(max_examples=30, deadline=None)
@given(events=_EVENTS)
def test_a_picking_map_on_columns_equals_the_map_per_element(fn, events):
    batch = _pairs_batch(events)
    picked_fields = projection(fn, batch.names(), batch.shape)
    assert picked_fields is not None
    picked = project(picked_fields, batch)
    assert picked.shape == ROW and picked.size == batch.size
    assert repr(picked.values()) == repr([fn(v) for v in batch.values()])


_OFFSET = 1


@pytest.mark.parametrize("fn", [
    lambda ef: {"n": ef[1]["n"] * 2},  # arithmetic
    lambda ef: {"big": ef[1]["n"] == 3},  # a comparison
    lambda ef: {"n": ef[1]["n"] if ef[0]["id"] else 0},  # a branch on a value
    lambda ef: {"none": ef[1]["mu"] is None},  # identity
    lambda ef: {"id": f"{ef[0]['id']}"},  # formatting
    lambda ef: {"id": ef[0]["id"] + _OFFSET},  # a global
    lambda ef: {"id": len(ef[0])},  # a call
    lambda ef: {"id": ef[0].get("id")},  # an attribute
    lambda ef: ef[1],  # the dict itself, not a new one
    lambda ef: (),  # an empty tuple
    lambda ef: [ef[0]["id"], ef[1]["n"]],  # a list
    lambda ef: {"x": ef[0]["missing"]},  # a missing key: fails per element
    lambda ef: {"ids": [ef[0]["id"]]},  # a list of values
    lambda ef, d=1: {"id": ef[0]["id"]},  # a default
], ids=["arithmetic", "comparison", "branch", "identity", "format", "global", "call", "attribute", "same dict",
        "empty tuple", "list of fields", "missing key", "list", "default"])
def test_anything_but_picking_runs_per_element(fn):
    batch = _pairs_batch([(1, 2, 3, 4)])
    assert projection(fn, batch.names(), batch.shape) is None


TUPLES = [
    (PAIR, lambda ef: (ef[0]["id"], ef[1]["n"])),
    (PAIR, lambda ef: (ef[0]["card"], 1, None)),
    (ROW, lambda r: (r["card"], r["amount"])),  # a Parquet row keyed for a CombinePerKey
    (TUPLE, lambda kv: (kv[1], kv[0])),
    (ROW, lambda r: r["tags"]),  # one field's value
    (PAIR, lambda ef: ef[1]["mu"]),
    (TUPLE, lambda kv: kv[0]),
]


@pytest.mark.parametrize("shape, fn", TUPLES, ids=["pair to tuple", "constants", "row to key-value", "swap",
                                                  "row to value", "pair to value", "tuple to value"])
@settings(max_examples=30, deadline=None)
@given(events=_EVENTS)
def test_a_map_to_a_tuple_or_a_value_of_fields_on_columns_equals_the_map_per_element(shape, fn, events):
    batch = _pairs_batch(events)
    if shape == ROW:
        batch = Columns(batch.groups[:1], ROW, batch.size)
    elif shape == TUPLE:
        batch = project(projection(lambda ef: (ef[0]["card"], ef[1]["n"]), batch.names(), PAIR), batch)
        assert batch.shape == TUPLE
    picked = projection(fn, batch.names(), batch.shape)
    assert picked is not None and picked[0] in (TUPLE, VALUE)
    out = project(picked, batch)
    assert repr(out.values()) == repr([fn(v) for v in batch.values()])


def test_only_code_that_cannot_tell_a_stand_in_is_traced():
    assert traceable(lambda ef: {"id": ef[0]["id"]})
    assert not traceable(lambda ef: {"id": str(ef[0]["id"])})
    assert not traceable(len)
    assert not traceable(lambda ef: {"n": [x for x in ef]})  # a nested code object


def _map_chain(*fns) -> _direct.DirectChain:
    steps = tuple(_direct.DirectStep(f"M{i}", pickler.dumps((beam.Map(fn).fn, (), {}, None, None)),
                                     window.GlobalWindows()) for i, fn in enumerate(fns))
    return _direct.DirectChain(steps, None, None)


def test_a_chain_hands_on_picked_columns_and_makes_elements_for_a_step_after():
    batch = _pairs_batch([(1, 2, 3, 4), (5, 0, 7, 8), (9, 9, 9, 9)])
    pick = PICKS[0]
    [out] = list(_direct.run_direct_chain(_map_chain(pick), None, iter([batch]), [], batches_out=True))
    assert type(out) is Columns and out.values() == [pick(v) for v in batch.values()]
    after = list(_direct.run_direct_chain(_map_chain(pick, len), None, iter([batch]), [], batches_out=True))
    [ids] = list(_direct.run_direct_chain(_map_chain(lambda ef: ef[0]["id"]), None, iter([batch]), [],
                                          batches_out=True))
    assert type(ids) is Columns and ids.shape == VALUE and ids.values() == [-49, None, -41]
    assert [v for b in after for v in b.values] == [len(pick(v)) for v in batch.values()]
    elements = list(_direct.run_direct_chain(_map_chain(pick), None, iter([batch]), []))
    assert [wv.value for wv in elements] == [pick(v) for v in batch.values()]


def test_a_picking_map_missing_a_key_fails_naming_its_step():
    batch = _pairs_batch([(1, 2, 3, 4)])
    with pytest.raises(_direct.StepFailed, match=r"(?s)KeyError: 'missing'.*\[while running 'M0'\]"):
        list(_direct.run_direct_chain(_map_chain(lambda ef: {"x": ef[0]["missing"]}), None, iter([batch]), [],
                                      batches_out=True))


# -- the Parquet write ------------------------------------------------------------
_OUT = pa.schema([pa.field("id", pa.int64()), pa.field("n", pa.float64()),  # n: ints written as doubles
                  pa.field("mu", pa.float64()), pa.field("card", pa.string()), pa.field("tags", pa.list_(pa.int64())),
                  pa.field("absent", pa.string())])


def _beams_tables(schema, buffer_size, batch_size, rows) -> list:
    from apache_beam.io.parquetio import _RowDictionariesToArrowTable
    from apache_beam.transforms.window import GlobalWindow

    convert = _RowDictionariesToArrowTable(schema, buffer_size, batch_size)
    tables = [t for row in rows for t in convert.process(row, w=GlobalWindow())]
    return tables + [wv.value for wv in convert.finish_bundle()]


@settings(max_examples=40, deadline=None)
@given(parts=st.lists(_EVENTS, min_size=1, max_size=3), batch=st.integers(1, 12), buffer_size=st.integers(1, 2000))
def test_columns_become_beams_record_batches_and_tables(parts, batch, buffer_size):
    from beam_ext.runner.native._parquetio import _column_tables

    # ids as they are (int64, where none is null), the rest converted (ints to doubles, list<int32> to
    # list<int64>, strings), a field absent.
    def pick(ef):
        return {"id": ef[0]["id"], "card": ef[0]["card"], "tags": ef[0]["tags"], **ef[1]}
    batches = [project(projection(pick, b.names(), PAIR), b) for b in map(_pairs_batch, parts)]
    rows = [row for b in batches for row in b.values()]
    want = _beams_tables(_OUT, buffer_size, batch, rows)
    got = list(_column_tables(_OUT, buffer_size, batch, batches))
    assert [t.num_rows for t in got] == [t.num_rows for t in want]
    assert [[b.num_rows for b in t.to_batches()] for t in got] == [[b.num_rows for b in t.to_batches()] for t in want]
    assert all(a.equals(b) for a, b in zip(got, want))


def test_columns_missing_a_required_field_are_written_from_their_rows():
    from beam_ext.runner.native._parquetio import _column_tables

    required = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("x", pa.int64(), nullable=False)])
    batch = project(projection(PICKS[0], _pairs_batch([]).names(), PAIR), _pairs_batch([(1, 2, 3, 4)]))
    assert _column_tables(required, 100, 10, [batch]) is None  # Beam's KeyError comes from the rows


def _written_rows(runner, build, out: str) -> list[dict]:
    """The rows ``build(p, out)`` writes as Parquet files under ``out`` on ``runner``, by id."""
    with beam.Pipeline(runner=runner) as p:
        build(p, out)
    files = [os.path.join(os.path.dirname(out), f) for f in os.listdir(os.path.dirname(out))]
    return sorted(pa.concat_tables([pq.read_table(f) for f in files]).to_pylist(), key=lambda r: r["id"])


@pytest.mark.usefixtures("spark")
@pytest.mark.parametrize("pick", ["picks", "computes"])
def test_sliding_aggregate_then_a_map_to_parquet_equals_direct_runner(tmp_path, pick):
    import random

    from beam_ext.runner import SparkRunner
    from beam_ext.transforms import SlidingAggregate, SlidingWindow, agg

    rng = random.Random(3)
    events = pa.table({"id": list(range(300)), "card": [rng.choice(["a", "b", "c"]) for _ in range(300)],
                       "ts": [rng.randint(0, 200) / 4 for _ in range(300)],
                       "amount": [rng.choice([None, rng.uniform(0, 9)]) for _ in range(300)]})
    path = str(tmp_path / "events.parquet")
    pq.write_table(events, path, row_group_size=70)
    schema = pa.schema([("id", pa.int64()), ("n_w", pa.int64()), ("s_w", pa.float64()), ("src", pa.string()),
                        ("card", pa.string())])
    fn = ((lambda ef: {"id": ef[0]["id"], "src": "x", **ef[1]}) if pick == "picks"
          else (lambda ef: {"id": ef[0]["id"], "n_w": ef[1]["n_w"] * 2, "s_w": ef[1]["s_w"], "card": ef[0]["card"]}))

    def build(p, out):
        _ = (p | beam.io.ReadFromParquet(path)
             | SlidingAggregate(key="card", timestamp="ts", windows={"w": SlidingWindow(10)},
                                aggregations={"n": agg.count(), "s": agg.sum("amount")})
             | beam.Map(fn) | beam.io.WriteToParquet(out, schema, record_batch_size=40))

    got = _written_rows(SparkRunner(), build, str(tmp_path / "spark" / "out"))
    assert len(got) == 300
    assert got == _written_rows("DirectRunner", build, str(tmp_path / "direct" / "out"))


@pytest.mark.usefixtures("spark")
@pytest.mark.parametrize("pick", ["picks", "copies"])
def test_parquet_read_then_picked_and_written_equals_direct_runner(tmp_path, pick):
    # ReadFromParquet hands its tables on as columns too: a picking Map and the write take them as they are.
    import random

    from beam_ext.runner import SparkRunner

    rng = random.Random(5)
    where = pa.struct([("x", pa.int32()), ("y", pa.int32())])
    rows = [{"id": i, "name": rng.choice(["a", None]), "score": rng.choice([None, rng.uniform(-1, 1)]),
             "tags": rng.choice([[], ["t"], None]), "where": rng.choice([None, {"x": i % 5, "y": 1}])}
            for i in range(400)]
    schema = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64()),
                        ("tags", pa.list_(pa.string())), ("where", where)])
    path = str(tmp_path / "rows.parquet")
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, row_group_size=90)
    out_schema = (pa.schema([("id", pa.int64()), ("score", pa.float64()), ("where", where), ("kind", pa.string())])
                  if pick == "picks" else schema)

    def build(p, out):
        read = p | beam.io.ReadFromParquet(path)
        if pick == "picks":
            read = read | beam.Map(lambda r: {"score": r["score"], "id": r["id"], "where": r["where"], "kind": "k"})
        _ = read | beam.io.WriteToParquet(out, out_schema, record_batch_size=64)

    got = _written_rows(SparkRunner(), build, str(tmp_path / "spark" / "out"))
    assert len(got) == 400
    assert got == _written_rows("DirectRunner", build, str(tmp_path / "direct" / "out"))


@pytest.mark.usefixtures("spark")
def test_parquet_rows_keyed_by_a_tuple_map_and_combined_equal_direct_runner(tmp_path):
    from pipeline_outputs import spark_equals_direct

    rows = [{"id": i, "name": ["a", "b", None][i % 3], "score": i / 8} for i in range(300)]
    path = str(tmp_path / "rows.parquet")
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=70)

    def build(p):
        return (p | beam.io.ReadFromParquet(path) | beam.Map(lambda r: (r["name"], r["id"]))
                | beam.CombinePerKey(sum) | beam.Map(list))
    got = spark_equals_direct(build, tmp_path)
    assert sorted(map(tuple, got), key=repr) == sorted(
        [("a", sum(range(0, 300, 3))), ("b", sum(range(1, 300, 3))), (None, sum(range(2, 300, 3)))], key=repr)


@pytest.mark.usefixtures("spark")
def test_parquet_rows_mapped_to_one_field_and_summed_equal_direct_runner(tmp_path):
    from pipeline_outputs import spark_equals_direct

    path = str(tmp_path / "rows.parquet")
    pq.write_table(pa.Table.from_pylist([{"id": i, "score": i / 8} for i in range(300)]), path, row_group_size=70)

    def build(p):
        return p | beam.io.ReadFromParquet(path) | beam.Map(lambda r: r["score"]) | beam.CombineGlobally(sum)
    assert spark_equals_direct(build, tmp_path) == [sum(i / 8 for i in range(300))]
