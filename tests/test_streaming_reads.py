"""Bounded file reads in a streaming pipeline run Spark-natively and give the DirectRunner's results.

A streaming SparkRunner plan runs ``ReadFromText``, ``ReadFromParquet`` and
``ReadFromParquetBatched`` through the batch's native readers in the first
micro-batch, instead of Beam's splittable ``DoFn`` record by record. The
oracle is Beam's streaming DirectRunner, with each read given as a
``Create`` of the records the files hold (Python's own reading of them): its
streaming engine fails on Beam's bounded reads ("Transform node
...SDFBoundedSourceReader/.../GroupByKey ... was not replaced as
expected"), and a read's records are exactly that, elements at the minimum
timestamp in the global window. Compared: each element's timestamp, window
and pane downstream of the read, the read as a side input and flattened
with a ``TestStream``; and the runner's own Beam expansion of the read
(``--watermarks=tracker``, and a checkpoint of a plan that read through it).
"""
from __future__ import annotations

import gzip
import logging
import os
import time

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
from apache_beam.runners.runner import PipelineState
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import trigger, window
from pipeline_outputs import AppendLines, read_lines
from test_initial_splits import _avro_file
from test_runner_batch import _OnePerCall

from beam_ext.runner import SparkRunner
from beam_ext.runner.native._parquetio import READ_PARQUET_BATCHED_URN, READ_PARQUET_URN
from beam_ext.runner.native._textio import READ_TEXT_URN

TV = window.TimestampedValue


def _text_files(directory) -> tuple[str, list[str]]:
    """Three files of ``<word> <second>`` lines under a header line, one of
    them gzip; returns their pattern and every line but the headers."""
    os.makedirs(directory, exist_ok=True)
    every = []
    for f in range(3):
        lines = [f"w{(i * 7 + f) % 5} {i % 30}" for i in range(200)]
        every += lines
        data = ("\n".join(["word second", *lines]) + "\n").encode()
        if f == 1:
            with gzip.open(os.path.join(directory, f"part-{f}.txt.gz"), "wb") as out:
                out.write(data)
        else:
            with open(os.path.join(directory, f"part-{f}.txt"), "wb") as out:
                out.write(data)
    return os.path.join(directory, "part-*"), every


def _equals_direct(build, tmp_path) -> list:
    """Asserts ``build(p, native)`` on SparkRunner (``native`` True: its reads
    are Beam's IO) writes what it does on the streaming DirectRunner
    (``native`` False: its reads are Creates of the records); returns it."""
    results = []
    for name, runner, native in (("direct", BundleBasedDirectRunner(), False), ("spark", SparkRunner(), True)):
        path = str(tmp_path / f"{name}.jsonl")
        with beam.Pipeline(runner=runner, options=PipelineOptions(["--streaming"])) as p:
            _ = build(p, native) | f"Append[{name}]" >> beam.ParDo(AppendLines(path))
        results.append(read_lines(path))
    direct, spark = results
    assert spark == direct
    return spark


def _panes(pcoll):
    return pcoll | "Panes" >> beam.Map(
        lambda kv, w=beam.DoFn.WindowParam, p=beam.DoFn.PaneInfoParam, t=beam.DoFn.TimestampParam:
        [kv[0], sorted(kv[1]), str(w), float(t), p.timing, p.index, p.is_first, p.is_last])


def _natives(result) -> list[str]:
    return [stage.native.urn for stage in result._executor._plan.stages if stage.native is not None]


def _planned_as_before(spark, build):
    """``build``'s streaming plan as releases before these reads made it."""
    from apache_beam.transforms import environments

    from beam_ext.runner.planning import plan_pipeline

    p = beam.Pipeline(options=PipelineOptions(["--streaming"]))
    build(p)
    proto = p.to_runner_api(default_environment=environments.EmbeddedPythonEnvironment.default())
    return plan_pipeline(proto, 1 << 20, spark.sparkContext.defaultParallelism, streaming=True,
                         native_reads=False, reads_whole=False, native_creates=False)


def _run(build, path: str, options: list[str]):
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(["--streaming"] + options))
    _ = build(p) | beam.ParDo(AppendLines(path))
    result = p.run()
    assert result.wait_until_finish() == PipelineState.DONE
    return read_lines(path), result


def test_text_read_in_streaming_runs_natively_and_equals_direct_runner(spark, tmp_path):
    pattern, lines = _text_files(tmp_path / "in")

    def build(p, native=True):
        read = p | (beam.io.ReadFromText(pattern, skip_header_lines=1) if native else beam.Create(lines))
        words = (read | beam.Map(str.split)
                 | "Timestamped" >> beam.Map(lambda wt: TV((wt[0], int(wt[1])), int(wt[1]))))
        return _panes(words | beam.WindowInto(
            window.FixedWindows(10), trigger=trigger.AfterWatermark(early=trigger.AfterCount(50)),
            accumulation_mode=trigger.AccumulationMode.DISCARDING) | beam.GroupByKey())

    out = _equals_direct(build, tmp_path)
    # Each file's header is skipped; the gzip file is read whole.
    assert sum(len(values) for _, values, *_ in out) == 600
    assert {timing for *_, timing, _, _, _ in out} == {beam.utils.windowed_value.PaneInfoTiming.ON_TIME}
    _, result = _run(build, str(tmp_path / "again.jsonl"), [])
    assert _natives(result) == [READ_TEXT_URN]


def test_parquet_reads_in_streaming_run_natively_and_equal_direct_runner(spark, tmp_path):
    directory = tmp_path / "in"
    os.makedirs(directory)
    for f in range(2):
        rows = [{"key": f"k{i % 4}", "value": i + 1000 * f} for i in range(300)]
        pq.write_table(pa.Table.from_pylist(rows), os.path.join(directory, f"part-{f}.parquet"), row_group_size=70)
    pattern = os.path.join(directory, "*.parquet")
    every = pq.read_table(directory).to_pylist()

    def build(p, native=True):
        rows = p | (beam.io.ReadFromParquet(pattern) if native else "Rows" >> beam.Create(every))
        batches = p | (beam.io.ReadFromParquetBatched(pattern, columns=["key"]) if native
                       else "Tables" >> beam.Create([pa.Table.from_pylist(every).select(["key"])]))
        rows = rows | "Pairs" >> beam.Map(lambda r: (r["key"], r["value"]))
        counts = (batches | beam.FlatMap(lambda table: [(key, 1) for key in table.column("key").to_pylist()])
                  | "Count" >> beam.GroupByKey() | "Counted" >> beam.MapTuple(lambda k, ones: (k, sum(ones))))
        # GroupByKey, not CombinePerKey: the DirectRunner's streaming engine
        # fails on a CombinePerKey in the global window ("... was not replaced as expected").
        sums = rows | "Sum" >> beam.GroupByKey() | "Sums" >> beam.MapTuple(lambda k, s: ("sum", [k, sum(s)]))
        return ((sums, counts | "Counts" >> beam.MapTuple(lambda k, n: ("count", [k, n]))) | beam.Flatten()
                | beam.GroupByKey() | beam.MapTuple(lambda kind, values: [kind, sorted(values)]))

    out = _equals_direct(build, tmp_path)
    assert out == [["count", [["k0", 150], ["k1", 150], ["k2", 150], ["k3", 150]]],
                   ["sum", [[f"k{k}", sum(i + 1000 * f for f in range(2) for i in range(k, 300, 4))]
                            for k in range(4)]]]
    _, result = _run(build, str(tmp_path / "again.jsonl"), [])
    assert sorted(_natives(result)) == sorted([READ_PARQUET_URN, READ_PARQUET_BATCHED_URN])


def test_a_native_read_is_a_side_input_and_flattens_with_a_test_stream(spark, tmp_path):
    pattern, every = _text_files(tmp_path / "in")

    def build(p, native=True):
        stream = (TestStream().add_elements([TV("w1", 3), TV("w2", 12)]).advance_watermark_to(15)
                  .add_elements([TV("w3", 16), TV("w1", 4)]).advance_watermark_to_infinity())
        events = p | stream
        lines = p | (beam.io.ReadFromText(pattern, skip_header_lines=1) if native else beam.Create(every))
        known = lines | "Words" >> beam.Map(lambda line: line.split()[0])
        seen = (events | "Known" >> beam.Map(lambda w, words: (w, words.count(w)), words=beam.pvalue.AsList(known)))
        # Timestamped: a window holding Beam's minimum timestamp starts before
        # it, which Beam's window coder (any portable runner) cannot keep.
        read = lines | "Pairs" >> beam.Map(lambda line: TV((line.split()[0], 1), int(line.split()[1])))
        return ((seen, read) | beam.Flatten() | beam.WindowInto(window.FixedWindows(10))
                | beam.CombinePerKey(sum) | beam.Map(
                    lambda kv, w=beam.DoFn.WindowParam: [kv[0], kv[1], str(w)]))

    out = _equals_direct(build, tmp_path)
    # Each word is 120 of the 600 lines; the second w1 comes after its window closed, dropped as late.
    assert sum(n for _, n, _ in out) == 600 + 3 * 120


def test_tracker_watermarks_keep_beams_read(spark, tmp_path):
    """The tracker follows each source's records, which a native read does
    not report: under ``--watermarks=tracker`` the read stays Beam's."""
    pattern, _ = _text_files(tmp_path / "in")

    def build(p):
        return (p | beam.io.ReadFromText(pattern, skip_header_lines=1) | beam.Map(lambda line: (line.split()[0], 1))
                | beam.CombinePerKey(sum))

    tracked, with_tracker = _run(build, str(tmp_path / "tracker.jsonl"), ["--watermarks=tracker"])
    classic, with_min = _run(build, str(tmp_path / "min.jsonl"), ["--watermarks=min"])
    assert sorted(tracked) == sorted(classic) == [[f"w{k}", 120] for k in range(5)]
    assert _natives(with_tracker) == [] and _natives(with_min) == [READ_TEXT_URN]


def test_a_checkpoint_planned_with_beams_read_resumes(spark, tmp_path, caplog):
    """A checkpoint written while the read ran Beam's expansion (an earlier
    release) resumes with those stages: nothing is read twice."""
    from apache_beam.transforms.periodicsequence import PeriodicImpulse
    from test_runner_streaming import _run_until_fourth_commit

    pattern, _ = _text_files(tmp_path / "in")
    start = float(int(time.time()) + 2)
    path, checkpoint = str(tmp_path / "out.jsonl"), str(tmp_path / "ckpt")

    def build(p):
        ticks = (p | PeriodicImpulse(start_timestamp=start, stop_timestamp=start + 3, fire_interval=0.5)
                 | "Tick" >> beam.Map(lambda t: ("tick", 1)))
        words = p | beam.io.ReadFromText(pattern, skip_header_lines=1) | beam.Map(lambda line: (line.split()[0], 1))
        _ = ((ticks, words) | beam.Flatten()
             | beam.WindowInto(window.GlobalWindows(), trigger=trigger.AfterWatermark(),
                               accumulation_mode=trigger.AccumulationMode.DISCARDING)
             | beam.CombinePerKey(sum) | beam.ParDo(AppendLines(path)))

    earlier = _planned_as_before(spark, build)
    assert not any(stage.native for stage in earlier.stages)
    _run_until_fourth_commit(spark, earlier, checkpoint)

    with caplog.at_level(logging.INFO, logger="beam_ext.runner"):
        with beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(
                ["--streaming", f"--checkpoint_dir={checkpoint}", "--spark_batch_interval=0.05"])) as again:
            build(again)
    assert any("its bounded reads run Beam's splittable DoFn" in r.getMessage() for r in caplog.records)
    assert sorted(read_lines(path)) == [["tick", 6]] + [[f"w{k}", 120] for k in range(5)]


def test_a_bounded_read_of_one_file_is_split_over_the_tasks(spark, tmp_path):
    """Beam's Avro read (no native reader) runs its splittable DoFn; its one
    restriction is split to fill the tasks, as in batch."""
    from pyspark import TaskContext

    path = _avro_file(tmp_path / "rows.avro", 20_000)

    def build(p):
        return (p | beam.io.ReadFromAvro(path)
                | beam.Map(lambda row: (TaskContext.get().partitionId(), row["amount"])) | beam.GroupByKey()
                | beam.MapTuple(lambda task, amounts: [task, sorted(amounts)]))

    out, _ = _run(build, str(tmp_path / "out.jsonl"), [])
    assert [task for task, _ in sorted(out)] == list(range(spark.sparkContext.defaultParallelism))
    assert sorted(a for _, amounts in out for a in amounts) == list(range(20_000))


def test_only_a_bounded_splittable_dofn_is_split_and_read_whole(spark, tmp_path):
    """An unbounded one's restriction (PeriodicImpulse's ticks) is neither
    split nor read whole: it runs as long as the stream, keeping its
    position in the stage's state."""
    from apache_beam.transforms import environments
    from apache_beam.transforms.periodicsequence import PeriodicImpulse

    from beam_ext.runner.planning import plan_pipeline

    p = beam.Pipeline(options=PipelineOptions(["--streaming"]))
    _ = p | beam.io.ReadFromAvro(_avro_file(tmp_path / "rows.avro", 10)) | "Avro" >> beam.Map(str)
    _ = p | PeriodicImpulse(start_timestamp=time.time(), stop_timestamp=time.time() + 1) | "Ticks" >> beam.Map(str)
    proto = p.to_runner_api(default_environment=environments.EmbeddedPythonEnvironment.default())
    plan = plan_pipeline(proto, 1 << 20, 2, streaming=True)
    spread = [stage for stage in plan.stages if stage.spread]
    assert {stage.steps[0].split("/")[0]: (stage.sdf_info is not None, stage.reads_whole, "Avro" in stage.steps)
            for stage in spread} == {"ReadFromAvro": (True, True, True), "PeriodicImpulse": (False, False, False)}
    # The steps after an unbounded DoFn run in a stage of their own, on objects; after a bounded one, in its stage.
    assert [stage.direct is not None for stage in plan.stages if "Ticks" in stage.steps] == [True]


def test_a_bounded_splittable_dofn_reads_its_restrictions_whole_in_the_first_batch(spark, tmp_path):
    """A deferred remainder of a bounded DoFn is read at once, as in batch."""
    def build(p):
        return p | beam.Create([3, 4]) | beam.ParDo(_OnePerCall(delay=0.3)) | beam.MapTuple(lambda n, i: i * 10)

    out, result = _run(build, str(tmp_path / "out.jsonl"), [])
    assert sorted(out) == [0, 0, 10, 10, 20, 20, 30]
    [stage] = [s for s in result._executor._plan.stages if s.spread]
    assert stage.reads_whole and not stage.keeps_state and stage.direct is not None
    assert result._executor.progress.batch == 0  # one micro-batch read everything


@pytest.mark.parametrize("grouped_at_once", [False, True])
def test_a_checkpoint_holding_a_bounded_dofns_remainder_resumes_it(spark, tmp_path, caplog, grouped_at_once):
    """An earlier release kept a bounded DoFn's deferred remainders in its
    state: a checkpoint holding some resumes them, on Beam's bundle
    processor. With steps after the DoFn, the earlier plan's stages differ
    and the runner plans as it did then; where its output goes straight to a
    grouping they do not, and the stage alone runs as it did."""
    from test_runner_streaming import _run_until_fourth_commit

    path, checkpoint = str(tmp_path / "out.jsonl"), str(tmp_path / "ckpt")

    def build(p):
        out = p | beam.Create([30]) | beam.ParDo(_OnePerCall(delay=0.3))
        if grouped_at_once:
            out = out | beam.GroupByKey() | beam.MapTuple(lambda n, values: [n, sorted(values)])
        _ = out | beam.ParDo(AppendLines(path))

    earlier = _planned_as_before(spark, build)
    assert not any(stage.reads_whole for stage in earlier.stages)
    _run_until_fourth_commit(spark, earlier, checkpoint)
    assert len(read_lines(path)) < 30

    with caplog.at_level(logging.INFO, logger="beam_ext.runner"):
        with beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(
                ["--streaming", f"--checkpoint_dir={checkpoint}", "--spark_batch_interval=0.05"])) as again:
            build(again)
    messages = [r.getMessage() for r in caplog.records]
    if grouped_at_once:
        assert any("resumes the restrictions its checkpoint holds" in m for m in messages)
        assert read_lines(path) == [[30, list(range(30))]]
    else:
        assert any("its bounded reads run Beam's splittable DoFn" in m for m in messages)
        assert sorted(read_lines(path)) == [[30, i] for i in range(30)]  # each once
