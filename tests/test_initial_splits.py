"""A splittable DoFn's few restrictions split by their own trackers, so that
every task reads (``beam_ext/runner/worker/_initial_splits.py``).

Each pipeline runs on SparkRunner (``local[2]``: two tasks) and is checked
against Beam's own runner and against Python; where it matters, the Spark
partitions that read are seen from inside the pipeline.
"""
from __future__ import annotations

import csv

import apache_beam as beam
import pytest
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker, UnsplittableRestrictionTracker
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.transforms import window
from apache_beam.utils.windowed_value import WindowedValue
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pipeline_outputs import run_and_collect, spark_equals_direct

from beam_ext.runner import PipelineError, SparkRunner
from beam_ext.runner.worker._initial_splits import fill_tasks


class _Offsets(beam.DoFn, beam.RestrictionProvider):
    """Element ``n``'s offsets ``[0, n)`` in one restriction, which Beam may
    split unless ``whole``; each restriction processed counted."""

    def __init__(self, whole: bool = False) -> None:
        self.whole = whole

    def initial_restriction(self, n):
        return OffsetRange(0, n)

    def create_tracker(self, restriction):
        tracker = OffsetRestrictionTracker(restriction)
        return UnsplittableRestrictionTracker(tracker) if self.whole else tracker

    def restriction_size(self, n, restriction):
        return restriction.size()

    def process(self, n, w=beam.DoFn.WindowParam, tracker=beam.DoFn.RestrictionParam()):
        Metrics.counter("splits", "restrictions").inc()
        offset = tracker.current_restriction().start
        while tracker.try_claim(offset):
            yield n, offset, _start(w)
            offset += 1


def _start(w):
    return None if isinstance(w, window.GlobalWindow) else int(w.start)


def _offsets(ns: list[int], whole: bool = False, windowed: bool = False):
    def build(p):
        numbers = p | beam.Create(ns)
        if windowed:
            numbers = (numbers | "Stamp" >> beam.Map(lambda n: window.TimestampedValue(n, n))
                       | beam.WindowInto(window.SlidingWindows(10, 5)))
        return numbers | "Offsets" >> beam.ParDo(_Offsets(whole))
    return build


def _oracle(ns: list[int], windowed: bool = False) -> list:
    def starts(n):
        return [s for s in (n - n % 5 - 5, n - n % 5) if s + 10 > n] if windowed else [None]
    return sorted(([n, i, s] for n in ns for s in starts(n) for i in range(n)), key=repr)


def _restrictions_processed(build) -> int:
    with beam.Pipeline(runner=SparkRunner()) as p:
        build(p)
    result = p.result
    [counter] = result.metrics().query(MetricsFilter().with_name("restrictions"))["counters"]
    return counter.committed


def test_one_restriction_is_split_to_fill_the_tasks(tmp_path, spark):
    build = _offsets([1_000])
    assert sorted(spark_equals_direct(build, tmp_path), key=repr) == _oracle([1_000])
    assert spark.sparkContext.defaultParallelism == 2
    assert _restrictions_processed(build) == 2


def test_an_unsplittable_restriction_is_read_whole(tmp_path):
    build = _offsets([1_000], whole=True)
    assert sorted(spark_equals_direct(build, tmp_path), key=repr) == _oracle([1_000])
    assert _restrictions_processed(build) == 1


def test_restrictions_in_windows_keep_their_windows(tmp_path):
    build = _offsets([7], windowed=True)
    assert sorted(spark_equals_direct(build, tmp_path), key=repr) == _oracle([7], windowed=True)
    # Two windows, each window's offsets read in two pieces.
    assert _restrictions_processed(build) == 4


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ns=st.lists(st.integers(0, 40), max_size=3), whole=st.booleans(), windowed=st.booleans())
def test_random_restrictions_equal_python(tmp_path_factory, ns, whole, windowed):
    got = run_and_collect(SparkRunner(), _offsets(ns, whole, windowed), str(tmp_path_factory.mktemp("splits")))
    assert sorted(got, key=repr) == _oracle(ns, windowed)


def _sized(sizes: list[int]) -> list[WindowedValue]:
    return [WindowedValue(((n, (OffsetRange(0, n), None)), n), 0, (window.GlobalWindow(),)) for n in sizes]


@settings(max_examples=300, deadline=None)
@given(sizes=st.lists(st.integers(0, 50), max_size=5), tasks=st.integers(1, 6), whole=st.booleans())
def test_pieces_cover_each_restriction_once(sizes, tasks, whole):
    pieces = fill_tasks(_Offsets(whole), _sized(sizes), tasks)
    for wv in pieces:
        (n, (restriction, state)), size = wv.value
        assert state is None and size == restriction.size() and 0 <= restriction.start <= restriction.stop <= n
        assert wv.windows == (window.GlobalWindow(),)
    # Each element's offsets, in its pieces, once: none lost, none read twice.
    claimed = sorted((n, i) for (n, (r, _)), _ in (wv.value for wv in pieces) for i in range(r.start, r.stop))
    assert claimed == sorted((n, i) for n in sizes for i in range(n))
    if whole or len(sizes) >= tasks or not any(sizes):
        assert [wv.value for wv in pieces] == [wv.value for wv in _sized(sizes)]
    else:
        assert len(pieces) == tasks


def test_beams_read_from_csv_of_one_file_reads_on_every_task(tmp_path):
    path = tmp_path / "rows.csv"
    rows = [(i % 7, i * 0.5, f"n,{i % 3}") for i in range(5_000)]  # a quoted comma in each name
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["key", "amount", "name"])
        writer.writerows(rows)

    def build(p):
        return p | beam.io.ReadFromCsv(str(path)) | beam.Map(lambda row: [row.key, row.amount, row.name])

    got = spark_equals_direct(build, tmp_path)
    assert sorted(map(tuple, got)) == sorted(rows)

    def partitions(p):
        from pyspark import TaskContext

        return (p | beam.io.ReadFromCsv(str(path))
                | beam.Map(lambda row: (TaskContext.get().partitionId(), 1)) | beam.CombinePerKey(sum))
    counts = dict(map(tuple, run_and_collect(SparkRunner(), partitions, str(tmp_path / "partitions"))))
    assert sorted(counts) == [0, 1] and sum(counts.values()) == len(rows)


@pytest.mark.parametrize("rows, splittable", [(0, True), (1, True), (3, False)])
def test_beams_read_from_csv_of_a_small_file_equals_beam(tmp_path, rows, splittable):
    # Pieces holding no line start read nothing; a file read with splittable=False stays whole.
    path = tmp_path / "few.csv"
    path.write_text("key,amount\n" + "".join(f"{i},{i * 2}\n" for i in range(rows)))

    def build(p):
        return (p | beam.io.ReadFromCsv(str(path), splittable=splittable)
                | beam.Map(lambda row: [row.key, row.amount]))
    assert spark_equals_direct(build, tmp_path) == [[i, i * 2] for i in range(rows)]


class _RefusesLoudly(OffsetRestrictionTracker):
    def try_split(self, fraction_of_remainder):
        raise RuntimeError("this tracker cannot split here")


class _LoudOffsets(_Offsets):
    def create_tracker(self, restriction):
        return _RefusesLoudly(restriction)


def test_a_tracker_failing_to_split_fails_the_pipeline_naming_the_step():
    with pytest.raises(PipelineError) as info:
        with beam.Pipeline(runner=SparkRunner()) as p:
            _ = p | beam.Create([10]) | "ReadOffsets" >> beam.ParDo(_LoudOffsets())
    assert "ReadOffsets" in str(info.value) and "this tracker cannot split here" in str(info.value)


def _avro_file(path, n: int) -> str:
    import fastavro

    schema = fastavro.parse_schema({"type": "record", "name": "Row", "fields": [
        {"name": "key", "type": "long"}, {"name": "amount", "type": "long"}]})
    with open(path, "wb") as f:  # small sync blocks: the pieces' bounds fall between many of them
        fastavro.writer(f, schema, ({"key": i % 7, "amount": i} for i in range(n)), sync_interval=2048)
    return str(path)


@pytest.mark.parametrize("n", [1, 3, 20_000])
def test_beams_read_from_avro_of_one_file_is_split_by_its_source(tmp_path, n):
    """Beam's wrapper of a BoundedSource refuses to split before a claim; its
    source's own split cuts it, and every record is read once."""
    path = _avro_file(tmp_path / "rows.avro", n)

    def build(p):
        return p | beam.io.ReadFromAvro(path) | beam.Map(lambda row: [row["key"], row["amount"]])

    assert sorted(map(tuple, spark_equals_direct(build, tmp_path))) == sorted((i % 7, i) for i in range(n))

    def partitions(p):
        from pyspark import TaskContext

        return (p | beam.io.ReadFromAvro(path)
                | beam.Map(lambda row: (TaskContext.get().partitionId(), 1)) | beam.CombinePerKey(sum))
    counts = dict(map(tuple, run_and_collect(SparkRunner(), partitions, str(tmp_path / "partitions"))))
    assert sum(counts.values()) == n
    assert len(counts) == (2 if n == 20_000 else 1)
