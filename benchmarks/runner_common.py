"""Common Beam pipelines beyond the throughput table: SparkRunner against DirectRunner.

Each pipeline is one users write every day (a CoGroupByKey, a Partition,
tagged outputs, a DoFn flushing in finish_bundle, a stateful DoFn,
GroupIntoBatches, Top, Distinct, side inputs, windowed groupings, ...), over ``--size`` generated numbers. Each
runs once on SparkRunner to warm the session (local[2], the settings
SparkRunner gives a session it starts), then ``--runs`` times on SparkRunner
and on Beam's DirectRunner, alternating; every run writes its output, and
the two runners' outputs are compared line by line. Writes
docs/benchmarks/runner_common.md and runner_common.png.

With ``--streaming`` both runners run the same pipelines in streaming mode
(SparkRunner's micro-batches, DirectRunner's streaming engine), and the
report is runner_common_streaming.md and .png.

    python benchmarks/runner_common.py                         # 1M numbers each
    python benchmarks/runner_common.py --size 100000 --cases cogbk,partition --out /tmp/report
    python benchmarks/runner_common.py --streaming --size 100000 --cases tagged,window_shares
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import glob
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Callable, Iterator, NamedTuple

import apache_beam as beam
import numpy as np
from apache_beam.coders import VarIntCoder
from apache_beam.io import fileio, iobase
from apache_beam.io.range_trackers import OffsetRangeTracker
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.transforms import combiners, trigger, userstate, window

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _user_classes import Purchase  # noqa: E402

from beam_ext.transforms import SlidingAggregate, SlidingWindow, agg  # noqa: E402

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
# The Python workers import _user_classes too: Beam's coder pickles its instances by reference.
os.environ["PYTHONPATH"] = os.pathsep.join(
    filter(None, [os.path.dirname(os.path.abspath(__file__)), os.environ.get("PYTHONPATH")]))

TARGET_VS_DIRECT = 2.0  # issue 14's target against DirectRunner
_SHARDS = 8


def _numbers(p, n: int, label: str = "Numbers"):
    """``n`` numbers from ``_SHARDS`` shards spread over the workers (a Reshuffle)."""
    per = n // _SHARDS
    return (p | f"{label}Shards" >> beam.Create(range(_SHARDS)) | f"{label}Spread" >> beam.Reshuffle()
            | f"{label}Gen" >> beam.FlatMap(lambda s: range(s * per, (s + 1) * per)))


class _RunningCount(beam.DoFn):
    """A key's running count in user state, as a dedup or a sequence-number DoFn keeps one."""

    COUNT = userstate.ReadModifyWriteStateSpec("count", VarIntCoder())

    def process(self, kv, count=beam.DoFn.StateParam(COUNT)):
        seen = (count.read() or 0) + 1
        count.write(seen)
        yield kv[0], seen


class _CountedInBundles(_RunningCount):
    """The running count, by a DoFn that also counts each bundle's elements, as one reporting per bundle does."""

    def start_bundle(self):
        self._seen = 0

    def process(self, kv, count=beam.DoFn.StateParam(_RunningCount.COUNT)):
        self._seen += 1
        yield from super().process(kv, count)


class _WeightedCount(beam.DoFn):
    """A key's running total of weights read from a side input."""

    TOTAL = userstate.ReadModifyWriteStateSpec("total", VarIntCoder())

    def process(self, kv, weights, total=beam.DoFn.StateParam(TOTAL)):
        now = (total.read() or 0) + weights[kv[0] % 10]
        total.write(now)
        yield kv[0], now


class _Mean(beam.CombineFn):
    """A CombineFn class of the user's own."""

    def create_accumulator(self):
        return 0, 0

    def add_input(self, acc, x):
        return acc[0] + x, acc[1] + 1

    def merge_accumulators(self, accs):
        totals = list(zip(*accs)) or [(), ()]
        return sum(totals[0]), sum(totals[1])

    def extract_output(self, acc):
        return acc[0] / acc[1] if acc[1] else 0


class _FlushesHundreds(beam.DoFn):
    """Buffers elements and sends them on a hundred at a time, the rest when the
    bundle finishes: what a DoFn batching calls to a service does."""

    def start_bundle(self):
        self._buffer = []

    def process(self, x):
        self._buffer.append(x)
        if len(self._buffer) == 100:
            yield sum(self._buffer)
            self._buffer = []

    def finish_bundle(self):
        if self._buffer:
            yield window.GlobalWindows.windowed_value(sum(self._buffer))


class _ThreesApart(beam.DoFn):
    def process(self, x):
        yield beam.pvalue.TaggedOutput("threes", x) if x % 3 == 0 else x


def _tagged(p, n):
    parts = _numbers(p, n) | beam.ParDo(_ThreesApart()).with_outputs("threes", main="rest")
    return ((parts.threes | "Threes" >> beam.combiners.Count.Globally() | "T" >> beam.Map(lambda c: ("threes", c)),
             parts.rest | "Rest" >> beam.combiners.Count.Globally() | "R" >> beam.Map(lambda c: ("rest", c)))
            | "Both" >> beam.Flatten())


def _stamped(p, n, seconds: int, value=lambda x: (x % 100, x)):
    return _numbers(p, n) | "Stamp" >> beam.Map(lambda x: window.TimestampedValue(value(x), x % seconds))


def _side(p, n, view: Callable, values: list, fn: Callable):
    side = p | "Side" >> beam.Create(values)
    return _numbers(p, n) | beam.Map(fn, s=view(side)) | beam.CombineGlobally(sum)


def _window_shares(p, n):
    """Each element's share (in millionths) of its window's total, read from a side input in the same windows."""
    events = _stamped(p, n, 3600) | "Fix" >> beam.WindowInto(window.FixedWindows(60))
    totals = events | "Amounts" >> beam.Values() | "Total" >> beam.CombineGlobally(sum).without_defaults()
    return (events | "Share" >> beam.Map(lambda kv, total: (kv[0], kv[1] * 1_000_000 // total),
                                         total=beam.pvalue.AsSingleton(totals))
            | beam.CombinePerKey(sum) | "Unwindow" >> beam.WindowInto(window.GlobalWindows())
            | beam.Values() | "All" >> beam.CombineGlobally(sum))


class _OffsetRanges(beam.RestrictionProvider):
    """Element ``n``'s restriction: the offsets ``[0, n)``."""

    def initial_restriction(self, element):
        return OffsetRange(0, element)

    def create_tracker(self, restriction):
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element, restriction):
        return restriction.size()


class _Offsets(beam.DoFn):
    """A splittable DoFn reading offsets one claim at a time, as a user's own source reads its records."""

    def process(self, count, tracker=beam.DoFn.RestrictionParam(_OffsetRanges())):
        offset = tracker.current_restriction().start
        while tracker.try_claim(offset):
            yield offset
            offset += 1


class _NumberSource(iobase.BoundedSource):
    """A user's own bounded source of ``[0, n)``, split into ``_SHARDS`` bundles."""

    def __init__(self, n: int) -> None:
        self.n = n

    def estimate_size(self):
        return self.n

    def get_range_tracker(self, start, stop):
        return OffsetRangeTracker(0 if start is None else start, self.n if stop is None else stop)

    def read(self, range_tracker):
        offset = range_tracker.start_position()
        while range_tracker.try_claim(offset):
            yield offset
            offset += 1

    def split(self, desired_bundle_size, start_position=None, stop_position=None):
        start = start_position or 0
        stop = self.n if stop_position is None else stop_position
        step = -(-(stop - start) // _SHARDS)
        for at in range(start, stop, step):
            yield iobase.SourceBundle(min(step, stop - at), self, at, min(at + step, stop))


class _FiveWays(beam.DoFn):
    def process(self, x):
        yield beam.pvalue.TaggedOutput(f"t{x % 5}", x)


def _five_tags(p, n):
    parts = _numbers(p, n) | beam.ParDo(_FiveWays()).with_outputs(*[f"t{i}" for i in range(5)])
    return [parts[f"t{i}"] | f"Count{i}" >> beam.combiners.Count.Globally() for i in range(5)] | beam.Flatten()


def _five_writes(p, n):
    """Numbers split five ways by their remainder, as a pipeline writing several
    outputs does: four written as text files here, the fifth the case's output."""
    numbers = _numbers(p, n)
    out_dir = tempfile.mkdtemp(prefix="beam_ext_five_writes_")
    for k in range(4):
        _ = (numbers | f"Keep{k}" >> beam.Filter(lambda x, k=k: x % 5 == k) | f"Str{k}" >> beam.Map(str)
             | f"Write{k}" >> beam.io.WriteToText(os.path.join(out_dir, f"part{k}")))
    return numbers | "Keep4" >> beam.Filter(lambda x: x % 5 == 4)


def _dead_letters(p, n):
    """A Map failing on one element in 1,000, its failures sent to a dead-letter output; both counted."""
    good, bad = _numbers(p, n) | beam.Map(lambda x: 1 // (x % 1000)).with_exception_handling()
    return (good | "Good" >> beam.combiners.Count.Globally(), bad | "Bad" >> beam.combiners.Count.Globally()) | (
        "Both" >> beam.Flatten())


class _Doubled(beam.DoFn):
    """A batched DoFn: numpy arrays of the elements in, doubled arrays out."""

    def process_batch(self, batch: np.ndarray) -> Iterator[np.ndarray]:
        yield batch * 2

    def infer_output_type(self, input_element_type):
        return input_element_type


# Beam reads the batch type from the annotations as objects (this module's are strings).
_Doubled.process_batch.__annotations__ = {"batch": np.ndarray, "return": Iterator[np.ndarray]}


def _cogbk3(p, n):
    """Three inputs joined over 1,000 keys: n and n/2 numbers and a table of names."""
    return ({"a": _numbers(p, n, "A") | "KeyA" >> beam.Map(lambda i: (i % 1000, 1)),
             "b": _numbers(p, n // 2, "B") | "KeyB" >> beam.Map(lambda i: (i % 1000, 2)),
             "names": p | "Names" >> beam.Create([(k, str(k)) for k in range(1000)])}
            | beam.CoGroupByKey() | beam.MapTuple(lambda k, g: (k, len(g["a"]), len(g["b"]), g["names"][0])))


def _early_panes(p, n):
    """Hourly windows firing early every 1,000 elements, accumulating; the panes' sizes counted."""
    return (_stamped(p, n, 86_400)
            | beam.WindowInto(window.FixedWindows(3600), trigger=trigger.AfterWatermark(early=trigger.AfterCount(1000)),
                              accumulation_mode=trigger.AccumulationMode.ACCUMULATING)
            | beam.GroupByKey() | beam.MapTuple(lambda k, vs: (k, len(vs)))
            | "Global" >> beam.WindowInto(window.GlobalWindows()) | beam.combiners.Count.PerElement())


def _json_sums(p, n):
    import json

    return (_numbers(p, n) | "Dumps" >> beam.Map(lambda i: json.dumps({"k": i % 100, "v": i}))
            | "Loads" >> beam.Map(json.loads) | "KV" >> beam.Map(lambda d: (d["k"], d["v"])) | beam.CombinePerKey(sum))


@functools.cache
def _csv_file(n: int) -> str:
    """A CSV file of ``n`` rows ``key,amount,name``, written once per process
    (the warm-up run writes it, so no timed run pays for it)."""
    path = os.path.join(tempfile.mkdtemp(prefix="beam_ext_csv_"), "rows.csv")
    with open(path, "w") as f:
        f.write("key,amount,name\n")
        f.writelines(f"{i % 100},{i * 0.5},n{i % 37}\n" for i in range(n))
    return path


@functools.cache
def _json_file(n: int) -> str:
    """A JSON-lines file of ``n`` records ``{"key", "amount", "name"}``, written
    once per process, as :func:`_csv_file`."""
    path = os.path.join(tempfile.mkdtemp(prefix="beam_ext_json_"), "rows.json")
    with open(path, "w") as f:
        f.writelines(f'{{"key": {i % 100}, "amount": {i * 0.5}, "name": "n{i % 37}"}}\n' for i in range(n))
    return path


def _json_records_sums(p, n):
    """Beam's ReadFromJson (its DataFrame reader, one record per line) summed per key."""
    return (p | beam.io.ReadFromJson(_json_file(n)) | beam.GroupBy("key").aggregate_field("amount", sum, "total")
            | beam.Map(tuple))


def _sales(p, n):
    """``n`` rows with a schema (``beam.Row``: a key of 100, an amount)."""
    return _numbers(p, n) | "Sales" >> beam.Map(lambda i: beam.Row(key=i % 100, amount=i * 0.5))


def _frame_sums(p, n):
    """Beam's DataFrame API: the amounts summed per key (``groupby().sum()``), back to rows."""
    from apache_beam.dataframe.convert import to_dataframe, to_pcollection

    sums = to_dataframe(_sales(p, n)).groupby("key").sum()
    return to_pcollection(sums, include_indexes=True) | beam.Map(lambda r: (int(r.key), float(r.amount)))


def _frame_filter(p, n):
    """Beam's DataFrame API: rows filtered and a column assigned, back to rows; the new column summed per key."""
    from apache_beam.dataframe.convert import to_dataframe, to_pcollection

    frame = to_dataframe(_sales(p, n))
    large = frame[frame.amount > 1000.0]
    large = large.assign(double=large.amount * 2)
    return to_pcollection(large) | beam.Map(lambda r: (r.key, r.double)) | beam.CombinePerKey(sum)


def _csv_sums(p, n):
    """Beam's ReadFromCsv (its DataFrame reader) summed per key with GroupBy(...).aggregate_field."""
    return (p | beam.io.ReadFromCsv(_csv_file(n)) | beam.GroupBy("key").aggregate_field("amount", sum, "total")
            | beam.Map(tuple))


class _FlushAtWindowEnd(beam.DoFn):
    """Buffers a key's values in bag state and flushes them when its window ends,
    on an event-time timer set by every element, as a per-key batching DoFn does."""

    BUFFER = userstate.BagStateSpec("buffer", VarIntCoder())
    FLUSH = userstate.TimerSpec("flush", userstate.TimeDomain.WATERMARK)

    def process(self, kv, w=beam.DoFn.WindowParam, buffer=beam.DoFn.StateParam(BUFFER),
                flush=beam.DoFn.TimerParam(FLUSH)):
        buffer.add(kv[1])
        flush.set(w.end)

    @userstate.on_timer(FLUSH)
    def on_flush(self, key=beam.DoFn.KeyParam, buffer=beam.DoFn.StateParam(BUFFER)):
        values = list(buffer.read())
        buffer.clear()
        yield key, len(values), sum(values)


def _timer_flush(p, n):
    return (_stamped(p, n, 3600) | beam.WindowInto(window.FixedWindows(60)) | beam.ParDo(_FlushAtWindowEnd())
            | "Unwindow" >> beam.WindowInto(window.GlobalWindows())
            | beam.Map(lambda t: (t[0], t[1:])) | beam.CombinePerKey(lambda ts: tuple(map(sum, zip(*ts)))))


def _sessions_count(p, n):
    """Per-key sessions (gap 5 s) over spread timestamps, each session's size counted."""
    return (_numbers(p, n) | "Stamp" >> beam.Map(
                lambda x: window.TimestampedValue((x % 10_000, 1), (x // 10_000) * 37 % 2_000))
            | beam.WindowInto(window.Sessions(5)) | beam.CombinePerKey(sum)
            | "Unwindow" >> beam.WindowInto(window.GlobalWindows()) | beam.Values()
            | beam.combiners.Count.PerElement())


@functools.cache
def _parquet_file(n: int) -> str:
    """A Parquet file of ``n`` rows ``key, amount`` in row groups of 100,000, written once per process."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.path.join(tempfile.mkdtemp(prefix="beam_ext_parquet_"), "rows.parquet")
    ids = np.arange(n)
    pq.write_table(pa.table({"key": ids % 100, "amount": ids * 0.5}), path, row_group_size=100_000)
    return path


@functools.cache
def _parquet_files(n: int, files: int) -> str:
    """``files`` Parquet files of ``n`` rows ``key, amount`` in all, written once per process; their glob."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tempfile.mkdtemp(prefix="beam_ext_parquets_")
    per = n // files
    for part in range(files):
        ids = np.arange(part * per, (part + 1) * per)
        pq.write_table(pa.table({"key": ids % 100, "amount": ids * 0.5}), os.path.join(folder, f"part-{part}.parquet"))
    return os.path.join(folder, "part-*.parquet")


def _quantiles(p, n):
    """The quartiles of the numbers by Beam's ApproximateQuantiles, each checked against
    its rank-error bound (Beam's default epsilon, 0.01, times n) around the exact one: the approximation
    depends on the order in which accumulators merge, on any runner."""
    from apache_beam.transforms.stats import ApproximateQuantiles

    exact = [(n - 1) * i / 4 for i in range(5)]
    return (_numbers(p, n) | ApproximateQuantiles.Globally(5)
            | beam.FlatMap(lambda qs: [(e, abs(q - e) <= 0.01 * n) for q, e in zip(qs, exact)]))


@functools.cache
def _text_files(n: int, files: int = _SHARDS) -> str:
    """``files`` text files of ``n`` numbers in all, one per line, written once per process; their glob."""
    folder = tempfile.mkdtemp(prefix="beam_ext_text_")
    per = n // files
    for shard in range(files):
        with open(os.path.join(folder, f"part-{shard}.txt"), "w") as f:
            f.writelines(f"{i}\n" for i in range(shard * per, (shard + 1) * per))
    return os.path.join(folder, "part-*.txt")


def _read_all_text(p, n):
    """Beam's ReadAllFromText of a glob listed in the pipeline, the numbers summed per remainder of 100."""
    return (p | beam.Create([_text_files(n)]) | beam.io.ReadAllFromText()
            | beam.Map(lambda line: (int(line) % 100, int(line))) | beam.CombinePerKey(sum))


def _write_files(p, n):
    """fileio.WriteToFiles of the numbers as text; the files it reports written, read back and summed
    (how many files it writes depends on the bundles, on any runner)."""
    from apache_beam.io import fileio

    folder = tempfile.mkdtemp(prefix="beam_ext_fileio_")

    def numbers_in(result):
        with open(os.path.join(folder, result.file_name)) as f:
            return [int(line) for line in f]

    return (_numbers(p, n) | beam.Map(str) | fileio.WriteToFiles(folder)
            | beam.FlatMap(numbers_in) | beam.CombineGlobally(sum))


def _written_back(p, n, write: Callable, read_sum: Callable[[str], int]):
    """The numbers as ``{"key", "amount"}`` records written by ``write`` (a Beam
    write transform's factory, given a path prefix); the files it reports
    written, each summed by ``read_sum`` in the same pipeline, summed."""
    prefix = os.path.join(tempfile.mkdtemp(prefix="beam_ext_writes_"), "part")
    return (_numbers(p, n) | beam.Map(lambda x: {"key": x % 100, "amount": x}) | write(prefix)
            | beam.Map(read_sum) | beam.CombineGlobally(sum))


def _parquet_amounts(path: str) -> int:
    import pyarrow.parquet as pq

    return sum(pq.read_table(path, columns=["amount"]).column("amount").to_pylist())


def _avro_amounts(path: str) -> int:
    import fastavro

    with open(path, "rb") as f:
        return sum(record["amount"] for record in fastavro.reader(f))


def _gzip_amounts(path: str) -> int:
    import gzip

    with gzip.open(path, "rt") as f:
        return sum(int(line.split(",")[1]) for line in f)


_ROW_SCHEMA = {"type": "record", "name": "Row", "fields": [
    {"name": "key", "type": "long"}, {"name": "amount", "type": "long"}]}


def _write_parquet(prefix: str):
    import pyarrow as pa

    return beam.io.WriteToParquet(prefix, pa.schema([("key", pa.int64()), ("amount", pa.int64())]))


def _write_gzip_text(prefix: str):
    return (beam.Map(lambda r: f"{r['key']},{r['amount']}")
            | beam.io.WriteToText(prefix, file_name_suffix=".csv.gz", num_shards=3))


# name -> (what it is, Beam build over n numbers)

@functools.cache
def _avro_file(n: int) -> str:
    """An Avro file of ``n`` records ``key, amount``, written once per process."""
    import fastavro

    path = os.path.join(tempfile.mkdtemp(prefix="beam_ext_avro_"), "rows.avro")
    schema = fastavro.parse_schema({"type": "record", "name": "Row", "fields": [
        {"name": "key", "type": "long"}, {"name": "amount", "type": "long"}]})
    with open(path, "wb") as f:
        fastavro.writer(f, schema, ({"key": i % 100, "amount": i} for i in range(n)), sync_interval=1 << 20)
    return path


@functools.cache
def _gzip_files(n: int) -> str:
    """``_SHARDS`` gzip-compressed text files of ``n`` numbers in all, written once per process; their glob."""
    import gzip

    folder = tempfile.mkdtemp(prefix="beam_ext_gzip_")
    per = n // _SHARDS
    for shard in range(_SHARDS):
        with gzip.open(os.path.join(folder, f"part-{shard}.txt.gz"), "wt") as f:
            f.writelines(f"{i}\n" for i in range(shard * per, (shard + 1) * per))
    return os.path.join(folder, "part-*.txt.gz")


class _RunningTotal(beam.DoFn):
    """A key's running total in combining state, output at every element (its largest is the key's sum)."""

    TOTAL = userstate.CombiningValueStateSpec("total", combine_fn=sum)

    def process(self, kv, total=beam.DoFn.StateParam(TOTAL)):
        total.add(kv[1])
        yield kv[0], total.read()


def _pane_sizes(p, n, windowfn, trigger_fn, keys: int = 100):
    """A GroupByKey of ``keys`` keys under ``trigger_fn``, discarding: every pane's size summed per key and
    window start, which is each window's count whichever elements each pane got."""
    def sized(kv, w=beam.DoFn.WindowParam):
        yield (kv[0], int(w.start)), len(kv[1])

    return (_stamped(p, n, 3600, lambda x: (x % keys, x))
            | beam.WindowInto(windowfn, trigger=trigger_fn, accumulation_mode=trigger.AccumulationMode.DISCARDING)
            | beam.GroupByKey() | beam.ParDo(sized) | "Global" >> beam.WindowInto(window.GlobalWindows())
            | beam.CombinePerKey(sum))


def _combine_with_side(p, n):
    """CombinePerKey of a function taking an AsSingleton side input (a floor under each key's largest), 100 keys.
    The function must give the same result applied again to its own partial results, as Beam may do."""
    floor = p | "Floor" >> beam.Create([1_000])
    return (_numbers(p, n) | beam.Map(lambda x: (x % 100, x % 7_919))
            | beam.CombinePerKey(lambda values, at_least: max([at_least, *values]),
                                 at_least=beam.pvalue.AsSingleton(floor)))


class _EveryMinute(window.NonMergingWindowFn):
    """A user's own window function: one-minute windows, assigned in Python."""

    def assign(self, context):
        start = int(context.timestamp) - int(context.timestamp) % 60
        return [window.IntervalWindow(start, start + 60)]

    def get_window_coder(self):
        return beam.coders.coders.IntervalWindowCoder()


class _Purchase(NamedTuple):
    key: int
    amount: float


beam.coders.registry.register_coder(_Purchase, beam.coders.RowCoder)


class _PaneTimings(beam.DoFn):
    """Each pane's timing and size, read from ``PaneInfoParam``."""

    def process(self, kv, pane=beam.DoFn.PaneInfoParam):
        yield pane.timing, len(kv[1])


def _match_read(p, n):
    """fileio.MatchFiles and ReadMatches of a glob, each file's lines parsed, summed per remainder of 100."""
    return (p | fileio.MatchFiles(_text_files(n)) | fileio.ReadMatches()
            | beam.FlatMap(lambda f: f.read_utf8().splitlines()) | beam.Map(lambda line: (int(line) % 100, int(line)))
            | beam.CombinePerKey(sum))


def _keys_values(p, n):
    """Keys and Values of the same pairs, each summed, the two sums flattened."""
    pairs = _numbers(p, n) | beam.Map(lambda x: (x % 1000, x))
    return ((pairs | beam.Keys() | "SumKeys" >> beam.CombineGlobally(sum),
             pairs | beam.Values() | "SumValues" >> beam.CombineGlobally(sum)) | beam.Flatten())


def _window_start(kv, w=beam.DoFn.WindowParam):
    return int(w.start), kv


CASES: dict[str, tuple[str, Callable]] = {
    "cogbk": ("CoGroupByKey, n and n/10 numbers over 10,000 keys", lambda p, n: (
        {"a": _numbers(p, n) | "KeyA" >> beam.Map(lambda x: (x % 10_000, x)),
         "b": _numbers(p, n // 10, "B") | "KeyB" >> beam.Map(lambda x: (x % 10_000, -x))}
        | beam.CoGroupByKey() | beam.MapTuple(lambda k, g: (k, len(g["a"]), len(g["b"]))))),
    "flatten_gbk": ("Flatten of three, GroupByKey over 1,000 keys", lambda p, n: (
        tuple(_numbers(p, n // 3, label) for label in "ABC") | beam.Flatten()
        | beam.Map(lambda x: (x % 1000, x)) | beam.GroupByKey() | beam.MapTuple(lambda k, vs: (k, sum(vs))))),
    "partition": ("Partition into 4, Flatten, Count.Globally", lambda p, n: (
        _numbers(p, n) | beam.Partition(lambda x, parts: x % parts, 4) | beam.Flatten()
        | beam.combiners.Count.Globally())),
    "tagged": ("ParDo with a tagged output, each counted", _tagged),
    "distinct": ("Distinct of 50,000 values", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: x % 50_000) | beam.Distinct() | beam.combiners.Count.Globally())),
    "top_per_key": ("Top.PerKey(3), 100 keys", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: (x % 100, x)) | beam.combiners.Top.PerKey(3))),
    "top_of": ("Top.Of(5)", lambda p, n: _numbers(p, n) | beam.combiners.Top.Of(5)),
    "bundle_flush": ("DoFn flushing sums of 100 and the rest in finish_bundle, summed", lambda p, n: (
        _numbers(p, n) | beam.ParDo(_FlushesHundreds()) | beam.CombineGlobally(sum))),
    "stateful_dofn": ("stateful DoFn (a running count per key), 1,000 keys", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: (x % 1000, x)) | beam.ParDo(_RunningCount())
        | beam.CombinePerKey(max))),
    "stateful_bundle": ("stateful DoFn with start_bundle, 1,000 keys", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: (x % 1000, x)) | beam.ParDo(_CountedInBundles())
        | beam.CombinePerKey(max))),
    "stateful_side": ("stateful DoFn with an AsDict side input of 10, 1,000 keys", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: (x % 1000, x))
        | beam.ParDo(_WeightedCount(), beam.pvalue.AsDict(p | "Weights" >> beam.Create([(i, i) for i in range(10)])))
        | beam.CombinePerKey(max))),
    "group_into_batches": ("GroupIntoBatches(100), 10 keys", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: (x % 10, x)) | beam.GroupIntoBatches(100)
        | beam.MapTuple(lambda k, b: (k, len(b))) | beam.CombinePerKey(sum))),
    "side_list": ("Map with an AsList side input of 1,000", lambda p, n: _side(
        p, n, beam.pvalue.AsList, list(range(1000)), lambda x, s: x + s[x % len(s)])),
    "side_singleton": ("Map with an AsSingleton side input", lambda p, n: _side(
        p, n, beam.pvalue.AsSingleton, [3], lambda x, s: x * s)),
    "windowed_side": ("Map in 1-minute windows with an AsDict side input of 100, summed per key and window",
                      lambda p, n: (
        _stamped(p, n, 3600) | "Fix" >> beam.WindowInto(window.FixedWindows(60))
        | beam.Map(lambda kv, rates: (kv[0], kv[1] * rates[kv[0]]),
                   rates=beam.pvalue.AsDict(p | "Rates" >> beam.Create([(k, k % 7) for k in range(100)])))
        | beam.CombinePerKey(sum) | "Unwindow" >> beam.WindowInto(window.GlobalWindows())
        | beam.combiners.Count.Globally())),
    "window_share": ("each element's share of its 1-minute window's total, an AsSingleton side input per window",
                     _window_shares),
    "combine_fn_class": ("CombinePerKey of a CombineFn class, 1,000 keys", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: (x % 1000, x)) | beam.CombinePerKey(_Mean()))),
    "count_per_element": ("Count.PerElement, 1,000 values", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: x % 1000) | beam.combiners.Count.PerElement())),
    "filter_kvswap": ("Filter, KvSwap, Keys, Count.PerElement", lambda p, n: (
        _numbers(p, n) | beam.Filter(lambda x: x % 2 == 0) | beam.Map(lambda x: (x, x % 7))
        | beam.KvSwap() | beam.Keys() | beam.combiners.Count.PerElement())),
    "sliding_combine": ("CombinePerKey in 5-minute windows every minute, 100 keys", lambda p, n: (
        _stamped(p, n, 3600, lambda x: (x % 100, 1)) | "Slide" >> beam.WindowInto(window.SlidingWindows(300, 60))
        | beam.CombinePerKey(sum) | "Unwindow" >> beam.WindowInto(window.GlobalWindows())
        | beam.combiners.Count.Globally())),
    "fixed_gbk": ("GroupByKey in 1-minute windows, 100 keys", lambda p, n: (
        _stamped(p, n, 3600) | "Fix" >> beam.WindowInto(window.FixedWindows(60)) | beam.GroupByKey()
        | beam.MapTuple(lambda k, vs: (k, len(vs))) | "Unwindow" >> beam.WindowInto(window.GlobalWindows())
        | beam.CombinePerKey(sum))),
    "window_param": ("Map reading DoFn.WindowParam in fixed windows", lambda p, n: (
        _stamped(p, n, 1000, lambda x: x) | "Fix" >> beam.WindowInto(window.FixedWindows(100))
        | beam.Map(lambda x, w=beam.DoFn.WindowParam: (w.start.micros, 1)) | beam.CombinePerKey(sum))),
    "create_list": ("Create of n/3 numbers listed on the driver", lambda p, n: (
        p | beam.Create(list(range(n // 3))) | beam.Map(lambda x: x * 2) | beam.CombineGlobally(sum))),
    "sample": ("Sample.FixedSizeGlobally(10), its size", lambda p, n: (
        _numbers(p, n) | beam.combiners.Sample.FixedSizeGlobally(10) | beam.Map(len))),
    "mean_globally": ("Mean.Globally", lambda p, n: _numbers(p, n) | beam.combiners.Mean.Globally()),
    "to_list": ("ToList of n/10, its length", lambda p, n: (
        _numbers(p, n // 10) | beam.combiners.ToList() | beam.Map(len))),
    "splittable": ("splittable DoFn claiming n offsets in 8 ranges, summed", lambda p, n: (
        p | beam.Create([n // _SHARDS] * _SHARDS) | beam.Reshuffle() | beam.ParDo(_Offsets())
        | beam.CombineGlobally(sum))),
    "bounded_source": ("Read of a user's BoundedSource of n numbers in 8 bundles, summed", lambda p, n: (
        p | beam.io.Read(_NumberSource(n)) | beam.CombineGlobally(sum))),
    "batch_elements": ("BatchElements(100 to 1,000), the batches' sizes summed", lambda p, n: (
        _numbers(p, n) | beam.BatchElements(min_batch_size=100, max_batch_size=1000) | beam.Map(len)
        | beam.CombineGlobally(sum))),
    "dead_letters": ("Map with_exception_handling, one failure in 1,000; both outputs counted", _dead_letters),
    "five_tags": ("ParDo with five tagged outputs, each counted", _five_tags),
    "five_writes": ("five filters, four written as text by the pipeline", _five_writes),
    "batched_dofn": ("a batched DoFn doubling numpy arrays, summed", lambda p, n: (
        _numbers(p, n) | "Typed" >> beam.Map(lambda x: x).with_output_types(np.int64) | beam.ParDo(_Doubled())
        | "Int" >> beam.Map(int) | beam.CombineGlobally(sum))),
    "multimap_side": ("Map with an AsMultiMap side input of 3,000 values over 1,000 keys, summed", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda i, m: sum(m[i % 1000]), m=beam.pvalue.AsMultiMap(
            p | "Side" >> beam.Create([(k % 1000, k) for k in range(3000)]))) | beam.CombineGlobally(sum))),
    "count_per_key": ("Count.PerKey, 1,000 keys", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda i: (i % 1000, i)) | beam.combiners.Count.PerKey())),
    "gbk_combine_values": ("GroupByKey then CombineValues(sum), 1,000 keys", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda i: (i % 1000, i)) | beam.GroupByKey() | beam.CombineValues(sum))),
    "latest_per_key": ("Latest.PerKey of timestamped numbers, 1,000 keys", lambda p, n: (
        _stamped(p, n, 86_400, lambda x: (x % 1000, x)) | beam.combiners.Latest.PerKey())),
    "timestamp_param": ("Map reading DoFn.TimestampParam, summed", lambda p, n: (
        _stamped(p, n, 86_400) | beam.Map(lambda kv, ts=beam.DoFn.TimestampParam: ts.micros // 1_000_000 % 10)
        | beam.CombineGlobally(sum))),
    "regex": ("Regex.matches over the numbers as strings, counted", lambda p, n: (
        _numbers(p, n) | beam.Map(str) | beam.Regex.matches(r"1\d*7") | beam.combiners.Count.Globally())),
    "json_sums": ("JSON dumped and loaded, CombinePerKey(sum), 100 keys", _json_sums),
    "sample_per_key": ("Sample.FixedSizePerKey(3), 100 keys, the samples' sizes", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda i: (i % 100, i)) | beam.combiners.Sample.FixedSizePerKey(3)
        | beam.MapTuple(lambda k, v: (k, len(v))))),
    "approx_unique": ("ApproximateUnique.Globally(size=1,000) of 50,000 values", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda i: i % 50_000) | beam.ApproximateUnique.Globally(size=1000))),
    "cogbk3": ("CoGroupByKey of three (n, n/2 numbers, 1,000 names)", _cogbk3),
    "select_rows": ("beam.Row, Select, Filter on a field, counted", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda i: beam.Row(a=i, b=float(i) / 3, c=str(i % 10)))
        | beam.Select(a=lambda r: r.a * 2, c=lambda r: r.c) | beam.Filter(lambda r: r.c == "3")
        | beam.combiners.Count.Globally())),
    "early_panes": ("GroupByKey in 1-hour windows firing early every 1,000, 100 keys", _early_panes),
    "read_csv": ("ReadFromCsv of n rows, GroupBy(key).aggregate_field(amount, sum), 100 keys", _csv_sums),
    "read_json": ("ReadFromJson of n JSON lines, GroupBy(key).aggregate_field(amount, sum), 100 keys",
                  _json_records_sums),
    "frame_sums": ("DataFrame API: n rows to a frame, groupby(key).sum(), back to rows, 100 keys", _frame_sums),
    "frame_filter": ("DataFrame API: n rows filtered, a column assigned, back to rows, summed per key",
                     _frame_filter),
    "flatten_grouped": ("Flatten of a GroupByKey's groups (1,000 keys) and n/10 listed pairs, sizes summed per key",
                        lambda p, n: (
        (_numbers(p, n, "A") | "KeyA" >> beam.Map(lambda x: (x % 1000, x)) | beam.GroupByKey(),
         _numbers(p, n // 10, "B") | "KeyB" >> beam.Map(lambda x: (x % 1000, [x])))
        | beam.Flatten() | beam.MapTuple(lambda k, vs: (k, len(list(vs)))) | beam.CombinePerKey(sum))),
    "timer_flush": ("stateful DoFn buffering per key in 1-minute windows, flushed by an event-time timer, 100 keys",
                    _timer_flush),
    "sessions_count": ("CombinePerKey in 5-second sessions, 10,000 keys, the sessions' sizes counted",
                       _sessions_count),
    "quantiles": ("ApproximateQuantiles.Globally(5), each within its error bound of the exact quartile",
                  _quantiles),
    "reshuffle": ("Reshuffle of keyed numbers, the values summed", lambda p, n: (
        _numbers(p, n) | "Key" >> beam.Map(lambda x: (x % 1000, x)) | "Again" >> beam.Reshuffle() | beam.Values()
        | beam.CombineGlobally(sum))),
    "flatmap_explode": ("FlatMap of n/10 numbers into 10 each, Count.PerElement of 7 values", lambda p, n: (
        _numbers(p, n // 10) | beam.FlatMap(lambda x: range(x * 10, x * 10 + 10)) | beam.Map(lambda x: x % 7)
        | beam.combiners.Count.PerElement())),
    "mean_per_key": ("Mean.PerKey, 1,000 keys", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: (x % 1000, x)) | beam.combiners.Mean.PerKey())),
    "groupby_lambda": ("GroupBy(a lambda).aggregate_field(sum) of plain numbers, 100 groups", lambda p, n: (
        _numbers(p, n) | beam.GroupBy(lambda x: x % 100).aggregate_field(lambda x: x, sum, "total")
        | beam.Map(tuple))),
    "big_groups": ("GroupByKey over 10 keys, each group's size and sum", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: (x % 10, x)) | beam.GroupByKey()
        | beam.MapTuple(lambda k, vs: (k, len(vs), sum(vs))))),
    "parquet_sums": ("ReadFromParquet of n rows, CombinePerKey(sum), 100 keys", lambda p, n: (
        p | beam.io.ReadFromParquet(_parquet_file(n)) | beam.Map(lambda r: (r["key"], r["amount"]))
        | beam.CombinePerKey(sum))),
    "combine_globally_class": ("CombineGlobally of a CombineFn class", lambda p, n: (
        _numbers(p, n) | beam.CombineGlobally(_Mean()))),
    "gbk_sliding": ("GroupByKey in 10-minute windows every 5 minutes, 100 keys, the groups' sizes summed", lambda p, n: (
        _stamped(p, n, 3600) | beam.WindowInto(window.SlidingWindows(600, 300)) | beam.GroupByKey()
        | beam.MapTuple(lambda k, vs: (k, len(vs))) | "Unwindow" >> beam.WindowInto(window.GlobalWindows())
        | beam.CombinePerKey(sum))),
    "to_dict": ("ToDict of 1,000 keys' sums, its size", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: (x % 1000, x)) | beam.CombinePerKey(sum) | beam.combiners.ToDict()
        | beam.Map(len))),
    "big_side_dict": ("Map with an AsDict side input of 100,000 entries, summed", lambda p, n: _side(
        p, n, beam.pvalue.AsDict, [(k, k % 7) for k in range(100_000)], lambda x, s: s[x % 100_000])),
    "read_all_text": ("ReadAllFromText of 8 files, CombinePerKey(sum), 100 keys", _read_all_text),
    "write_files": ("fileio.WriteToFiles, the files written read back and summed", _write_files),
    "hot_key_fanout": ("CombinePerKey(sum).with_hot_key_fanout(16), 10 keys", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: (x % 10, x)) | beam.CombinePerKey(sum).with_hot_key_fanout(16))),
    "avro_sums": ("ReadFromAvro of n records, CombinePerKey(sum), 100 keys", lambda p, n: (
        p | beam.io.ReadFromAvro(_avro_file(n)) | beam.Map(lambda r: (r["key"], r["amount"]))
        | beam.CombinePerKey(sum))),
    "gzip_text": ("ReadFromText of 8 gzip files, CombinePerKey(sum), 100 keys", lambda p, n: (
        p | beam.io.ReadFromText(_gzip_files(n)) | beam.Map(lambda line: (int(line) % 100, int(line)))
        | beam.CombinePerKey(sum))),
    "many_text_files": ("ReadFromText of 200 files, CombinePerKey(sum), 100 keys", lambda p, n: (
        p | beam.io.ReadFromText(_text_files(n, 200)) | beam.Map(lambda line: (int(line) % 100, int(line)))
        | beam.CombinePerKey(sum))),
    "many_parquet_files": ("ReadFromParquet of 100 files, CombinePerKey(sum), 100 keys", lambda p, n: (
        p | beam.io.ReadFromParquet(_parquet_files(n, 100)) | beam.Map(lambda r: (r["key"], r["amount"]))
        | beam.CombinePerKey(sum))),
    "count_trigger": ("GroupByKey in the global window firing every 1,000 (discarding), 100 keys, panes' sizes",
                      lambda p, n: _pane_sizes(
                          p, n, window.GlobalWindows(), trigger.Repeatedly(trigger.AfterCount(1000)))),
    "sessions_early": ("GroupByKey in 5-second sessions firing early every 100, 1,000 keys, panes' sizes",
                       lambda p, n: _pane_sizes(
                           p, n, window.Sessions(5), trigger.AfterWatermark(early=trigger.AfterCount(100)), keys=1000)),
    "window_count": ("Count.Globally in 1-minute windows (without defaults)", lambda p, n: (
        _stamped(p, n, 3600) | beam.WindowInto(window.FixedWindows(60))
        | beam.CombineGlobally(beam.combiners.CountCombineFn()).without_defaults()
        | beam.Map(lambda c, w=beam.DoFn.WindowParam: (int(w.start), c)))),
    "dict_values": ("GroupByKey of dict values, 1,000 keys, the groups' sizes and sums", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: (x % 1000, {"id": x, "name": f"n{x}"})) | beam.GroupByKey()
        | beam.MapTuple(lambda k, vs: (k, len(vs), sum(v["id"] for v in vs))))),
    "combining_state": ("stateful DoFn with combining state (a running total per key), 1,000 keys, the largest",
                        lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: (x % 1000, x)) | beam.ParDo(_RunningTotal())
        | beam.CombinePerKey(max))),
    "sharded_batches": ("GroupIntoBatches.WithShardedKey(100), 10 keys, the batches' sizes per key", lambda p, n: (
        # Typed keys: a ShardedKey of an untyped key has no deterministic coder in Beam (FnApiRunner fails too).
        _numbers(p, n) | beam.Map(lambda x: (x % 10, x)).with_output_types(tuple[int, int])
        | beam.GroupIntoBatches.WithShardedKey(100)
        | beam.MapTuple(lambda k, vs: (k.key, len(vs))) | beam.CombinePerKey(sum))),
    "combine_side": ("CombinePerKey of a function with an AsSingleton side input (max with a floor), 100 keys", _combine_with_side),
    "custom_windowfn": ("a user's own NonMergingWindowFn (1-minute), CombinePerKey(sum), 100 keys", lambda p, n: (
        _stamped(p, n, 3600) | beam.WindowInto(_EveryMinute()) | beam.CombinePerKey(sum) | beam.Map(_window_start))),
    "tuple_combine": ("CombinePerKey(SingleInputTupleCombineFn(sum, max, min)), 1,000 keys", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: (x % 1000, x))
        | beam.CombinePerKey(combiners.SingleInputTupleCombineFn(sum, max, min)))),
    "namedtuple_groupby": ("NamedTuple rows (RowCoder), GroupBy(key).aggregate_field(sum), 100 keys", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: _Purchase(x % 100, float(x))).with_output_types(_Purchase)
        | beam.GroupBy("key").aggregate_field("amount", sum, "total") | beam.Map(tuple))),
    "numpy_values": ("numpy arrays of n/10 as values, GroupByKey, each group summed, 100 keys", lambda p, n: (
        _numbers(p, n // 10) | beam.Map(lambda x: (x % 100, np.arange(4) + x)) | beam.GroupByKey()
        | beam.MapTuple(lambda k, vs: (k, int(np.sum(vs)))))),
    "reify_window": ("Reify.Window after 1-minute windows, counted per window start", lambda p, n: (
        _stamped(p, n, 3600) | beam.WindowInto(window.FixedWindows(60)) | beam.Reify.Window()
        | beam.Map(lambda v: int(v[2].start)) | "Global" >> beam.WindowInto(window.GlobalWindows())
        | beam.combiners.Count.PerElement())),
    "top_largest_per_key": ("Top.LargestPerKey(3), 1,000 keys", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: (x % 1000, x)) | beam.combiners.Top.LargestPerKey(3))),
    "match_read": ("fileio.MatchFiles, ReadMatches of 8 files, lines parsed, CombinePerKey(sum), 100 keys", _match_read),
    "string_keys": ("CombinePerKey(sum) of string keys, 1,000 keys", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: (f"user{x % 1000}", x)) | beam.CombinePerKey(sum))),
    "pane_info": ("GroupByKey in 1-minute windows, a DoFn reading PaneInfoParam, sizes summed per timing", lambda p, n: (
        _stamped(p, n, 3600) | beam.WindowInto(window.FixedWindows(60)) | beam.GroupByKey()
        | beam.ParDo(_PaneTimings()) | "Global" >> beam.WindowInto(window.GlobalWindows()) | beam.CombinePerKey(sum))),
    "typed_gbk": ("typed pairs (with_output_types), GroupByKey, the groups' sizes, 1,000 keys", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: (x % 1000, x)).with_output_types(tuple[int, int])
        | beam.GroupByKey() | beam.MapTuple(lambda k, vs: (k, len(vs))))),
    "rewindow": ("CombinePerKey in 1-minute windows, re-windowed to 10 minutes, combined again, 100 keys", lambda p, n: (
        _stamped(p, n, 3600) | beam.WindowInto(window.FixedWindows(60)) | beam.CombinePerKey(sum)
        | "Ten" >> beam.WindowInto(window.FixedWindows(600)) | "Again" >> beam.CombinePerKey(sum)
        | beam.Map(_window_start))),
    "to_string_kvs": ("ToString.Kvs of sums per key (1,000 keys), Distinct lengths", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: (x % 1000, x)) | beam.CombinePerKey(sum) | beam.ToString.Kvs()
        | beam.Map(len) | beam.Distinct())),
    "partition_combine": ("Partition in 3, flattened, CombinePerKey(sum), 100 keys", lambda p, n: (
        (_numbers(p, n) | beam.Map(lambda x: (x % 100, x)) | beam.Partition(lambda kv, k: kv[1] % k, 3))
        | beam.Flatten() | beam.CombinePerKey(sum))),
    "keys_values": ("Keys and Values of pairs (1,000 keys), each summed", _keys_values),
    "write_parquet": ("WriteToParquet of n records, the files it wrote read back and summed", lambda p, n: (
        _written_back(p, n, _write_parquet, _parquet_amounts))),
    "write_avro": ("WriteToAvro of n records, the files it wrote read back and summed", lambda p, n: (
        _written_back(p, n, lambda prefix: beam.io.WriteToAvro(prefix, _ROW_SCHEMA), _avro_amounts))),
    "write_gzip_text": ("WriteToText of n CSV lines, gzip by suffix, 3 shards, read back and summed", lambda p, n: (
        _written_back(p, n, _write_gzip_text, _gzip_amounts))),
    "sliding_rows": ("SlidingAggregate of dict events (1,000 cards, 5-minute sum and count), counts summed",
                     lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: {"card": x % 1000, "ts": x * 0.25, "amount": float(x % 97)})
        | SlidingAggregate(key="card", timestamp="ts", windows={"5m": SlidingWindow(300.0)},
                           aggregations={"sum": agg.sum("amount"), "count": agg.count()})
        | beam.Map(lambda event_features: event_features[1]["count_5m"]) | beam.CombineGlobally(sum))),
    "reshuffle_stamped": ("timestamped pairs Reshuffled, CombinePerKey(sum) in 1-minute windows, 100 keys, summed",
                          lambda p, n: (
        _stamped(p, n, 3600) | beam.Reshuffle() | beam.WindowInto(window.FixedWindows(60)) | beam.CombinePerKey(sum)
        | "Global" >> beam.WindowInto(window.GlobalWindows()) | beam.Values() | beam.CombineGlobally(sum))),
    "dataclass_values": ("dataclass values (pickled by Beam's coder), GroupByKey, 1,000 keys, sizes and sums",
                         lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: (x % 1000, Purchase(x % 1000, float(x), "book"))) | beam.GroupByKey()
        | beam.MapTuple(lambda k, ps: (k, len(ps), sum(p.amount for p in ps))))),
    "tuple_keys_gbk": ("GroupByKey of tuple keys, 700 keys, sizes and sums", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: ((x % 100, x % 7), x)) | beam.GroupByKey()
        | beam.MapTuple(lambda k, vs: (k, len(vs), sum(vs))))),
    "tuple_keys_combine": ("CombinePerKey(sum) of tuple keys, 700 keys", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: ((x % 100, x % 7), x)) | beam.CombinePerKey(sum))),
    "float_keys_gbk": ("GroupByKey of float keys, 1,000 keys, sizes", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: (float(x % 1000), x)) | beam.GroupByKey()
        | beam.MapTuple(lambda k, vs: (k, len(vs))))),
    "count_tuples": ("Count.PerElement of (int, str) tuples, 1,000 distinct", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: (x % 50, str(x % 20))) | beam.combiners.Count.PerElement())),
    "ungroup": ("GroupByKey then each value out again, doubled, 1,000 keys, summed", lambda p, n: (
        _numbers(p, n) | beam.Map(lambda x: (x % 1000, x)) | beam.GroupByKey()
        | beam.FlatMapTuple(lambda k, vs: ((k, v * 2) for v in vs)) | beam.CombinePerKey(sum))),
}


def _run(runner, build: Callable, n: int, out: str, streaming: bool = False) -> tuple[float, list[str]]:
    """One run's seconds, and its output's lines, sorted."""
    from apache_beam.options.pipeline_options import PipelineOptions

    start = time.perf_counter()
    with beam.Pipeline(runner=runner, options=PipelineOptions(["--streaming"] if streaming else [])) as p:
        build(p, n) | "Repr" >> beam.Map(repr) | "Write" >> beam.io.WriteToText(out, num_shards=1)
    seconds = time.perf_counter() - start
    lines: list[str] = []
    for path in glob.glob(out + "*"):
        with open(path) as f:
            lines += f.read().splitlines()
    return seconds, sorted(lines)


@contextlib.contextmanager
def scratch(prefix: str) -> Iterator[str]:
    """A directory that takes every temporary file and directory this process
    makes while inside (the cases' inputs, both runners' own), removed after."""
    root = tempfile.mkdtemp(prefix=prefix)
    saved, tempfile.tempdir = tempfile.tempdir, root
    try:
        yield root
    finally:
        tempfile.tempdir = saved
        shutil.rmtree(root, ignore_errors=True)


def run(names: list[str], n: int, runs: int, streaming: bool = False) -> list[dict]:
    with scratch("beam_ext_common_") as tmp:
        return _run_all(names, n, runs, tmp, streaming)


def _run_all(names: list[str], n: int, runs: int, tmp: str, streaming: bool) -> list[dict]:
    from spark_settings import local_session

    from beam_ext.runner import SparkRunner

    spark = local_session("runner-common")
    rows = []
    try:
        for name in names:
            label, build = CASES[name]
            _run(SparkRunner(), build, n, os.path.join(tmp, f"{name}_warm"), streaming)
            times: dict[str, list[float]] = {"spark": [], "direct": []}
            outputs: dict[str, list[str]] = {}
            direct_error = None
            for i in range(runs):
                for engine, runner in (("spark", SparkRunner()), ("direct", beam.runners.DirectRunner())):
                    if engine == "direct" and direct_error:
                        continue
                    try:
                        seconds, outputs[engine] = _run(runner, build, n, os.path.join(tmp, f"{name}_{engine}_{i}"),
                                                        streaming)
                    except Exception as error:  # noqa: BLE001 - reported in the table: the anchor cannot run it
                        if engine == "spark":
                            raise
                        direct_error = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
                        continue
                    times[engine].append(seconds)
            row = dict(name=name, label=label, spark=statistics.median(times["spark"]),
                       direct=statistics.median(times["direct"]) if times["direct"] else None,
                       same=outputs["spark"] == outputs.get("direct"), direct_error=direct_error)
            rows.append(row)
            if direct_error:
                print(f"{name:20s} SparkRunner {row['spark']:6.2f} s  DirectRunner failed: {direct_error}", flush=True)
            else:
                print(f"{name:20s} SparkRunner {row['spark']:6.2f} s  DirectRunner {row['direct']:6.2f} s  "
                      f"{row['direct'] / row['spark']:5.2f}x  same output: {row['same']}", flush=True)
    finally:
        spark.stop()
    return rows


def write_report(rows: list[dict], out_dir: str, n: int, runs: int, command: str, streaming: bool = False) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    failed = [row for row in rows if row.get("direct_error")]
    rows = [row for row in rows if not row.get("direct_error")]
    fig, ax = plt.subplots(figsize=(7, 0.32 * len(rows) + 1.2))
    ratios = [row["direct"] / row["spark"] for row in rows]
    ax.barh([row["name"] for row in rows], ratios,
            color=["tab:green" if r >= TARGET_VS_DIRECT else "tab:orange" for r in ratios])
    ax.axvline(TARGET_VS_DIRECT, color="grey", linestyle="--", label=f"target {TARGET_VS_DIRECT:.0f}x")
    ax.invert_yaxis()
    ax.set_xlabel("SparkRunner speed-up over DirectRunner (its time / ours)")
    mode = ", streaming" if streaming else ""
    name = "runner_common_streaming" if streaming else "runner_common"
    ax.set_title(f"common pipelines{mode}, {n:,} numbers, 2 cores")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, f"{name}.png"), dpi=110)
    lines = [
        f"# Common pipelines{' in streaming' if streaming else ''}: SparkRunner against DirectRunner",
        "",
        f"Reproduce: `{command}`",
        "",
        f"Each pipeline over {n:,} generated numbers, on SparkRunner (local[2], warm session) and on "
        f"Beam's DirectRunner{', both in streaming mode' if streaming else ''}, alternating, median of {runs} "
        "run(s) each; every run writes its output, and the two runners' outputs are compared line by line. "
        "Machine: 2 cores.",
        "",
        "| pipeline | what | SparkRunner | DirectRunner | SparkRunner / DirectRunner | same output |",
        "|---|---|---:|---:|---:|---|",
    ]
    for row, ratio in zip(rows, ratios):
        lines.append(f"| `{row['name']}` | {row['label']} | {row['spark']:.2f} s | {row['direct']:.2f} s | "
                     f"{ratio:.2f}x | {'yes' if row['same'] else '**no**'} |")
    for row in failed:
        lines.append(f"| `{row['name']}` | {row['label']} | {row['spark']:.2f} s | fails: {row['direct_error']} "
                     "| — | — |")
    short = [row["name"] for row, ratio in zip(rows, ratios) if ratio < TARGET_VS_DIRECT]
    lines += ["", f"Below {TARGET_VS_DIRECT:.0f}x DirectRunner: {', '.join(short) or 'none'}.", "",
              f"![common pipelines]({name}.png)", ""]
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    parser.add_argument("--streaming", action="store_true", help="run both runners in streaming mode")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "docs", "benchmarks"))
    args = parser.parse_args()
    names = args.cases.split(",")
    for name in names:
        if name not in CASES:
            parser.error(f"unknown case {name!r}; known: {', '.join(CASES)}")
    rows = run(names, args.size, args.runs, args.streaming)
    command = "python benchmarks/runner_common.py" + " --streaming" * args.streaming + "".join(
        f" --{flag} {value}" for flag, value, default in (
            ("size", args.size, 1_000_000), ("runs", args.runs, 1), ("cases", args.cases, ",".join(CASES)))
        if value != default)
    write_report(rows, args.out, args.size, args.runs, command, args.streaming)
    print(f"report: {os.path.join(args.out, 'runner_common_streaming.md' if args.streaming else 'runner_common.md')}")


if __name__ == "__main__":
    main()
