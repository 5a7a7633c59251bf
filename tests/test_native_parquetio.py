"""Parquet IO on SparkRunner's native path gives Beam's results.

Oracles: pyarrow's own reading of the files (what Beam's ``_ParquetSource``
does per row group) for reads, DirectRunner's files for writes, and
DirectRunner for a whole ReadFromParquet -> SlidingAggregate -> WriteToParquet
pipeline, where the read hands SlidingAggregate Arrow tables.
"""
from __future__ import annotations

import glob
import json
import logging
import os
import random

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_ext import SlidingAggregate, SlidingWindow, agg
from beam_ext.runner import SparkRunner
from beam_ext.runner.native import NativeContext
from beam_ext.runner.native._parquetio import (
    READ_PARQUET_BATCHED_URN,
    READ_PARQUET_URN,
    WRITE_PARQUET_BATCHED_URN,
    WRITE_PARQUET_URN,
    ParquetReadConfig,
    read_tables,
)

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("score", pa.float64()),
                    ("tags", pa.list_(pa.string())), ("where", pa.struct([("x", pa.int32()), ("y", pa.int32())]))])


def _rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"id": i, "name": rng.choice(["a", "b", None]), "score": rng.choice([None, rng.uniform(-1, 1)]),
             "tags": rng.choice([[], ["t1"], ["t1", "t2"], None]),
             "where": rng.choice([None, {"x": rng.randint(0, 9), "y": rng.randint(0, 9)}])} for i in range(n)]


def _write_files(directory, sizes: list[int], row_group_size: int = 40) -> list[dict]:
    """Files of ``sizes`` rows (several row groups each); returns every row."""
    os.makedirs(directory, exist_ok=True)
    every = []
    for f, n in enumerate(sizes):
        rows = [dict(r, id=r["id"] + 1000 * f) for r in _rows(n, seed=f)]
        pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), os.path.join(directory, f"part-{f}.parquet"),
                       row_group_size=row_group_size)
        every += rows
    return every


def _by_id(rows) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True) for r in rows)


def test_read_gives_beams_row_dicts(spark, tmp_path, caplog):
    rows = _write_files(tmp_path / "in", [130, 0, 55])
    with caplog.at_level(logging.INFO, logger="beam_ext.runner"):
        with beam.Pipeline(runner=SparkRunner()) as p:
            got = p | beam.io.ReadFromParquet(str(tmp_path / "in" / "*.parquet")) | beam.Map(json.dumps, sort_keys=True)
            assert_that(got, equal_to(_by_id(rows)))
    assert f"runs Spark-natively ({READ_PARQUET_URN})" in caplog.text


def test_read_columns_and_batched_tables(spark, tmp_path, caplog):
    rows = _write_files(tmp_path / "in", [90, 33], row_group_size=25)
    pattern = str(tmp_path / "in" / "*.parquet")
    with caplog.at_level(logging.INFO, logger="beam_ext.runner"):
        with beam.Pipeline(runner=SparkRunner()) as p:
            some = p | beam.io.ReadFromParquet(pattern, columns=["id", "tags"]) | beam.Map(json.dumps, sort_keys=True)
            assert_that(some, equal_to(_by_id({"id": r["id"], "tags": r["tags"]} for r in rows)), label="columns")
            tables = p | beam.io.ReadFromParquetBatched(pattern)
            # One table per row group, as Beam's source yields them.
            assert_that(tables | beam.Map(lambda t: t.num_rows), equal_to([25, 25, 25, 15, 25, 8]), label="groups")
            assert_that(tables | beam.FlatMap(lambda t: t.to_pylist()) | "Json" >> beam.Map(json.dumps, sort_keys=True),
                        equal_to(_by_id(rows)), label="rows")
    assert f"runs Spark-natively ({READ_PARQUET_BATCHED_URN})" in caplog.text


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(1, 120), min_size=1, max_size=4), group=st.integers(1, 50),
       parallelism=st.integers(1, 7), split_row_groups=st.booleans())
def test_any_split_reads_every_row_once(spark, tmp_path_factory, sizes, group, parallelism, split_row_groups):
    directory = tmp_path_factory.mktemp("split")
    rows = _write_files(directory, sizes, row_group_size=group)
    ctx = NativeContext(sc=spark.sparkContext, parallelism=parallelism, step_name="read", counter=None)
    config = ParquetReadConfig(pattern=str(directory / "*.parquet"), columns=None, compression_type="auto")
    rdd = read_tables(config, ctx, split_row_groups)
    tables = rdd.collect()
    assert _by_id(r for t in tables for r in t.to_pylist()) == _by_id(rows)
    if not split_row_groups:  # ReadFromParquetBatched: Beam's tables, one per row group
        assert sorted(t.num_rows for t in tables) == sorted(
            min(group, n - i) for n in sizes for i in range(0, n, group))
    elif len(sizes) == 1 and group >= sizes[0] and parallelism > 1 and sizes[0] > 1:
        # One file of one row group: read by several tasks once the group's
        # data outweighs a task's share of the file (a tiny file is mostly footer).
        [path] = directory.glob("*.parquet")
        if pq.ParquetFile(path).metadata.row_group(0).total_byte_size > -(-path.stat().st_size // parallelism):
            assert rdd.getNumPartitions() > 1


def test_one_row_group_is_read_by_several_tasks_with_beams_rows(spark, tmp_path):
    rows = _write_files(tmp_path, [1000], row_group_size=1000)
    with beam.Pipeline("DirectRunner") as p:
        assert_that(p | beam.io.ReadFromParquet(str(tmp_path / "*.parquet")) | beam.Map(json.dumps, sort_keys=True),
                    equal_to(_by_id(rows)))
    with beam.Pipeline(runner=SparkRunner()) as p:
        assert_that(p | beam.io.ReadFromParquet(str(tmp_path / "*.parquet")) | beam.Map(json.dumps, sort_keys=True),
                    equal_to(_by_id(rows)))


def test_small_files_share_tasks_and_each_row_is_read_once(spark, tmp_path):
    rows = _write_files(tmp_path, [3 + i % 4 for i in range(30)])
    config = ParquetReadConfig(pattern=str(tmp_path / "*.parquet"), columns=None, compression_type="auto")
    ctx = NativeContext(sc=spark.sparkContext, parallelism=2, step_name="Read", counter=None)
    rdd = read_tables(config, ctx, split_row_groups=True)
    assert rdd.getNumPartitions() <= 3
    assert _by_id(r for t in rdd.collect() for r in t.to_pylist()) == _by_id(rows)


def test_a_pattern_matching_nothing_reads_nothing_as_on_beam(spark, tmp_path, caplog):
    # Beam fails at construction with validate=True; with validate=False its read yields no row.
    pattern = str(tmp_path / "nothing*.parquet")
    with pytest.raises(OSError, match="No files found"):
        beam.io.ReadFromParquet(pattern)
    for runner in ("DirectRunner", SparkRunner()):
        with caplog.at_level(logging.WARNING, logger="beam_ext.runner"):
            with beam.Pipeline(runner=runner) as p:
                rows = p | beam.io.ReadFromParquet(pattern, validate=False)
                assert_that(rows | beam.combiners.Count.Globally(), equal_to([0]))
    assert f"the pattern {pattern!r} matches no file" in caplog.text


def _write(runner, rows, prefix: str, **kw) -> None:
    with beam.Pipeline(runner=runner) as p:
        _ = p | beam.Create(rows) | beam.io.WriteToParquet(prefix, SCHEMA, **kw)


def _files(prefix: str) -> list[str]:
    return sorted(glob.glob(prefix + "*"))


def test_write_gives_beams_rows_names_and_codec(spark, tmp_path, caplog):
    rows = _rows(300, seed=3)
    for runner in ("DirectRunner", SparkRunner()):
        name = "spark" if not isinstance(runner, str) else "direct"
        with caplog.at_level(logging.INFO, logger="beam_ext.runner"):
            _write(runner, rows, str(tmp_path / name / "out"), num_shards=3, codec="gzip",
                   file_name_suffix=".parquet", record_batch_size=7)
    spark_files, direct_files = _files(str(tmp_path / "spark" / "out")), _files(str(tmp_path / "direct" / "out"))
    assert [os.path.basename(f) for f in spark_files] == [os.path.basename(f) for f in direct_files]
    assert [os.path.basename(f) for f in spark_files] == [f"out-0000{i}-of-00003.parquet" for i in range(3)]
    read = [r for f in spark_files for r in pq.read_table(f).to_pylist()]
    assert _by_id(read) == _by_id(r for f in direct_files for r in pq.read_table(f).to_pylist()) == _by_id(rows)
    assert pq.ParquetFile(spark_files[0]).metadata.row_group(0).column(0).compression == "GZIP"
    assert pq.read_schema(spark_files[0]) == SCHEMA
    assert f"runs Spark-natively ({WRITE_PARQUET_URN})" in caplog.text


def test_write_missing_fields_and_empty_input_as_beam(spark, tmp_path):
    # A missing nullable field is written as null, as Beam's converter does.
    rows = [{"id": 1, "name": "x"}, {"id": 2}]
    _write(SparkRunner(), rows, str(tmp_path / "missing" / "out"))
    got = [r for f in _files(str(tmp_path / "missing" / "out")) for r in pq.read_table(f).to_pylist()]
    assert sorted(got, key=lambda r: r["id"]) == [
        {"id": 1, "name": "x", "score": None, "tags": None, "where": None},
        {"id": 2, "name": None, "score": None, "tags": None, "where": None}]
    for runner, name in (("DirectRunner", "direct"), (SparkRunner(), "spark")):
        _write(runner, [], str(tmp_path / "empty" / name / "out"))
    assert len(_files(str(tmp_path / "empty" / "spark" / "out"))) == len(
        _files(str(tmp_path / "empty" / "direct" / "out")))


def test_write_batched_tables(spark, tmp_path, caplog):
    rows = _rows(60, seed=4)
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    with caplog.at_level(logging.INFO, logger="beam_ext.runner"):
        with beam.Pipeline(runner=SparkRunner()) as p:
            _ = (p | beam.Create([table.slice(0, 25), table.slice(25)])
                 | beam.io.WriteToParquetBatched(str(tmp_path / "out"), SCHEMA))
    got = [r for f in _files(str(tmp_path / "out")) for r in pq.read_table(f).to_pylist()]
    assert _by_id(got) == _by_id(rows)
    assert f"runs Spark-natively ({WRITE_PARQUET_BATCHED_URN})" in caplog.text


def test_beam_rows_keep_beams_path(spark, tmp_path, caplog):
    _write_files(tmp_path / "in", [20])
    with caplog.at_level(logging.INFO):
        with beam.Pipeline(runner=SparkRunner()) as p:
            got = (p | beam.io.ReadFromParquet(str(tmp_path / "in" / "*.parquet"), as_rows=True, columns=["id"])
                   | beam.Map(lambda r: r.id))
            assert_that(got, equal_to(list(range(20))))
    assert "it reads Beam rows (as_rows=True); running Beam's ReadFromParquet" in caplog.text


PAYMENTS = pa.schema([("id", pa.int64()), ("card", pa.string()), ("ts", pa.float64()), ("amount", pa.float64())])
FEATURES = pa.schema([("id", pa.int64()), ("n_5s", pa.int64()), ("sum_5s", pa.float64()), ("sum_30s", pa.float64()),
                      ("n_30s", pa.int64())])


def _features(runner, path: str, out: str) -> list[str]:
    with beam.Pipeline(runner=runner) as p:
        _ = (p | beam.io.ReadFromParquet(path)
             | SlidingAggregate(key="card", timestamp="ts",
                                windows={"5s": SlidingWindow(5), "30s": SlidingWindow(30)},
                                aggregations={"n": agg.count(), "sum": agg.sum("amount")})
             | beam.Map(lambda ef: {"id": ef[0]["id"], **ef[1]})
             | beam.io.WriteToParquet(out, FEATURES))
    return _by_id(r for f in _files(out) for r in pq.read_table(f).to_pylist())


def test_parquet_to_sliding_aggregate_to_parquet_equals_direct_runner(spark, tmp_path, caplog):
    rng = random.Random(9)
    rows = [{"id": i, "card": rng.choice(["a", "b", "c", None]), "ts": rng.randint(0, 400) / 4,
             "amount": rng.choice([None, rng.uniform(0, 100)])} for i in range(500)]
    path = str(tmp_path / "payments.parquet")
    pq.write_table(pa.Table.from_pylist(rows, schema=PAYMENTS), path, row_group_size=120)
    with caplog.at_level(logging.INFO, logger="beam_ext.runner"):
        got = _features(SparkRunner(), path, str(tmp_path / "spark" / "features"))
    assert len(got) == len(rows)
    assert got == _features("DirectRunner", path, str(tmp_path / "direct" / "features"))
    for urn in (READ_PARQUET_URN, WRITE_PARQUET_URN):
        assert f"runs Spark-natively ({urn})" in caplog.text
    assert "reads its input's Arrow tables by column" in caplog.text


def _beams_tables(schema, buffer_size, batch_size, rows) -> list:
    from apache_beam.io.parquetio import _RowDictionariesToArrowTable
    from apache_beam.transforms.window import GlobalWindow

    convert = _RowDictionariesToArrowTable(schema, buffer_size, batch_size)
    tables = [t for row in rows for t in convert.process(row, w=GlobalWindow())]
    return tables + [wv.value for wv in convert.finish_bundle()]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(0, 120), batch=st.integers(1, 30), buffer_size=st.integers(1, 3000), seed=st.integers(0, 99))
def test_rows_become_beams_record_batches_and_tables(n, batch, buffer_size, seed):
    from beam_ext.runner.native._parquetio import _row_tables

    rows = _rows(n, seed)
    rows = [{k: v for k, v in r.items() if k != "tags" or i % 3} for i, r in enumerate(rows)]  # some missing
    want = _beams_tables(SCHEMA, buffer_size, batch, rows)
    got = list(_row_tables(SCHEMA, buffer_size, batch, iter(rows)))
    assert [t.num_rows for t in got] == [t.num_rows for t in want]
    assert [[b.num_rows for b in t.to_batches()] for t in got] == [[b.num_rows for b in t.to_batches()] for t in want]
    assert all(a.equals(b) for a, b in zip(got, want))


def test_a_required_field_missing_fails_as_on_beam():
    from beam_ext.runner.native._parquetio import _row_tables

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    with pytest.raises(KeyError, match="id"):
        _beams_tables(schema, 100, 10, [{"x": 1}])
    with pytest.raises(KeyError, match="id"):
        list(_row_tables(schema, 100, 10, iter([{"x": 1}])))
