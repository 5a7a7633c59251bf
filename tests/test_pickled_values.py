"""Values Beam's coder pickles one by one, through a trivial grouping's shuffle as pickled blocks,
give what Beam's coder gives."""
from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import fractions
import pickle

import apache_beam as beam
import numpy as np
import pytest
from apache_beam import coders
from apache_beam.transforms import window
from apache_beam.transforms.core import Windowing
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_ext.runner._pickled_values import PickledValues
from beam_ext.runner._shuffle import GroupReader, _records
from tests._block_shuffle import BundleConsumer, groups_both_ways, shuffled


@dataclasses.dataclass
class _Event:
    user: int
    amount: float
    tags: list


class _Plain:
    """A user's class without equality of its own."""

    def __init__(self, x):
        self.x = x


class _Refused:
    """A value pickle refuses, as Beam's coder does."""

    def __reduce__(self):
        raise TypeError("a _Refused value cannot be pickled")


def _coders():
    value = coders.coders.LengthPrefixCoder(coders.FastPrimitivesCoder())
    key = coders.coders.LengthPrefixCoder(coders.VarIntCoder())
    glob = coders.coders.GlobalWindowCoder()
    pre = coders.WindowedValueCoder(coders.TupleCoder([key, value]), glob)
    post = coders.WindowedValueCoder(coders.TupleCoder([key, coders.IterableCoder(value)]), glob)
    return value, pre, post


def _canonical(value):
    """A value's type and contents, recursively: equal means the same types and values."""
    kind = type(value).__qualname__
    if isinstance(value, np.ndarray):
        return kind, str(value.dtype), value.tolist()
    if isinstance(value, _Plain):
        return kind, _canonical(value.x)
    if dataclasses.is_dataclass(value):
        return kind, _canonical(dataclasses.astuple(value))
    if isinstance(value, (list, tuple)):
        return kind, [_canonical(v) for v in value]
    if isinstance(value, dict):
        return kind, sorted((repr(k), _canonical(v)) for k, v in value.items())
    if isinstance(value, (set, frozenset)):
        return kind, sorted(map(repr, value))
    return kind, repr(value)


_SCALARS = (st.integers(-(1 << 70), 1 << 70) | st.floats(allow_nan=False) | st.text(max_size=3)
            | st.binary(max_size=3) | st.booleans() | st.none())
_OBJECTS = st.one_of(
    st.builds(lambda xs: np.array(xs, dtype=np.int64), st.lists(st.integers(-9, 9), max_size=4)),
    st.builds(lambda xs: np.array(xs, dtype=np.float32), st.lists(st.floats(-1, 1, width=32), max_size=3)),
    st.builds(_Event, st.integers(0, 9), st.floats(allow_nan=False), st.lists(st.text(max_size=2), max_size=2)),
    st.builds(_Plain, _SCALARS),
    st.builds(decimal.Decimal, st.integers(-999, 999)),
    st.builds(fractions.Fraction, st.integers(-9, 9), st.integers(1, 9)),
    st.builds(lambda s: datetime.date(2026, 1, 1) + datetime.timedelta(days=s), st.integers(0, 400)),
    st.builds(frozenset, st.sets(st.integers(0, 5), max_size=3)),
    st.builds(bytearray, st.binary(max_size=3)),
    st.builds(collections.OrderedDict, st.dictionaries(st.text(max_size=2), st.integers(0, 3), max_size=2)),
)
# Beam's coder encodes these itself, objects nested in them included.
_CONTAINERS = st.one_of(st.tuples(_SCALARS, _OBJECTS), st.lists(_OBJECTS, max_size=2),
                        st.dictionaries(st.text(max_size=2), _OBJECTS, max_size=2))


@st.composite
def _case(draw):
    kinds = draw(st.sampled_from(["objects", "mixed", "scalars"]))
    value = {"objects": _OBJECTS, "mixed": _OBJECTS | _SCALARS | _CONTAINERS, "scalars": _SCALARS}[kinds]
    keys = draw(st.integers(1, 12))
    n = draw(st.integers(0, 150))
    kvs = [(draw(st.integers(0, keys - 1)), draw(value)) for _ in range(n)]
    if kvs and draw(st.booleans()):  # one object several times
        shared = kvs[0][1]
        kvs += [(draw(st.integers(0, keys - 1)), shared) for _ in range(draw(st.integers(1, 5)))]
    return kvs



def _groups(reader: GroupReader, post, blobs: list[bytes]) -> dict:
    """The groups as ``read_batches`` gives them, checked against ``read``'s encoding."""
    objects, encoded = groups_both_ways(reader, post, blobs)
    assert _sorted(encoded) == _sorted(objects)
    return objects


def _sorted(groups: dict) -> dict:
    return {key: sorted(map(repr, map(_canonical, values))) for key, values in groups.items()}


@settings(max_examples=150, deadline=None)
@given(kvs=_case(), memory=st.sampled_from([300, 4000, 1 << 20]), sample=st.sampled_from([5, 40, 10 ** 6]),
       reader_memory=st.sampled_from([100, 1 << 20]), cut=st.integers(1, 50), pending=st.sampled_from([1, 3, 4096]))
def test_pickled_blocks_give_the_groups_beams_coder_gives(kvs, memory, sample, reader_memory, cut, pending):
    """Values of every kind (numpy arrays, dataclasses, a class without
    equality, Decimal, dates, bytearrays, OrderedDicts, big ints, floats,
    strings; objects alone or inside tuples, lists and dicts; one object
    several times), any flush budget, any number of objects held before they
    are pickled, keys judged not to repeat at any point, readers spilled or
    not: each key's values, read as objects or as encodings, have the types
    and contents Beam's coder gives each value after its own round trip."""
    value_coder, pre, post = _coders()
    blocks = PickledValues.of(value_coder)
    assert blocks is not None
    kv = pre.wrapped_value_coder
    encode_key, encode_value = kv.key_coder().get_impl().encode_nested, kv.value_coder().get_impl().encode_nested
    want = collections.defaultdict(list)
    for k, v in kvs:
        want[k].append(value_coder.decode(value_coder.encode(v)))
    written = shuffled(blocks, encode_key, encode_value, kvs, memory, sample, cut, pending)
    reader = GroupReader(pre, post, Windowing(window.GlobalWindows()), trivial=True, memory_bytes=reader_memory,
                         blocks=blocks)
    got = _groups(reader, post, written)
    assert _sorted(got) == _sorted(want)


def test_a_keys_objects_travel_as_one_block_and_beams_own_values_as_its_encodings():
    value_coder, pre, post = _coders()
    blocks = PickledValues.of(value_coder)
    kv = pre.wrapped_value_coder
    encode_key, encode_value = kv.key_coder().get_impl().encode_nested, kv.value_coder().get_impl().encode_nested
    arrays = [np.arange(3) + i for i in range(100)]
    kvs = [(0, a) for a in arrays] + [(1, "a string"), (1, _Event(1, 2.0, []))]
    written = shuffled(blocks, encode_key, encode_value, kvs, 1 << 20, 10 ** 6, 1000, 4096)
    data = {key: (count, data) for blob in written for key, count, data in _records(blob)}
    count, zero = data[encode_key(0)]
    assert count == 100 and zero[0] == 0  # one block: a zero byte first
    # Smaller than the arrays' own pickles: the class and dtype are written once.
    assert len(zero) < sum(len(pickle.dumps(a, pickle.HIGHEST_PROTOCOL)) for a in arrays) / 2
    count, one = data[encode_key(1)]
    assert count == 2 and one == encode_value("a string") + encode_value(_Event(1, 2.0, []))  # one object: no block
    got = _groups(GroupReader(pre, post, Windowing(window.GlobalWindows()), trivial=True, blocks=blocks), post,
                  written)
    assert [a.tolist() for a in got[0]] == [a.tolist() for a in arrays]
    assert got[1] == ["a string", _Event(1, 2.0, [])]


def test_a_value_pickle_refuses_raises_what_beams_coder_raises():
    value_coder, pre, _ = _coders()
    kv = pre.wrapped_value_coder
    encode_key, encode_value = kv.key_coder().get_impl().encode_nested, kv.value_coder().get_impl().encode_nested
    kvs = [(0, _Event(i, 1.0, [])) for i in range(10)] + [(0, _Refused())]
    with pytest.raises(TypeError, match="a _Refused value cannot be pickled"):
        encode_value(_Refused())
    with pytest.raises(TypeError, match="a _Refused value cannot be pickled"):
        shuffled(PickledValues.of(value_coder), encode_key, encode_value, kvs, 1 << 20, 10 ** 6, 100, 4096)


def test_only_beams_length_prefixed_pickling_coder_has_pickled_blocks():
    value_coder, _, _ = _coders()
    assert PickledValues.of(value_coder) is not None
    assert PickledValues.of(value_coder.value_coder()) is None  # not length-prefixed: the runner's coders always are
    dill = coders.FastPrimitivesCoder(fallback_coder=coders.coders.DillCoder())
    assert PickledValues.of(coders.coders.LengthPrefixCoder(dill)) is None
    assert PickledValues.of(coders.coders.LengthPrefixCoder(coders.VarIntCoder())) is None
    assert PickledValues.of(coders.coders.LengthPrefixCoder(coders.PickleCoder())) is None


# -- on Spark ---------------------------------------------------------------

def _keyed(i: int):
    if i % 3 == 0:
        return i % 5, np.arange(3) + i
    if i % 3 == 1:
        return i % 5, _Event(i, i / 2, [f"t{i % 4}"])
    return i % 5, (i, str(i))


def _seen(key, values):
    """What a consumer of the groups sees: each value's type and contents."""
    return key, sorted(repr(_canonical(v)) for v in values)



def _pipeline(p):
    return p | beam.Create(range(3000)) | beam.Map(_keyed) | beam.GroupByKey()


def test_the_plan_shuffles_values_beam_pickles_as_blocks():
    from beam_ext.runner.planning import plan_pipeline

    p = beam.Pipeline()
    _pipeline(p) | beam.MapTuple(_seen)
    _ = p | "Typed" >> beam.Create([(1, 2)]) | "Ints" >> beam.GroupByKey()
    groups = plan_pipeline(p.to_runner_api(), 1 << 20, 2).groups
    assert {spec.step: type(spec.blocks).__name__ for spec in groups.values()} == {
        "GroupByKey": "PickledValues", "Ints": "NoneType"}


@pytest.mark.usefixtures("spark")
@pytest.mark.parametrize("spark_group_memory,reader", [(1 << 20, "objects"), (4096, "objects"), (4096, "bundles")],
                         ids=["in memory, read as objects", "spilled, read as objects", "spilled, read encoded"])
def test_objects_grouped_on_spark_are_the_values_made(spark_group_memory, reader):
    """``GroupByKey`` of numpy arrays, dataclasses and tuples, read by a stage
    on objects or by a bundle-processor stage, held in memory or spilled:
    each group's values have the types and contents of the values made."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that, equal_to

    from beam_ext.runner import SparkRunner

    expected = collections.defaultdict(list)
    for i in range(3000):
        key, value = _keyed(i)
        expected[key].append(value)
    want = [_seen(key, values) for key, values in expected.items()]
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions([f"--spark_group_memory={spark_group_memory}"]))
    grouped = _pipeline(p)
    seen = grouped | (beam.MapTuple(_seen) if reader == "objects" else beam.ParDo(BundleConsumer(_seen)))
    assert_that(seen, equal_to(want))
    p.run().wait_until_finish()


@pytest.mark.usefixtures("spark")
def test_a_value_pickle_refuses_fails_the_job_naming_the_step_that_made_it():
    from beam_ext.runner import SparkRunner

    p = beam.Pipeline(runner=SparkRunner())
    _ = (p | beam.Create(range(100)) | "MakeValues" >> beam.Map(lambda i: (i % 3, _Refused() if i == 41 else _Plain(i)))
         | beam.GroupByKey() | beam.MapTuple(lambda k, values: len(values)))
    with pytest.raises(Exception, match=r"(?s)a _Refused value cannot be pickled.*MakeValues"):
        p.run().wait_until_finish()
