"""A streaming grouping's shuffle with values gathered per key and windows before it.

Oracle: every element's (key, windows, value), as plain pairs of whole
windowed values carry them. Checked for any flush budget, any point where
keys are judged not to repeat (the rest written as pairs), batches as
lists of windowed values or as values sharing one template (``Same``).
"""
from __future__ import annotations

import collections

from apache_beam import coders
from apache_beam.coders.coder_impl import create_InputStream
from apache_beam.transforms.window import IntervalWindow
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_ext._key_hash import key_hash
from beam_ext.runner._element_batches import Same
from beam_ext.runner._shuffle import ShuffleWriter, WindowedKeyedValues, windowed_records

_KV = coders.TupleCoder([coders.StrUtf8Coder(), coders.VarIntCoder()])
_PRE = coders.WindowedValueCoder(_KV, coders.coders.IntervalWindowCoder())
_WINDOW_SETS = [(IntervalWindow(0, 10),), (IntervalWindow(10, 20),), (IntervalWindow(0, 10), IntervalWindow(5, 15))]

# Batches: (index of a window set, elements as (key, value), whether they share one template).
_BATCHES = st.lists(st.tuples(st.integers(0, len(_WINDOW_SETS) - 1),
                              st.lists(st.tuples(st.sampled_from("abcdefg"), st.integers(0, 1000)), max_size=12),
                              st.booleans()), max_size=12)


def _gathered(batches, partitions: int, memory: int, sample: int, blob_bytes: int = 64) -> list[tuple[int, bytes]]:
    writer = ShuffleWriter(_PRE, trivial=False, by_window=True)
    gathered = WindowedKeyedValues(writer, partitions, memory_bytes=memory, blob_bytes=blob_bytes)
    gathered._SAMPLE = sample
    blobs = []
    for index, kvs, same in batches:
        windows = _WINDOW_SETS[index]
        if same:
            batch = Same(WindowedValue(None, Timestamp(3), windows), list(kvs))
        else:
            # A tuple of its own per element, equal to the others: found by encoding, not identity.
            batch = [WindowedValue(kv, Timestamp(3), tuple(windows)) for kv in kvs]
        blobs += gathered.add(batch)
    return blobs + list(gathered.flush())


def _read(blobs: list[bytes]) -> dict:
    """(key, windows) -> sorted values, from records and pairs alike."""
    key_impl, value_impl = coders.StrUtf8Coder().get_impl(), coders.VarIntCoder().get_impl()
    window_impl, pre_impl = coders.coders.IntervalWindowCoder().get_impl(), _PRE.get_impl()
    found: dict = collections.defaultdict(list)
    for key, windows, count, data in windowed_records(blobs):
        if windows is None:
            wv = pre_impl.decode_nested(data)
            found[(wv.value[0], tuple(wv.windows))].append(wv.value[1])
            continue
        stream = create_InputStream(windows)
        decoded = tuple(window_impl.decode_from_stream(stream, True) for _ in range(stream.read_var_int64()))
        stream = create_InputStream(data)
        found[(key_impl.decode_nested(key), decoded)] += [value_impl.decode_from_stream(stream, True)
                                                          for _ in range(count)]
    return {slot: sorted(values) for slot, values in found.items()}


@settings(max_examples=60, deadline=None)
@given(batches=_BATCHES, memory=st.integers(1, 3000), sample=st.sampled_from([1, 5, 40, 10 ** 6]))
def test_gathered_values_reach_their_keys_partition_with_their_windows(batches, memory, sample):
    blobs = _gathered(batches, 3, memory, sample)
    expected: dict = collections.defaultdict(list)
    for index, kvs, _ in batches:
        for key, value in kvs:
            expected[(key, _WINDOW_SETS[index])].append(value)
    for target in range(3):
        mine = _read([blob for t, blob in blobs if t == target])
        assert mine == {slot: sorted(values) for slot, values in expected.items()
                        if key_hash(coders.StrUtf8Coder().get_impl().encode_nested(slot[0])) % 3 == target}


def test_keys_that_rarely_repeat_are_written_as_pairs_after_the_first_judged_batch():
    distinct = [(0, [(f"k{i}", i) for i in range(100)], True), (1, [(f"k{i}", i) for i in range(100, 300)], False)]
    blobs = [blob for _, blob in _gathered(distinct, 1, 1 << 20, sample=50, blob_bytes=1 << 20)]
    # One blob of the first batch's records, then pairs.
    assert [blob[0] for blob in blobs] == [2, 0]
    assert sum(1 for _ in windowed_records(blobs[1:])) == 200
    repeating = [(0, [(f"k{i % 5}", i) for i in range(100)], True)] * 2
    blobs = [blob for _, blob in _gathered(repeating, 1, 1 << 20, sample=50, blob_bytes=1 << 20)]
    assert [blob[0] for blob in blobs] == [2]
    assert [count for _, _, count, _ in windowed_records(blobs)] == [40] * 5
