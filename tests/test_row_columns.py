"""Schema rows through a trivial grouping's shuffle as blocks of columns give what RowCoder gives."""
from __future__ import annotations

import collections
import typing

import apache_beam as beam
import numpy as np
import pytest
from apache_beam import coders
from apache_beam.coders import typecoders
from apache_beam.transforms import window
from apache_beam.transforms.core import Windowing
from apache_beam.typehints.row_type import RowTypeConstraint
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_ext.runner._row_columns import RowColumns
from beam_ext.runner._shuffle import GroupReader, KeyedValues, _records
from tests._block_shuffle import BundleConsumer, added, groups_both_ways, shuffled

# (name, type, values of that type, values RowCoder changes or refuses in such a field)
_FIELDS = {
    "i": (int, st.integers(-(1 << 63), (1 << 63) - 1),
          st.sampled_from([True, 1 << 63, -(1 << 63) - 1, None, np.int64(3)])),
    "f": (float, st.floats(allow_nan=False), st.sampled_from([3, np.float64(2.5), None, True])),
    "s": (str, st.text(max_size=4), st.sampled_from(["\ud800", b"x", None])),
    "b": (bytes, st.binary(max_size=4), st.sampled_from([bytearray(b"x"), None])),
    "t": (bool, st.booleans(), st.sampled_from([1, None])),
    "a": (typing.Any, st.integers(-5, 5) | st.floats(allow_nan=False) | st.text(max_size=3) | st.booleans(),
          st.sampled_from([(1, 2), [1], 1 << 70, "\udc00", np.float64(1.0)])),
    # Beam reads `int | None` as its Any type; typing.Optional as a nullable field.
    "oi": (typing.Optional[int], st.integers(-9, 9) | st.none(), st.sampled_from([2.0, 1 << 64])),  # noqa: UP045
    "os": (typing.Optional[str], st.text(max_size=3) | st.none(), st.sampled_from([b"y", "\ud801"])),  # noqa: UP045
}


def _coders(names: list[str]):
    row = typecoders.registry.get_coder(RowTypeConstraint.from_fields([(n, _FIELDS[n][0]) for n in names]))
    value = coders.coders.LengthPrefixCoder(row)
    key = coders.coders.LengthPrefixCoder(coders.VarIntCoder())
    glob = coders.coders.GlobalWindowCoder()
    pre = coders.WindowedValueCoder(coders.TupleCoder([key, value]), glob)
    post = coders.WindowedValueCoder(coders.TupleCoder([key, coders.IterableCoder(value)]), glob)
    return row, value, pre, post


class _Values:
    """An object with a row's fields as attributes, as a user's row may be."""

    def __init__(self, **fields):
        self.__dict__.update(fields)

    def __repr__(self):
        return f"_Values(**{self.__dict__!r})"


@st.composite
def _case(draw):
    names = draw(st.lists(st.sampled_from(sorted(_FIELDS)), min_size=1, max_size=4, unique=True))
    odd = draw(st.booleans())

    def value(name):
        _, good, bad = _FIELDS[name]
        return draw(bad) if odd and draw(st.integers(0, 30)) == 0 else draw(good)

    n = draw(st.integers(0, 120))
    keys = draw(st.integers(1, 12))
    rows = [(draw(st.integers(0, keys - 1)), _Values(**{name: value(name) for name in names})) for _ in range(n)]
    return names, rows


def _groups(reader: GroupReader, post, blobs: list[bytes]) -> dict:
    """The groups as ``read_batches`` gives them, checked against ``read``'s encoding."""
    objects, encoded = groups_both_ways(reader, post, blobs)
    assert _typed(encoded) == _typed(objects)
    return objects


def _typed(groups: dict) -> dict:
    """Each group's rows as ``(class, (type, repr) per field)``, sorted: equal means equal types and values."""
    return {key: sorted((type(row).__qualname__, tuple((type(v).__name__, repr(v)) for v in row)) for row in rows)
            for key, rows in groups.items()}



@settings(max_examples=150, deadline=None)
@given(case=_case(), memory=st.sampled_from([300, 4000, 1 << 20]), sample=st.sampled_from([5, 40, 10 ** 6]),
       reader_memory=st.sampled_from([100, 1 << 20]), cut=st.integers(1, 50), batch=st.booleans())
def test_blocks_give_the_groups_and_errors_row_coder_gives(case, memory, sample, reader_memory, cut, batch):
    """Rows of any plain fields, some with values RowCoder changes (an int in
    a float field) or refuses (None where not nullable, an int past int64, a
    lone surrogate); any flush budget, keys judged not to repeat at any
    point, readers spilled or not, pairs or keys and values apart: the groups of blocks are those of
    RowCoder's encodings, their rows of the same class, values and types,
    read as objects or as encodings; a row RowCoder refuses raises what
    RowCoder raises for it."""
    names, kvs = case
    row_coder, value_coder, pre, post = _coders(names)
    rows = RowColumns.of(value_coder)
    assert rows is not None
    kv = pre.wrapped_value_coder
    encode_key, encode_value = kv.key_coder().get_impl().encode_nested, kv.value_coder().get_impl().encode_nested
    refused = set()  # the errors RowCoder gives the rows it refuses
    for _, v in kvs:
        try:
            encode_value(v)
        except Exception as exc:  # noqa: BLE001 - one of these the blocks' writer must raise
            refused.add(type(exc))
    if refused:
        # Rows are encoded a key at a time, so the first refused row may be another one.
        with pytest.raises(tuple(refused)):
            shuffled(rows, encode_key, encode_value, kvs, memory, sample, cut, batch=batch)
        return
    plain = shuffled(None, encode_key, encode_value, kvs, memory, sample, cut, batch=batch)
    blocks = shuffled(rows, encode_key, encode_value, kvs, memory, sample, cut, batch=batch)
    window_ = Windowing(window.GlobalWindows())
    plain_reader = GroupReader(pre, post, window_, trivial=True, memory_bytes=reader_memory)
    reader = GroupReader(pre, post, window_, trivial=True, memory_bytes=reader_memory, blocks=rows)
    want = _groups(plain_reader, post, plain)
    got = _groups(reader, post, blocks)
    assert _typed(got) == _typed(want)
    assert sorted(got) == sorted({k for k, _ in kvs})
    assert all(type(row) is row_coder.to_type_hint() for values in got.values() for row in values)


def test_a_key_of_many_rows_travels_as_one_block_and_small_keys_as_encodings():
    row_coder, value_coder, pre, post = _coders(["i", "f"])
    rows = RowColumns.of(value_coder)
    kv = pre.wrapped_value_coder
    encode_key, encode_value = kv.key_coder().get_impl().encode_nested, kv.value_coder().get_impl().encode_nested
    kvs = [(0, _Values(i=i, f=i / 2)) for i in range(100)] + [(1, _Values(i=7, f=0.5))]
    blocks = shuffled(rows, encode_key, encode_value, kvs, 1 << 20, 10 ** 6, 1000)
    data = {key: (count, data) for blob in blocks for key, count, data in _records(blob)}
    assert data[encode_key(0)][0] == 100 and data[encode_key(0)][1][0] == 0  # a block: a zero byte first
    assert data[encode_key(1)] == (1, encode_value(kvs[-1][1]))  # RowCoder's length-prefixed encoding
    reader = GroupReader(pre, post, Windowing(window.GlobalWindows()), trivial=True, blocks=rows)
    got = _groups(reader, post, blocks)
    assert got[0] == [row_coder.to_type_hint()(i, i / 2) for i in range(100)]
    assert got[1] == [row_coder.to_type_hint()(7, 0.5)]


def test_only_length_prefixed_rows_of_plain_fields_have_columns():
    _, value_coder, _, _ = _coders(["i", "a", "os"])
    assert RowColumns.of(value_coder) is not None
    assert RowColumns.of(value_coder.value_coder()) is None  # not length-prefixed: the runner's coders always are
    nested = typecoders.registry.get_coder(RowTypeConstraint.from_fields([("xs", typing.List[int])]))  # noqa: UP006
    assert RowColumns.of(coders.coders.LengthPrefixCoder(nested)) is None
    small = typecoders.registry.get_coder(RowTypeConstraint.from_fields([("x", np.int32)]))
    assert RowColumns.of(coders.coders.LengthPrefixCoder(small)) is None
    assert RowColumns.of(coders.coders.LengthPrefixCoder(coders.VarIntCoder())) is None


# -- on Spark ---------------------------------------------------------------

_SCHEMA = RowTypeConstraint.from_fields([("key", int), ("amount", float),
                                         ("name", typing.Optional[str]), ("tag", typing.Any)])  # noqa: UP045


def _row(i: int):
    return beam.Row(key=i % 7, amount=i / 4, name=None if i % 5 == 0 else f"n{i}", tag=i if i % 3 else "x")


def _seen(key, rows):
    """What a consumer of the groups sees: each row's class name and fields."""
    return key, sorted((type(r).__name__.startswith("BeamSchema_"), r.key, r.amount, r.name or "", str(r.tag))
                       for r in rows)



def _pipeline(p):
    return p | beam.Create(range(6000)) | beam.Map(_row).with_output_types(_SCHEMA) | beam.GroupBy("key")


def test_the_plan_shuffles_rows_of_plain_fields_as_blocks():
    from beam_ext.runner.planning import plan_pipeline

    p = beam.Pipeline()
    _pipeline(p) | beam.MapTuple(_seen)
    _ = p | "Other" >> beam.Create([(1, 2)]) | beam.GroupByKey()
    groups = plan_pipeline(p.to_runner_api(), 1 << 20, 2).groups
    assert {spec.step: spec.blocks is not None for spec in groups.values()} == {
        "GroupBy(key)/GroupByKey": True, "GroupByKey": False}


@pytest.mark.usefixtures("spark")
@pytest.mark.parametrize("spark_group_memory,reader", [(1 << 20, "objects"), (4096, "objects"), (4096, "bundles")],
                         ids=["in memory, read as objects", "spilled, read as objects", "spilled, read encoded"])
def test_rows_grouped_on_spark_equal_plain_python(spark_group_memory, reader):
    """``GroupBy("key")`` of rows with int, float, optional str and Any
    fields, read by a stage on objects or by a bundle-processor stage: the
    rows arrive as the schema's named tuples (as RowCoder gives them on
    DirectRunner), with every field's value."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that, equal_to

    from beam_ext.runner import SparkRunner

    expected = collections.defaultdict(list)
    for i in range(6000):
        expected[i % 7].append(_row(i))
    want = sorted(_seen(k, [beam.Row(**vars(r)) for r in rows]) for k, rows in expected.items())
    want = [(k, [(True, *fields) for _, *fields in seen]) for k, seen in want]
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions([f"--spark_group_memory={spark_group_memory}"]))
    grouped = _pipeline(p)
    seen = grouped | (beam.MapTuple(_seen) if reader == "objects" else beam.ParDo(BundleConsumer(_seen)))
    assert_that(seen, equal_to(want))
    p.run().wait_until_finish()


def _bad_row(i: int):
    return beam.Row(key=i % 3, amount=None if i == 41 else float(i))


@pytest.mark.usefixtures("spark")
def test_a_row_its_coder_refuses_fails_the_job_naming_the_grouping_step():
    from beam_ext.runner import SparkRunner

    schema = RowTypeConstraint.from_fields([("key", int), ("amount", float)])
    p = beam.Pipeline(runner=SparkRunner())
    _ = (p | beam.Create(range(100)) | "MakeRows" >> beam.Map(_bad_row).with_output_types(schema)
         | beam.GroupBy("key") | beam.MapTuple(lambda k, rows: len(rows)))
    with pytest.raises(Exception, match=r"(?s)Attempted to encode null for non-nullable field \\?\"amount.*GroupBy"):
        p.run().wait_until_finish()


@settings(max_examples=60, deadline=None)
@given(case=_case(), cut=st.integers(1, 50))
def test_rows_added_apart_from_their_keys_count_the_bytes_added_as_pairs_do(case, cut):
    """``add_batch`` holds each row's fields and counts them against the
    budget, str and bytes by their length, as ``add`` does."""
    names, kvs = case
    _, value_coder, pre, _ = _coders(names)
    kv = pre.wrapped_value_coder
    encode_key, encode_value = kv.key_coder().get_impl().encode_nested, kv.value_coder().get_impl().encode_nested
    pairs, apart = (KeyedValues(1, memory_bytes=1 << 40, blocks=RowColumns.of(value_coder)) for _ in range(2))
    pairs._sample = apart._sample = 0  # keys never judged
    for start in range(0, len(kvs), cut):
        part = kvs[start:start + cut]
        assert added(pairs, part, encode_key, encode_value, False) == []
        assert added(apart, part, encode_key, encode_value, True) == []
    assert (apart._held, apart._count) == (pairs._held, len(kvs))
