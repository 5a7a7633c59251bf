"""A batch grouping's payloads of windows and value (``GroupSpec.windows_apart``).

Where the pane driver reads of an element only its windows and value (windows
that do not merge, the default trigger, end-of-window output times), the
shuffle carries those instead of the whole windowed value. Oracles: the panes
the whole windowed values give, and each key's values per window in arrival
order, computed here by brute force.
"""
from __future__ import annotations

import collections

import apache_beam as beam
import pytest
from apache_beam import coders
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import trigger, window
from apache_beam.transforms.core import Windowing
from apache_beam.transforms.window import GlobalWindow, IntervalWindow, TimestampCombiner
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_ext.runner import SparkRunner
from beam_ext.runner._batch_panes import reads_windows_and_values
from beam_ext.runner._shuffle import Buckets, GroupReader, ShuffleWriter
from beam_ext.runner._window_sets import WindowSetCodec
from beam_ext.runner.planning import plan_pipeline

_KEY, _VALUE = coders.StrUtf8Coder(), coders.VarIntCoder()
_WINDOW = coders.coders.IntervalWindowCoder()
_PRE = coders.WindowedValueCoder(coders.TupleCoder([_KEY, _VALUE]), _WINDOW)
_POST = coders.WindowedValueCoder(coders.TupleCoder([_KEY, coders.IterableCoder(_VALUE)]), _WINDOW)
_WINDOWING = Windowing(window.SlidingWindows(10, 5))
_WINDOW_SETS = [(IntervalWindow(0, 10),), (IntervalWindow(5, 15),), (IntervalWindow(0, 10), IntervalWindow(5, 15)),
                (IntervalWindow(-5, 5), IntervalWindow(0, 10))]

# Elements: (key, value, index of a window set, whether the element shares the set's tuple).
_ELEMENTS = st.lists(st.tuples(st.sampled_from(["a", "b", "", "hot"]), st.integers(0, 10 ** 6),
                               st.integers(0, len(_WINDOW_SETS) - 1), st.booleans()), max_size=60)


def _windowed(elements) -> list[WindowedValue]:
    return [WindowedValue((key, value), Timestamp(micros=value % 9), _WINDOW_SETS[index] if shared
                          else tuple(IntervalWindow(w.start, w.end) for w in _WINDOW_SETS[index]))
            for key, value, index, shared in elements]


def _panes(apart: bool, elements, split: bool, memory: int) -> tuple[list, list[bytes]]:
    """The panes a reader gives, as objects and encoded, of what a writer wrote
    from objects (``pairs``) or from encoded elements (``split``)."""
    writer = ShuffleWriter(_PRE, trivial=False, windows_apart=apart)
    wvs = _windowed(elements)
    if split:
        pairs = list(writer.split(b"".join(map(_PRE.get_impl().encode_nested, wvs))))
    else:
        pairs = list(writer.pairs(wvs))
    buckets = Buckets(1, blob_bytes=128)
    blobs = [blob for _, blob in [*buckets.add(pairs), *buckets.flush()]]

    def reader() -> GroupReader:
        return GroupReader(_PRE, _POST, _WINDOWING, trivial=False, memory_bytes=memory, windows_apart=apart)
    objects = [(wv.value[0], wv.windows, list(wv.value[1]), wv.timestamp, wv.pane_info)
               for batch in reader().read_batches(blobs, _POST, 1 << 20, 7) for wv in batch]
    return objects, list(reader().read(blobs))


@settings(max_examples=60, deadline=None)
@given(elements=_ELEMENTS, split=st.booleans(), memory=st.sampled_from([64, 1 << 20]))
def test_payloads_of_windows_and_value_give_the_panes_of_whole_windowed_values(elements, split, memory):
    """Spilled or not, written from objects or from encodings: the same panes,
    values in the same order, encoded alike; each key's values per window in
    arrival order."""
    apart, apart_encoded = _panes(True, elements, split, memory)
    whole, whole_encoded = _panes(False, elements, split, memory)
    assert apart == whole
    assert b"".join(apart_encoded) == b"".join(whole_encoded)
    expected: dict = collections.defaultdict(list)
    for key, value, index, _ in elements:
        for w in _WINDOW_SETS[index]:
            expected[(key, w)].append(value)
    got = {(key, windows[0]): values for key, windows, values, _, _ in apart}
    if memory == 1 << 20:  # a key's values in one piece: arrival order
        assert got == expected
    else:  # merged from spilled runs: the order of runs
        assert {slot: sorted(values) for slot, values in got.items()} == {
            slot: sorted(values) for slot, values in expected.items()}
    # At the end of each window, in the milliseconds Beam's coder keeps of a timestamp.
    assert all(timestamp.micros == windows[0].max_timestamp().micros // 1000 * 1000
               for _, windows, _, timestamp, _ in apart)


def test_a_payload_is_the_windows_and_the_value_only():
    writer = ShuffleWriter(_PRE, trivial=False, windows_apart=True)
    [(key, payload)] = writer.pairs([WindowedValue(("k", 300), Timestamp(7), _WINDOW_SETS[2])])
    windows = WindowSetCodec(_WINDOW).encode(_WINDOW_SETS[2])
    assert key == _KEY.get_impl().encode_nested("k")
    assert payload == bytes([len(windows)]) + windows + _VALUE.get_impl().encode_nested(300)


@pytest.mark.parametrize("windows", [(IntervalWindow(0, 10),), (IntervalWindow(-10, 0), IntervalWindow(0, 10)),
                                     (GlobalWindow(),), ()])
def test_window_sets_round_trip_and_decode_once(windows):
    coder = coders.coders.GlobalWindowCoder() if windows == (GlobalWindow(),) else _WINDOW
    codec = WindowSetCodec(coder)
    encoded = codec.encode(windows)
    assert codec.encode(tuple(windows)) == encoded  # an equal set made apart
    assert WindowSetCodec(coder).decode(encoded) == windows
    assert codec.decode(encoded) is codec.decode(bytes(encoded))


@pytest.mark.parametrize(("windowing", "apart"), [
    (Windowing(window.FixedWindows(60)), True),
    (Windowing(window.SlidingWindows(60, 10)), True),
    (Windowing(window.FixedWindows(60), allowed_lateness=30), True),
    (Windowing(window.Sessions(60)), False),  # windows merge: the merge reads them all first
    (Windowing(window.FixedWindows(60), timestamp_combiner=TimestampCombiner.OUTPUT_AT_EARLIEST), False),
    (Windowing(window.FixedWindows(60), triggerfn=trigger.AfterCount(2),
               accumulation_mode=trigger.AccumulationMode.DISCARDING), False),
    (Windowing(window.GlobalWindows()), False),  # the trivial grouping's values alone
])
def test_windowings_whose_driver_reads_only_windows_and_values(windowing, apart):
    assert reads_windows_and_values(windowing) is apart


@pytest.mark.usefixtures("spark")
def test_windowed_groupings_on_spark_runner_equal_direct_runner():
    """A fixed-window CombinePerKey (its partial combine's output shuffled) and
    a sliding-window GroupByKey of values in two windows each."""

    expected: dict = collections.defaultdict(list)
    for i in range(2_000):
        expected[(f"k{i % 7}", i * 3 % 200 // 20 * 20)].append(i)
    want = [("sum", k, start, sum(vs)) for (k, start), vs in expected.items()]
    sliding: dict = collections.defaultdict(list)
    for i in range(2_000):
        second = i * 3 % 200
        for start in (second // 10 * 10 - 10, second // 10 * 10):
            sliding[(f"k{i % 7}", start)].append(i)
    want += [("group", k, start, sorted(vs)) for (k, start), vs in sliding.items()]
    for runner in (SparkRunner(), beam.runners.DirectRunner()):
        with beam.Pipeline(runner=runner, options=PipelineOptions(["--spark_master=local[2]"])) as p:
            events = (p | beam.Create([(f"k{i % 7}", i, i * 3 % 200) for i in range(2_000)])
                      | beam.Map(lambda e: window.TimestampedValue((e[0], e[1]), e[2])))
            sums = (events | "Fixed" >> beam.WindowInto(window.FixedWindows(20)) | beam.CombinePerKey(sum)
                    | "Sums" >> beam.ParDo(_Tagged("sum")))
            groups = (events | "Sliding" >> beam.WindowInto(window.SlidingWindows(20, 10)) | beam.GroupByKey()
                      | "Sorted" >> beam.MapTuple(lambda k, vs: (k, sorted(vs))) | "Groups" >> beam.ParDo(_Tagged("group")))
            assert_that((sums, groups) | beam.Flatten(), equal_to(want))


class _Tagged(beam.DoFn):
    """``(tag, key, window start in seconds, value)`` of each element."""

    def __init__(self, tag: str) -> None:
        self._tag = tag

    def process(self, element, w=beam.DoFn.WindowParam):
        key, value = element
        yield self._tag, key, int(w.start), value


@pytest.mark.parametrize("streaming", [False, True])
def test_batch_plans_windowed_groupings_with_payloads_of_windows_and_value(streaming):
    """Batch only: a streaming grouping's driver keeps state across micro-batches
    and reads whole windowed values (or gathered records, ``by_window``)."""
    p = beam.Pipeline(options=PipelineOptions(["--streaming"] if streaming else []))
    events = p | beam.Create([("a", 1)]) | beam.Map(lambda kv: window.TimestampedValue(kv, 5))
    _ = events | "Fixed" >> beam.WindowInto(window.FixedWindows(10)) | "ByMinute" >> beam.GroupByKey()
    _ = events | "Sessions" >> beam.WindowInto(window.Sessions(10)) | "BySession" >> beam.GroupByKey()
    _ = events | "Global" >> beam.GroupByKey()
    plan = plan_pipeline(p.to_runner_api(), 1 << 20, 2, streaming=streaming)
    assert sorted((g.step, g.windows_apart) for g in plan.groups.values()) == [
        ("ByMinute", not streaming), ("BySession", False), ("Global", False)]
