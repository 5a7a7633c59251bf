"""GroupByKey beyond memory: sorted runs on disk, merged by key, give the groups memory gives."""
from __future__ import annotations

import collections
import os
import random
import subprocess
import sys

import apache_beam as beam
import pytest
from apache_beam import coders
from apache_beam.coders.coder_impl import create_InputStream
from apache_beam.transforms import trigger, window
from apache_beam.transforms.core import Windowing
from apache_beam.utils import windowed_value
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_ext._key_hash import key_hash
from beam_ext.runner._group_spill import ExternalGrouping, SpillStats
from beam_ext.runner._shuffle import Buckets, GroupReader, KeyedValues, ShuffleWriter, unpack
from tests._block_shuffle import added, groups_both_ways

_KV = coders.TupleCoder([coders.StrUtf8Coder(), coders.VarIntCoder()])
_GROUPED = coders.TupleCoder([coders.StrUtf8Coder(), coders.IterableCoder(coders.VarIntCoder())])


def _reader(windowed: bool, memory_bytes: int) -> GroupReader:
    if not windowed:
        return GroupReader(coders.WindowedValueCoder(_KV, coders.coders.GlobalWindowCoder()),
                           coders.WindowedValueCoder(_GROUPED, coders.coders.GlobalWindowCoder()),
                           Windowing(window.GlobalWindows()), trivial=True, memory_bytes=memory_bytes)
    windowing = Windowing(window.FixedWindows(10), triggerfn=trigger.AfterWatermark(early=trigger.AfterCount(3)),
                          accumulation_mode=trigger.AccumulationMode.ACCUMULATING)
    return GroupReader(coders.WindowedValueCoder(_KV, coders.coders.IntervalWindowCoder()),
                       coders.WindowedValueCoder(_GROUPED, coders.coders.IntervalWindowCoder()),
                       windowing, trivial=False, memory_bytes=memory_bytes)


def _blobs(reader: GroupReader, elements: list[tuple[str, int, int]]) -> list[bytes]:
    """``(key, value, timestamp)`` -> the shuffled blobs of one partition."""
    pre = reader._pre
    windowed = not reader._trivial
    impl = pre.get_impl()
    encoded = []
    for key, value, ts in elements:
        windows = [window.FixedWindows(10).assign(window.FixedWindows.AssignContext(ts))[0]] if windowed \
            else [window.GlobalWindow()]
        encoded.append(impl.encode_nested(windowed_value.WindowedValue((key, value), ts, windows)))
    buckets = Buckets(1, blob_bytes=4096)
    pairs = ShuffleWriter(pre, reader._trivial).split(b"".join(encoded))
    return [blob for _, blob in [*buckets.add(pairs), *buckets.flush()]]


def _output(reader: GroupReader, blobs: list[bytes], stats: SpillStats | None = None) -> list[bytes]:
    """Each output element's own encoding, sorted: equal lists mean the same bytes per group."""
    impl = reader._post.get_impl()
    out = []
    for chunk in reader.read(blobs, stats):
        stream = create_InputStream(chunk)
        while stream.size() > 0:
            out.append(impl.encode_nested(impl.decode_from_stream(stream, True)))
    return sorted(out)


def _elements(seed: int, n: int, keys: int) -> list[tuple[str, int, int]]:
    rng = random.Random(seed)
    # One hot key takes a tenth of the elements: its values span every run.
    return [("hot" if rng.random() < 0.1 else f"k{rng.randrange(keys)}", rng.randrange(1000), rng.randrange(60))
            for _ in range(n)]


@pytest.mark.parametrize("windowed", [False, True], ids=["global", "fixed+early-count"])
def test_tiny_budget_gives_the_groups_memory_gives(windowed):
    elements = _elements(seed=7, n=3000, keys=300)
    in_memory, spilled = _reader(windowed, 256 << 20), _reader(windowed, 4096)
    stats_memory, stats = SpillStats(), SpillStats()
    expected = _output(in_memory, _blobs(in_memory, elements), stats_memory)
    assert stats_memory == SpillStats()
    assert _output(spilled, _blobs(spilled, elements), stats) == expected
    assert stats.runs >= 5 and stats.bytes > 0
    # The groups are what they should be, not only equal to each other.
    impl = in_memory._post.get_impl()
    hot = [impl.decode_nested(e) for e in expected if impl.decode_nested(e).value[0] == "hot"]
    if windowed:
        # Accumulating: each window's on-time pane holds all its values.
        on_time = {int(wv.windows[0].start): sorted(wv.value[1]) for wv in hot
                   if wv.pane_info.timing == windowed_value.PaneInfoTiming.ON_TIME}
        by_window = collections.defaultdict(list)
        for key, value, ts in elements:
            if key == "hot":
                by_window[ts // 10 * 10].append(value)
        assert on_time == {start: sorted(values) for start, values in by_window.items()}
        assert len(hot) > len(on_time)  # early panes fired too
    else:
        assert [sorted(wv.value[1]) for wv in hot] == [sorted(v for k, v, _ in elements if k == "hot")]


def test_many_runs_are_merged_before_the_final_merge():
    # More runs than the merge keeps open at once: they are merged into one first.
    elements = _elements(seed=3, n=20000, keys=4000)
    in_memory, spilled = _reader(False, 256 << 20), _reader(False, 1024)
    stats = SpillStats()
    assert _output(spilled, _blobs(spilled, elements), stats) == _output(in_memory, _blobs(in_memory, elements))
    assert stats.runs > 64


def test_runs_are_deleted_when_the_reader_stops_early(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    reader = _reader(False, 1024)
    chunks = reader.read(_blobs(reader, _elements(seed=1, n=2000, keys=1000)))
    next(chunks)
    assert len(os.listdir(tmp_path)) == 1  # the task's run directory, under Spark's local dir
    chunks.close()
    assert os.listdir(tmp_path) == []


def _dict_groups(pairs: list[tuple[bytes, bytes]]) -> dict[bytes, tuple[int, bytes]]:
    table: dict[bytes, list[bytes]] = collections.defaultdict(list)
    for key, value in pairs:
        table[key].append(value)
    return {key: (len(values), b"".join(values)) for key, values in table.items()}


def _grouped(grouping: ExternalGrouping) -> dict[bytes, tuple[int, bytes]]:
    out = {}
    for key, count, pieces in grouping.groups():
        assert key not in out  # each key once, whatever runs its values were in
        out[key] = (count, b"".join(pieces))
    return out


_PAIRS = st.lists(st.tuples(st.binary(max_size=6), st.binary(max_size=40)), max_size=400)


@settings(max_examples=60, deadline=None)
@given(pairs=_PAIRS, budget=st.integers(1, 3000))
def test_spilled_grouping_equals_a_dict(pairs, budget):
    grouping = ExternalGrouping(budget)
    try:
        grouping.add_all(pairs)
        grouping._check()
        # Values keep their arrival order within a key, across runs too.
        assert _grouped(grouping) == _dict_groups(pairs)
    finally:
        grouping.close()


_COUNTED = st.lists(st.tuples(st.binary(max_size=6), st.lists(st.binary(max_size=20), min_size=1, max_size=5)),
                   max_size=200)


@settings(max_examples=60, deadline=None)
@given(pairs=_PAIRS, records=_COUNTED, budget=st.integers(1, 3000), first=st.booleans())
def test_counted_records_and_pairs_group_as_their_values_would(pairs, records, budget, first):
    """Records of several values each (a key's values gathered before the
    shuffle) mixed with pairs: the groups of all their values, one by one."""
    grouping = ExternalGrouping(budget)
    counted = [(key, len(values), b"".join(values)) for key, values in records]
    try:
        for batch in ([counted, pairs] if first else [pairs, counted]):
            if batch is counted:
                grouping.add_counted(batch)
            else:
                grouping.add_all(batch)
            grouping._check()
        singles = [(key, value) for key, values in records for value in values]
        assert _grouped(grouping) == _dict_groups(singles + pairs if first else pairs + singles)
    finally:
        grouping.close()


_KVS = st.lists(st.tuples(st.sampled_from(["a", "b", "", "hot"]) | st.text(max_size=3),
                          st.integers(-1000, 10 ** 12)), max_size=600)


def _kv_groups(reader: GroupReader, blobs: list[bytes]) -> dict[str, list[int]]:
    """The groups ``read_batches`` gives, values sorted, checked against ``read``'s encoding."""
    objects, encoded = groups_both_ways(reader, reader._post, blobs)
    objects = {key: sorted(values) for key, values in objects.items()}
    assert {key: sorted(values) for key, values in encoded.items()} == objects
    return objects


@settings(max_examples=40, deadline=None)
@given(kvs=_KVS, memory=st.integers(1, 4000), sample=st.sampled_from([1, 3, 50, 10 ** 6]),
       reader_memory=st.sampled_from([64, 1 << 20]), cut=st.integers(1, 100), batch=st.booleans())
def test_values_gathered_by_key_before_the_shuffle_give_the_groups_of_pairs(kvs, memory, sample, reader_memory,
                                                                           cut, batch):
    """Any flush budget, any point where keys are judged not to repeat (and
    the rest written as pairs), any reader budget (spilled or not), batches
    of any size, pairs or keys and values apart: the groups of every value,
    as plain pairs give them."""
    reader = _reader(False, reader_memory)
    kv = reader._pre.wrapped_value_coder
    encode_key, encode_value = kv.key_coder().get_impl().encode_nested, kv.value_coder().get_impl().encode_nested
    gathered = KeyedValues(3, memory_bytes=memory, blob_bytes=64)
    gathered._sample = sample
    blobs: list[tuple[int, bytes]] = []
    for start in range(0, len(kvs), cut):
        blobs += added(gathered, kvs[start:start + cut], encode_key, encode_value, batch)
    blobs += gathered.flush()
    plain = Buckets(3, blob_bytes=64)
    plain_blobs = [*plain.add_values(kvs, encode_key, encode_value), *plain.flush()]
    expected: dict[str, list[int]] = collections.defaultdict(list)
    for key, value in kvs:
        expected[key].append(value)
    for target in range(3):
        mine = [blob for t, blob in blobs if t == target]
        theirs = [blob for t, blob in plain_blobs if t == target]
        assert _kv_groups(reader, mine) == _kv_groups(reader, theirs) == {
            key: sorted(values) for key, values in expected.items() if key_hash(encode_key(key)) % 3 == target}


@settings(max_examples=40, deadline=None)
@given(kvs=_KVS, cut=st.integers(1, 100))
def test_values_added_apart_from_their_keys_count_the_bytes_added_as_pairs_do(kvs, cut):
    reader = _reader(False, 1 << 20)
    kv = reader._pre.wrapped_value_coder
    encode_key, encode_value = kv.key_coder().get_impl().encode_nested, kv.value_coder().get_impl().encode_nested
    pairs, apart = KeyedValues(3, memory_bytes=1 << 40), KeyedValues(3, memory_bytes=1 << 40)
    pairs._sample = apart._sample = 0  # keys never judged
    for start in range(0, len(kvs), cut):
        assert added(pairs, kvs[start:start + cut], encode_key, encode_value, False) == []
        assert added(apart, kvs[start:start + cut], encode_key, encode_value, True) == []
    assert (apart._held, apart._count) == (pairs._held, pairs._count)


@pytest.mark.parametrize("batch", [False, True])
def test_an_element_that_is_not_a_pair_is_refused(batch):
    """As Beam's unpacking of a KV: a triple is not taken as its first two."""
    encode = coders.VarIntCoder().get_impl().encode_nested
    with pytest.raises(ValueError, match="too many values to unpack"):
        added(KeyedValues(1), [(1, 2), (3, 4, 5)], encode, encode, batch)


@pytest.mark.parametrize("batch", [False, True])
def test_keys_that_rarely_repeat_are_written_as_pairs_after_the_sample(batch):
    """Keys are judged after the sample's values (by ``add_batch``, after the
    slice that reaches it: here the slices are the sample's size)."""
    reader = _reader(False, 1 << 20)
    kv = reader._pre.wrapped_value_coder
    encode_key, encode_value = kv.key_coder().get_impl().encode_nested, kv.value_coder().get_impl().encode_nested
    distinct = KeyedValues(1)
    distinct._sample = 100
    kvs = [(f"k{i}", i) for i in range(1000)]
    blobs = [blob for part in range(0, 1000, 100)
             for _, blob in added(distinct, kvs[part:part + 100], encode_key, encode_value, batch)]
    blobs += [blob for _, blob in distinct.flush()]
    # The sample's records, then pairs the shared unpacking reads.
    assert sum(1 for _ in unpack(blobs[1:])) == 900
    repeating = KeyedValues(1)
    repeating._sample = 100
    blobs = [blob for _, blob in [*added(repeating, [(f"k{i % 10}", i) for i in range(1000)], encode_key,
                                         encode_value, batch), *repeating.flush()]]
    assert len(blobs) == 1
    with pytest.raises(ValueError, match="grouped records where pairs were expected"):
        list(unpack(blobs))
    assert _kv_groups(reader, blobs) == {f"k{k}": list(range(k, 1000, 10)) for k in range(10)}


@pytest.mark.parametrize("seed", range(5))
def test_random_batches_against_a_dict(seed, tmp_path, monkeypatch):
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    rng = random.Random(seed)
    grouping = ExternalGrouping(rng.choice([1, 200, 2000, 20000]))
    model: list[tuple[bytes, bytes]] = []
    try:
        for _ in range(rng.randrange(1, 40)):
            batch = [(rng.choice([b"", b"a", b"b", b"\x00", b"\xff" * 3, bytes([rng.randrange(256)])]),
                      rng.randbytes(rng.randrange(30))) for _ in range(rng.randrange(50))]
            grouping.add_all(batch)
            model += batch
            grouping._check()
        assert _grouped(grouping) == _dict_groups(model)
        assert (grouping.stats.runs > 0) == bool(os.listdir(tmp_path))
    finally:
        grouping.close()
    assert os.listdir(tmp_path) == []


def test_memory_bytes_must_be_positive():
    with pytest.raises(ValueError, match="memory_bytes must be a positive integer, got 0"):
        ExternalGrouping(0)


def _keyed(i: int) -> tuple[str, int]:
    return f"k{i * 7919 % 20000}", i


@pytest.mark.parametrize(("batch", "cut"), [(False, 200), (True, 200), (True, 5)])
def test_keys_equal_in_python_but_encoded_differently_stay_apart(batch, cut):
    """A task encodes a key of an int, str or bytes once per flush; 1, True
    and 1.0, or 0.0 and -0.0, are equal in Python but not in their encodings,
    and stay separate groups, as Beam's GroupByKey keeps them. Added five at
    a time, ``add_batch``'s calls alternate between keys all of those types,
    filed by the key object, and keys of others, filed by their encodings."""
    key_coder = coders.FastPrimitivesCoder().as_deterministic_coder("test")
    kv = coders.TupleCoder([key_coder, coders.VarIntCoder()])
    grouped = coders.TupleCoder([key_coder, coders.IterableCoder(coders.VarIntCoder())])
    glob = coders.coders.GlobalWindowCoder()
    reader = GroupReader(coders.WindowedValueCoder(kv, glob), coders.WindowedValueCoder(grouped, glob),
                         Windowing(window.GlobalWindows()), trivial=True)
    keys = [1, "1", b"1", 1 << 70, 2, True, 1.0, 0.0, -0.0, (1,)]
    kvs = [(keys[i % len(keys)], i) for i in range(200)]
    gathered = KeyedValues(1)
    blobs = [blob for start in range(0, 200, cut)
             for _, blob in added(gathered, kvs[start:start + cut], key_coder.get_impl().encode_nested,
                                  coders.VarIntCoder().get_impl().encode_nested, batch)]
    blobs += [blob for _, blob in gathered.flush()]
    groups = [wv.value for batch in reader.read_batches(blobs, reader._post, 1 << 20, 100) for wv in batch]
    assert sorted((repr(k), sorted(vs)) for k, vs in groups) == sorted(
        (repr(key), list(range(i, 200, len(keys)))) for i, key in enumerate(keys))


@pytest.mark.slow
@pytest.mark.usefixtures("spark")
def test_pipeline_under_a_tiny_budget_spills_and_gives_the_right_groups():
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that, equal_to

    from beam_ext.runner import SparkRunner

    n = 50000
    expected: dict[str, list[int]] = collections.defaultdict(list)
    for i in range(n):
        key, value = _keyed(i)
        expected[key].append(value)
    # Per key and window, the largest pane: with accumulation, the on-time pane of all the values.
    windowed_expected = collections.Counter((key, value // 1000) for i in range(n // 5) for key, value in [_keyed(i)])

    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(["--spark_group_memory=65536"]))
    pairs = p | beam.Create(range(n)) | beam.Map(_keyed)
    grouped = (pairs | "Group" >> beam.GroupByKey()
               | beam.MapTuple(lambda k, vs: (k, sorted(vs))))
    assert_that(grouped, equal_to(sorted((k, sorted(v)) for k, v in expected.items())))
    # The trigger driver is slow in Python: a fifth of the elements, in 10 windows.
    windowed = (pairs
                | beam.Filter(lambda kv: kv[1] < n // 5)
                | beam.Map(lambda kv: window.TimestampedValue(kv, kv[1] / 100))
                | beam.WindowInto(window.FixedWindows(10), trigger=trigger.AfterWatermark(early=trigger.AfterCount(2)),
                                  accumulation_mode=trigger.AccumulationMode.ACCUMULATING)
                | "GroupWindowed" >> beam.GroupByKey()
                | beam.Map(lambda kv, w=beam.DoFn.WindowParam: ((kv[0], int(w.start) // 10), len(list(kv[1]))))
                | "Rewindow" >> beam.WindowInto(window.GlobalWindows())
                | "Largest" >> beam.CombinePerKey(max))
    assert_that(windowed, equal_to(sorted(windowed_expected.items())), label="CheckWindowed")
    result = p.run()
    result.wait_until_finish()
    counters = {(c.key.step, c.key.metric.name): c.committed
                for c in result.metrics().query(beam.metrics.MetricsFilter().with_namespace("beam_ext.runner"))[
                    "counters"]}
    for step in ("Group", "GroupWindowed"):
        assert counters[(step, "group_spilled_runs")] > 2
        assert counters[(step, "group_spilled_bytes")] > 65536


class _Tagged(beam.DoFn):
    """Has bundle methods: its stage runs in Beam's bundle processor, not on objects."""

    def start_bundle(self):
        self.seen = 0

    def process(self, i):
        self.seen += 1
        yield f"k{i % 7}", i


@pytest.mark.usefixtures("spark")
@pytest.mark.parametrize("spark_group_memory", [1 << 20, 4096], ids=["in memory", "spilled"])
def test_a_bundle_processor_stage_gathers_its_values_by_key_as_an_object_stage_does(spark_group_memory):
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that, equal_to

    from beam_ext.runner import SparkRunner

    n = 30000
    expected = collections.defaultdict(list)
    for i in range(n):
        expected[f"k{i % 7}"].append(i)
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions([f"--spark_group_memory={spark_group_memory}"]))
    grouped = (p | beam.Create(range(n)) | beam.ParDo(_Tagged()) | beam.GroupByKey()
               | beam.MapTuple(lambda k, vs: (k, sorted(vs))))
    assert_that(grouped, equal_to(sorted(expected.items())))
    p.run().wait_until_finish()


@pytest.mark.slow
def test_groups_beyond_the_python_workers_memory_limit_spill_instead_of_failing():
    # 300 MB of values in one Python worker capped at 700 MB of address space:
    # the worker with Beam loaded plus a 16 MiB budget fits, all the groups do
    # not. What the worker imports moves the line: when SciPy became an
    # on-use import, 200 MB of groups started to fit under 760 MB. Both runs
    # share one Spark of their own; the spilling run goes first, on a fresh worker.
    job = os.path.join(os.path.dirname(__file__), "group_memory_job.py")
    done = subprocess.run([sys.executable, job, "--pyspark_memory=700m",
                           f"--spark_group_memory={16 << 20},{1 << 40}", "--elements=30000"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    spilled, held = done.stdout.splitlines()[-2:]
    assert spilled == "OK 300 307200000", done.stdout + done.stderr[-3000:]
    assert held.startswith("FAILED PipelineError") and "MemoryError" in done.stderr, held
