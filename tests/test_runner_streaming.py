"""Streaming on SparkRunner: results equal the DirectRunner's in streaming mode."""
from __future__ import annotations

import logging

import apache_beam as beam
import pytest
from apache_beam.coders import StrUtf8Coder, VarIntCoder
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import trigger, userstate, window
from apache_beam.transforms.timeutil import TimeDomain
from pipeline_outputs import AppendLines, keyed_test_stream, read_lines, streaming_equals_direct

from beam_ext.runner import PipelineError, SparkRunner

TV = window.TimestampedValue


def _panes(pcoll):
    return pcoll | "Panes" >> beam.Map(
        lambda kv, w=beam.DoFn.WindowParam, p=beam.DoFn.PaneInfoParam:
        [kv[0], sorted(kv[1]), str(w), p.timing, p.index, p.is_first, p.is_last])


def test_late_data_gives_the_direct_runners_panes(spark, tmp_path):
    def build(p):
        stream = (TestStream()
                  .add_elements([TV(("a", 1), 1), TV(("b", 2), 2)])
                  .advance_watermark_to(5)
                  .add_elements([TV(("a", 3), 3)])
                  .advance_watermark_to(12)
                  .add_elements([TV(("a", 4), 4), TV(("c", 5), 25)])  # one late, one early
                  .advance_watermark_to(200)
                  .add_elements([TV(("a", 6), 6)])  # past allowed lateness: dropped
                  .advance_watermark_to_infinity())
        return _panes(p | stream | beam.WindowInto(
            window.FixedWindows(10), trigger=trigger.AfterWatermark(late=trigger.AfterCount(1)),
            allowed_lateness=100, accumulation_mode=trigger.AccumulationMode.ACCUMULATING)
            | beam.GroupByKey())

    panes = streaming_equals_direct(build, tmp_path)
    assert ["a", [1, 3, 4], "[0.0, 10.0)", 2, 1, False, False] in panes  # the late pane
    assert not any(6 in pane[1] for pane in panes)


def test_combine_per_key_keeps_element_timestamps_behind_the_watermark(spark, tmp_path):
    """A lifted CombinePerKey would merge 2, 3, 7 and 8 into one timestamp (2)
    before the shuffle, behind the watermark (5), and time the pane at the
    end of the window; unlifted, 7 holds it (trigger_transcripts.yaml,
    known_late_data_watermark)."""
    def build(p):
        stream = (TestStream()
                  .advance_watermark_to(5)
                  .add_elements([TV(("k", v), v) for v in (2, 3, 7, 8)])
                  .advance_watermark_to(11)
                  .advance_watermark_to_infinity())
        return (p | stream
                | beam.WindowInto(window.FixedWindows(10),
                                  timestamp_combiner=window.TimestampCombiner.OUTPUT_AT_EARLIEST)
                | beam.CombinePerKey(sum)
                | beam.Map(lambda kv, t=beam.DoFn.TimestampParam: [kv[0], kv[1], float(t)]))

    assert streaming_equals_direct(build, tmp_path) == [["k", 20, 7.0]]


def test_processing_time_triggers_follow_the_test_stream_clock(spark, tmp_path):
    def build(p):
        stream = (TestStream()
                  .add_elements([TV(("k", 1), 1)])
                  .advance_processing_time(6)
                  .add_elements([TV(("k", 2), 2)])
                  .advance_processing_time(6)
                  .advance_watermark_to_infinity())
        return _panes(p | stream | beam.WindowInto(
            window.FixedWindows(100),
            trigger=trigger.AfterWatermark(early=trigger.AfterProcessingTime(5)),
            accumulation_mode=trigger.AccumulationMode.DISCARDING) | beam.GroupByKey())

    panes = streaming_equals_direct(build, tmp_path)
    assert [pane[3] for pane in panes].count(0) == 2  # two early panes, then on time


class _BufferUntilTimer(beam.DoFn):
    """Buffers values per key and flushes them at an event-time timer (window end)."""

    BUFFER = userstate.BagStateSpec("buffer", VarIntCoder())
    FLUSH = userstate.TimerSpec("flush", TimeDomain.WATERMARK)

    def process(self, kv, w=beam.DoFn.WindowParam, buffer=beam.DoFn.StateParam(BUFFER),
                flush=beam.DoFn.TimerParam(FLUSH)):
        buffer.add(kv[1])
        flush.set(w.end)

    @userstate.on_timer(FLUSH)
    def on_flush(self, key=beam.DoFn.KeyParam, buffer=beam.DoFn.StateParam(BUFFER),
                 ts=beam.DoFn.TimestampParam):
        yield key, sorted(buffer.read()), float(ts)
        buffer.clear()


def test_stateful_dofn_timers_fire_under_the_watermark(spark, tmp_path):
    def build(p):
        stream = (TestStream()
                  .add_elements([TV(("a", 1), 1), TV(("b", 2), 2)])
                  .advance_watermark_to(5)
                  .add_elements([TV(("a", 3), 3), TV(("a", 11), 11)])
                  .advance_watermark_to(15)
                  .add_elements([TV(("b", 12), 12)])
                  .advance_watermark_to_infinity())
        return (p | stream | beam.WindowInto(window.FixedWindows(10))
                | beam.ParDo(_BufferUntilTimer()))

    out = streaming_equals_direct(build, tmp_path)
    assert ["a", [1, 3], 10.0] in out and ["b", [12], 20.0] in out


class _CountWithState(beam.DoFn):
    COUNT = userstate.ReadModifyWriteStateSpec("count", VarIntCoder())

    def process(self, kv, count=beam.DoFn.StateParam(COUNT)):
        n = (count.read() or 0) + 1
        count.write(n)
        yield kv[0], n


def test_state_carries_over_micro_batches(spark, tmp_path):
    def build(p):
        stream = TestStream(coder=beam.coders.TupleCoder([StrUtf8Coder(), VarIntCoder()]))
        for i in range(4):
            stream = stream.add_elements([TV(("k", i), i), TV(("j", i), i)]).advance_watermark_to(i + 1)
        return p | stream.advance_watermark_to_infinity() | beam.ParDo(_CountWithState())

    out = streaming_equals_direct(build, tmp_path)
    assert sorted(n for k, n in out if k == "k") == [1, 2, 3, 4]


def _own_checkpoints(temp) -> list:
    """The checkpoint directories the runner made for itself under ``temp``."""
    return sorted(temp.glob("beam_ext-streaming-*"))


def test_running_result_state_metrics_and_cancel(spark, tmp_path, monkeypatch):
    import tempfile

    from apache_beam.transforms.periodicsequence import PeriodicImpulse

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # where the driver makes its checkpoint

    counter = beam.metrics.Metrics.counter("test", "ticks")

    def tick(x):
        counter.inc()
        return x

    path = str(tmp_path / "out.jsonl")
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(
        ["--streaming", "--spark_batch_interval=0.05"]))
    _ = (p | PeriodicImpulse(fire_interval=0.2) | beam.Map(tick) | beam.Map(float)
         | beam.ParDo(AppendLines(path)))
    result = p.run()
    assert result.state == PipelineState.RUNNING
    ticks = []
    for _ in range(120):
        assert result.wait_until_finish(duration=500) == PipelineState.RUNNING
        ticks = result.metrics().query(beam.metrics.MetricsFilter().with_name("ticks"))["counters"]
        if ticks and ticks[0].committed > 2:
            break
    assert ticks and ticks[0].committed > 2  # live, while running
    assert len(_own_checkpoints(temp)) == 1
    assert result.cancel() == PipelineState.CANCELLED
    assert len(read_lines(path)) >= ticks[0].committed
    # No --checkpoint_dir: nothing can resume from the runner's own, so it goes with the pipeline.
    assert _own_checkpoints(temp) == []


def test_a_failing_step_names_itself_and_leaves_no_checkpoint_behind(spark, tmp_path, monkeypatch):
    import tempfile

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))

    def refuse_three(x):
        if x == 3:
            raise ValueError("three is not allowed")
        return x

    stream = TestStream(coder=VarIntCoder())
    for i in range(5):
        stream = stream.add_elements([TV(i, i)]).advance_watermark_to(i + 1)
    with pytest.raises(PipelineError, match="three is not allowed") as raised:
        with beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(
                ["--streaming", "--spark_batch_interval=0.05"])) as p:
            _ = p | stream.advance_watermark_to_infinity() | "Refuse" >> beam.Map(refuse_three)
    assert raised.value.step == "Refuse"
    assert _own_checkpoints(temp) == []


def test_periodic_impulse_with_a_stop_time_ends_by_itself(spark, tmp_path):
    import time

    from apache_beam.transforms.periodicsequence import PeriodicImpulse

    # Beam's BundleBasedDirectRunner cannot run PeriodicImpulse (its SDF
    # override fails to replace the expansion), so the oracle is the definition.
    from pipeline_outputs import planned_on_objects

    start = time.time()
    path = str(tmp_path / "out.jsonl")

    def build(p):
        return (p | PeriodicImpulse(start_timestamp=start, stop_timestamp=start + 2, fire_interval=0.5)
                | "Offset" >> beam.Map(lambda t: round(float(t) - start, 3)))

    # The steps after the splittable DoFn have a stage of their own, on objects.
    assert planned_on_objects(build, "Offset", streaming=True) == [True]
    with beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(["--streaming"])) as p:
        _ = build(p) | beam.ParDo(AppendLines(path))
    assert read_lines(path) == [0.0, 0.5, 1.0, 1.5]


def test_a_restart_with_the_checkpoint_resumes_where_it_stopped(spark, tmp_path):
    checkpoint = str(tmp_path / "ckpt")

    def build(p):
        stream = TestStream()
        for i in range(6):
            stream = stream.add_elements([TV(("k", i), i)]).advance_watermark_to(i + 1)
        stream = stream.advance_watermark_to_infinity()
        return _panes(p | stream | beam.WindowInto(window.FixedWindows(3)) | beam.GroupByKey())

    expected_path = str(tmp_path / "expected.jsonl")
    with beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(["--streaming"])) as p:
        _ = build(p) | beam.ParDo(AppendLines(expected_path))

    path = str(tmp_path / "out.jsonl")
    options = PipelineOptions(["--streaming", f"--checkpoint_dir={checkpoint}"])
    first = beam.Pipeline(runner=SparkRunner(), options=options)
    _ = build(first) | beam.ParDo(AppendLines(path))
    result = first.run()
    import os
    import time
    while not os.path.exists(os.path.join(checkpoint, "commits", "5.commit")):
        assert result.state == PipelineState.RUNNING
        time.sleep(0.05)
    result.cancel()
    assert len(read_lines(path)) < len(read_lines(expected_path))
    with beam.Pipeline(runner=SparkRunner(), options=options) as second:
        _ = build(second) | beam.ParDo(AppendLines(path))
    assert read_lines(path) == read_lines(expected_path)


def test_the_steps_after_a_stateful_dofn_stay_in_its_stage(spark, tmp_path):
    """Unlike a splittable DoFn's: a stage boundary would carry their
    timestamps in milliseconds (see split_after_splittable)."""
    from pipeline_outputs import planned_on_objects

    def build(p):
        stream = TestStream(coder=beam.coders.TupleCoder([StrUtf8Coder(), VarIntCoder()]))
        for i in range(3):
            stream = stream.add_elements([TV(("k", i), i), TV(("j", i), i)]).advance_watermark_to(i + 1)
        return (p | stream.advance_watermark_to_infinity() | beam.ParDo(_CountWithState())
                | "Format" >> beam.MapTuple(lambda k, n: f"{k}{n}"))

    assert planned_on_objects(build, "Format", streaming=True) == [False]
    assert sorted(streaming_equals_direct(build, tmp_path)) == ["j1", "j2", "j3", "k1", "k2", "k3"]


def _run_until_fourth_commit(spark, plan, checkpoint: str, until=lambda: True) -> None:
    """Runs ``plan`` as a job of an earlier release would, stopped once it has
    committed four micro-batches and ``until()`` holds."""
    import os
    import threading
    import time

    from beam_ext.runner.executors import StreamingExecutor

    sc = spark.sparkContext
    executor = StreamingExecutor(sc, plan, sc.defaultParallelism, checkpoint, batch_interval=0.05)
    thread = threading.Thread(target=executor.run)
    thread.start()
    commits = os.path.join(checkpoint, "commits")

    def committed() -> int:  # the driver prunes old commits: count by the latest
        names = os.listdir(commits) if os.path.isdir(commits) else []
        return max((int(name.split(".")[0]) + 1 for name in names if name.endswith(".commit")), default=0)

    while not (committed() >= 4 and until()):
        assert thread.is_alive()
        time.sleep(0.02)
    executor.stop()
    thread.join()


def _planned_earlier(spark, build, **layout):
    """``build``'s streaming plan as an earlier release made it (the planning options ``layout``)."""
    from apache_beam.transforms import environments

    from beam_ext.runner.planning import plan_pipeline

    p = beam.Pipeline(options=PipelineOptions(["--streaming"]))
    build(p)
    proto = p.to_runner_api(default_environment=environments.EmbeddedPythonEnvironment.default())
    return plan_pipeline(proto, 1 << 20, spark.sparkContext.defaultParallelism, streaming=True, **layout)


def _resumed(build, checkpoint: str, caplog) -> list[str]:
    """Runs ``build`` on SparkRunner from ``checkpoint`` to its end; the runner's log messages."""
    with caplog.at_level(logging.INFO, logger="beam_ext.runner"):
        with beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(
                ["--streaming", f"--checkpoint_dir={checkpoint}", "--spark_batch_interval=0.05"])) as p:
            build(p)
    return [r.getMessage() for r in caplog.records]


def test_a_checkpoint_planned_with_creates_expanded_by_beam_resumes(spark, tmp_path, caplog):
    """Releases before 2026-11-30 (night) ran a streaming Create as Beam
    expands it, a Reshuffle included (``PeriodicImpulse`` starts from one); a
    checkpoint they wrote resumes with those stages."""
    import os
    import time

    from apache_beam.transforms.periodicsequence import PeriodicImpulse

    from beam_ext.runner import native

    start = time.time() + 2
    path, checkpoint = str(tmp_path / "out.jsonl"), str(tmp_path / "ckpt")

    def build(p):
        _ = (p | PeriodicImpulse(start_timestamp=start, stop_timestamp=start + 3, fire_interval=0.25)
             | "Offset" >> beam.Map(lambda t: round(float(t) - start, 3)) | beam.ParDo(AppendLines(path)))

    earlier = _planned_earlier(spark, build, native_creates=False)
    assert not any(stage.native is not None for stage in earlier.stages)
    assert any(s.native is not None and s.native.urn == native.CREATE_URN for s in _planned_earlier(spark, build).stages)
    _run_until_fourth_commit(spark, earlier, checkpoint, until=lambda: os.path.exists(path))
    assert 0 < len(read_lines(path)) < 12

    messages = _resumed(build, checkpoint, caplog)
    assert any("its Creates run Beam's expansion" in message for message in messages)
    assert sorted(read_lines(path)) == [i / 4 for i in range(12)]  # each impulse once


def test_a_checkpoint_planned_with_the_steps_in_the_splittable_stage_resumes(spark, tmp_path, caplog):
    """Releases before the split fused the steps after a splittable DoFn into
    its stage; a checkpoint they wrote resumes with those stages."""
    import os
    import time

    from apache_beam.transforms.periodicsequence import PeriodicImpulse

    # Ticks from two seconds on: workers started cold make the first
    # micro-batches slow, and the job is stopped once the first ticks are out.
    start = time.time() + 2
    path, checkpoint = str(tmp_path / "out.jsonl"), str(tmp_path / "ckpt")

    def build(p):
        _ = (p | PeriodicImpulse(start_timestamp=start, stop_timestamp=start + 3, fire_interval=0.25)
             | "Offset" >> beam.Map(lambda t: round(float(t) - start, 3)) | beam.ParDo(AppendLines(path)))

    earlier = _planned_earlier(spark, build, split_after_splittable=False, native_creates=False)
    assert not any("Offset" in step for stage in earlier.stages if stage.direct is not None for step in stage.steps)
    _run_until_fourth_commit(spark, earlier, checkpoint, until=lambda: os.path.exists(path))
    assert 0 < len(read_lines(path)) < 12

    messages = _resumed(build, checkpoint, caplog)
    assert any("as they were planned when it was written" in message for message in messages)
    assert sorted(read_lines(path)) == [i / 4 for i in range(12)]  # each impulse once


def test_a_checkpoint_planned_with_a_flattens_relay_stage_resumes(spark, tmp_path, caplog):
    """Releases before 2026-11-30 read a streaming CoGroupByKey's Flatten back
    in a stage of its own; a checkpoint they wrote resumes with those stages,
    the elements grouped before it was written included."""
    import time

    from apache_beam.transforms.periodicsequence import PeriodicImpulse

    # Ticks from a whole second, a second or two on: the first micro-batches
    # are not all of them, and the 1-second windows hold the ticks of one key.
    start = float(int(time.time()) + 2)
    path, checkpoint = str(tmp_path / "out.jsonl"), str(tmp_path / "ckpt")

    def build(p):
        ticks = (p | PeriodicImpulse(start_timestamp=start, stop_timestamp=start + 3, fire_interval=0.25)
                 | "Offset" >> beam.Map(lambda t: round(float(t) - start, 3))
                 | beam.WindowInto(window.FixedWindows(1)))
        left = ticks | "Left" >> beam.Map(lambda x: (int(x), x))
        right = ticks | "Right" >> beam.Map(lambda x: (int(x), -x))
        _ = ({"l": left, "r": right} | beam.CoGroupByKey()
             | beam.MapTuple(lambda k, g: [k, sorted(g["l"]), sorted(g["r"])]) | beam.ParDo(AppendLines(path)))

    earlier = _planned_earlier(spark, build, flattens_write_groupings=False, native_creates=False)
    assert any(stage.inputs and all(b.startswith(b"materialize:") and b.endswith(b"Flatten") for b in stage.inputs)
               for stage in earlier.stages)
    _run_until_fourth_commit(spark, earlier, checkpoint)
    assert len(read_lines(path)) < 3  # windows fire as the watermark passes them: not all yet

    messages = _resumed(build, checkpoint, caplog)
    assert any("a stage reads a Flatten back" in message for message in messages)
    ticks = [i / 4 for i in range(12)]
    assert sorted(read_lines(path)) == [[k, [t for t in ticks if int(t) == k], sorted(-t for t in ticks if int(t) == k)]
                                        for k in range(3)]  # each impulse once


def test_a_checkpoint_planned_with_a_relay_stage_after_a_partition_resumes(spark, tmp_path, caplog):
    """Earlier releases read a Flatten of one stage's outputs back
    in a stage of its own when steps came before its GroupByKey; a checkpoint
    they wrote resumes with those stages."""
    import time

    from apache_beam.transforms.periodicsequence import PeriodicImpulse

    start = float(int(time.time()) + 2)
    path, checkpoint = str(tmp_path / "out.jsonl"), str(tmp_path / "ckpt")

    def build(p):
        parts = (p | PeriodicImpulse(start_timestamp=start, stop_timestamp=start + 3, fire_interval=0.25)
                 | "Offset" >> beam.Map(lambda t: round(float(t) - start, 3))
                 | beam.WindowInto(window.FixedWindows(1)) | beam.Partition(lambda x, n: int(x * 4) % n, 2))
        _ = (parts | beam.Flatten() | "Key" >> beam.Map(lambda x: (int(x), x)) | beam.GroupByKey()
             | beam.MapTuple(lambda k, xs: [k, sorted(xs)]) | beam.ParDo(AppendLines(path)))

    earlier = _planned_earlier(spark, build, flattens_in_stage=False, native_creates=False)
    assert any(stage.inputs and all(b.startswith(b"materialize:") and b.endswith(b"Flatten") for b in stage.inputs)
               for stage in earlier.stages)
    _run_until_fourth_commit(spark, earlier, checkpoint)
    assert len(read_lines(path)) < 3

    messages = _resumed(build, checkpoint, caplog)
    assert any("a stage reads back a Flatten of one stage's outputs" in message for message in messages)
    ticks = [i / 4 for i in range(12)]
    assert sorted(read_lines(path)) == [[k, [t for t in ticks if int(t) == k]] for k in range(3)]  # each once


def test_a_checkpoint_of_another_pipeline_is_refused(spark, tmp_path):
    from beam_ext.runner.executors._commit_log import CheckpointMismatch

    options = PipelineOptions(["--streaming", f"--checkpoint_dir={tmp_path}"])
    with beam.Pipeline(runner=SparkRunner(), options=options) as p:
        _ = p | TestStream().add_elements([1]) | beam.Map(lambda x: x)
    with pytest.raises(CheckpointMismatch, match="another pipeline"):
        with beam.Pipeline(runner=SparkRunner(), options=options) as p:
            _ = p | TestStream().add_elements([1]) | beam.Map(lambda x: x) | beam.Map(str) | beam.Reshuffle()


def test_test_stream_elements_decode_in_the_outer_context(spark, tmp_path):
    # TestStream payloads hold each element in the coder's outer context: a str has no length prefix.
    def build(p):
        return p | TestStream().add_elements(["a", "bc"]).add_elements(["déf"]) | beam.Map(str.upper)

    assert streaming_equals_direct(build, tmp_path) == ["A", "BC", "DÉF"]


def test_a_global_window_default_trigger_group_fires_at_the_end(spark, tmp_path):
    # The batch runner keeps such groups' values as opaque bytes; streaming groups decode whole elements.
    def build(p):
        stream = TestStream().add_elements([("k", 1), ("j", 2)]).advance_watermark_to(5).add_elements([("k", 3)])
        return p | stream | beam.GroupByKey() | beam.MapTuple(lambda k, vs: [k, sorted(vs)])

    # Beam refuses such a group on unbounded input unless asked (assert_that asks).
    assert streaming_equals_direct(build, tmp_path, ["--allow_unsafe_triggers"]) == [["j", [2]], ["k", [1, 3]]]


def test_a_bounded_side_input_reaches_elements_of_later_micro_batches(spark, tmp_path):
    def build(p):
        side = p | "Side" >> beam.Create([3, 1, 2])
        stream = TestStream().advance_watermark_to(10).add_elements(["e"]).add_elements(["f"])
        return p | stream | beam.Map(lambda e, s: [e, sorted(s)], beam.pvalue.AsList(side))

    assert streaming_equals_direct(build, tmp_path) == [["e", [1, 2, 3]], ["f", [1, 2, 3]]]


def test_a_test_stream_ending_on_a_watermark_nothing_waits_for_still_ends(spark, tmp_path):
    # The batch of the last event runs nothing; the TestStream then advances to +inf.
    def build(p):
        stream = TestStream().add_elements([TV(("k", 1), 1)]).advance_processing_time(1).advance_watermark_to(5)
        return _panes(p | stream | beam.WindowInto(
            window.FixedWindows(10), trigger=trigger.AfterWatermark(early=trigger.AfterProcessingTime(100)),
            accumulation_mode=trigger.AccumulationMode.DISCARDING) | beam.GroupByKey())

    assert streaming_equals_direct(build, tmp_path) == [["k", [1], "[0.0, 10.0)", 1, 0, True, True]]


def _last_job(sc) -> int:
    return max(sc.statusTracker().getJobIdsForGroup(), default=-1)


def test_a_stateless_stage_runs_in_its_groupings_spark_job(spark, tmp_path, caplog):
    """A stage without state holds no watermark: the GroupByKey after it need
    not wait for it, so a micro-batch is one Spark job, not one per barrier.
    The log names the job's steps as the user labelled them."""
    def build(p):
        stream = TestStream()
        for i in range(10):
            stream = stream.add_elements([TV(("k", i), i)]).advance_watermark_to(i)
        return _panes(p | stream.advance_watermark_to_infinity() | beam.Map(lambda kv: (kv[0], kv[1] * 10))
                      | beam.WindowInto(window.FixedWindows(5), trigger=trigger.AfterWatermark(
                          early=trigger.AfterCount(2)), accumulation_mode=trigger.AccumulationMode.DISCARDING)
                      | "GroupTens" >> beam.GroupByKey())

    sc = spark.sparkContext
    before = _last_job(sc)
    with caplog.at_level(logging.DEBUG, logger="beam_ext.runner"):
        with beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(["--streaming"])) as p:
            _ = build(p) | beam.ParDo(AppendLines(str(tmp_path / "spark.jsonl")))
    # Ten micro-batches bring an element, two more move the watermark past a
    # window's end; the others have nothing to run.
    assert _last_job(sc) - before == 12
    jobs = [r.getMessage() for r in caplog.records if "one Spark job ran" in r.getMessage()]
    assert len(jobs) == 12 and all("GroupTens" in job for job in jobs)
    assert not any("ref_" in r.getMessage() for r in caplog.records)  # no transform or PCollection ids
    with beam.Pipeline(runner="BundleBasedDirectRunner", options=PipelineOptions(["--streaming"])) as p:
        _ = build(p) | beam.ParDo(AppendLines(str(tmp_path / "direct.jsonl")))
    assert read_lines(str(tmp_path / "spark.jsonl")) == read_lines(str(tmp_path / "direct.jsonl"))


def test_groupings_on_separate_branches_share_a_spark_job(spark, tmp_path):
    """A grouping waits for the stages with state upstream of it, not for
    another branch's: the two branches' groupings run in one Spark job."""
    def build(p):
        stream = TestStream()
        for i in range(3):
            stream = stream.add_elements([TV(("k", i), i), TV(("j", i), i)]).advance_watermark_to(i)
        events = p | stream.advance_watermark_to_infinity() | beam.WindowInto(window.FixedWindows(100))
        tens = events | "Tens" >> beam.Map(lambda kv: (kv[0], kv[1] * 10)) | "GroupTens" >> beam.GroupByKey()
        ones = events | "GroupOnes" >> beam.GroupByKey()
        return _panes((tens, ones) | beam.Flatten() | beam.MapTuple(lambda k, vs: (k, sum(vs)))
                      | "GroupSums" >> beam.GroupByKey())

    sc = spark.sparkContext
    before = _last_job(sc)
    with beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(["--streaming"])) as p:
        _ = build(p) | beam.ParDo(AppendLines(str(tmp_path / "spark.jsonl")))
    # Three micro-batches bring elements to both branches' groupings: one job
    # each (GroupSums has nothing before their windows fire). The watermark's
    # move to +inf fires the branches' windows, then GroupSums's: two jobs.
    # Waiting for every grouping before the next took two, two, two and three.
    assert _last_job(sc) - before == 3 + 2
    with beam.Pipeline(runner="BundleBasedDirectRunner", options=PipelineOptions(["--streaming"])) as p:
        _ = build(p) | beam.ParDo(AppendLines(str(tmp_path / "direct.jsonl")))
    assert read_lines(str(tmp_path / "spark.jsonl")) == read_lines(str(tmp_path / "direct.jsonl"))


def test_a_reshuffle_before_a_grouping_costs_no_spark_job(spark, tmp_path):
    """A Reshuffle's grouping fires every value in the micro-batch it arrives
    in and keeps nothing, so it holds no watermark: the windowed grouping
    after it need not wait for it. A micro-batch runs as many Spark jobs with
    the Reshuffle as without it, and the panes stay the DirectRunner's."""
    def build(p, reshuffle):
        stream = TestStream()
        for i in range(4):
            stream = stream.add_elements([TV((f"k{i % 2}", i), i), TV(("j", i), i)]).advance_watermark_to(i)
        events = p | stream.advance_watermark_to_infinity() | "Keep" >> beam.Map(lambda kv: kv)
        if reshuffle:
            events = events | beam.Reshuffle()
        return _panes(events | beam.WindowInto(window.FixedWindows(2), trigger=trigger.AfterWatermark(
            early=trigger.AfterCount(2)), accumulation_mode=trigger.AccumulationMode.DISCARDING)
                      | beam.GroupByKey())

    sc = spark.sparkContext
    jobs = {}
    for reshuffle in (True, False):
        before = _last_job(sc)
        with beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(["--streaming"])) as p:
            _ = build(p, reshuffle) | beam.ParDo(AppendLines(str(tmp_path / f"spark_{reshuffle}.jsonl")))
        jobs[reshuffle] = _last_job(sc) - before
    assert jobs[True] == jobs[False]
    with beam.Pipeline(runner="BundleBasedDirectRunner", options=PipelineOptions(["--streaming"])) as p:
        _ = build(p, True) | beam.ParDo(AppendLines(str(tmp_path / "direct.jsonl")))
    assert read_lines(str(tmp_path / "spark_True.jsonl")) == read_lines(str(tmp_path / "direct.jsonl"))
    assert read_lines(str(tmp_path / "spark_False.jsonl")) == read_lines(str(tmp_path / "direct.jsonl"))


def test_a_micro_batch_runs_each_partition_once(spark, tmp_path):
    """A grouping's stage and the stage reading its output are computed by the
    reader's tasks, not each in tasks of its own, and no empty partition is
    added to a shuffle: no Spark stage of a micro-batch has more tasks than
    the runner's parallelism (two here)."""
    def build(p):
        stream = TestStream()
        for i in range(4):
            stream = stream.add_elements([TV((f"k{i % 3}", i), i), TV(("j", i), i)]).advance_watermark_to(i)
        return _panes(p | stream.advance_watermark_to_infinity()
                      | beam.WindowInto(window.FixedWindows(2), trigger=trigger.AfterWatermark(
                          early=trigger.AfterCount(2)), accumulation_mode=trigger.AccumulationMode.ACCUMULATING)
                      | beam.GroupByKey() | beam.MapTuple(lambda k, vs: (k, sorted(vs))))

    sc = spark.sparkContext
    before = _last_job(sc)
    with beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(["--streaming"])) as p:
        _ = build(p) | beam.ParDo(AppendLines(str(tmp_path / "spark.jsonl")))
    tracker = sc.statusTracker()
    tasks = [tracker.getStageInfo(stage).numTasks
             for job in range(before + 1, _last_job(sc) + 1) for stage in tracker.getJobInfo(job).stageIds]
    assert tasks and max(tasks) <= 2, tasks
    with beam.Pipeline(runner="BundleBasedDirectRunner", options=PipelineOptions(["--streaming"])) as p:
        _ = build(p) | beam.ParDo(AppendLines(str(tmp_path / "direct.jsonl")))
    assert read_lines(str(tmp_path / "spark.jsonl")) == read_lines(str(tmp_path / "direct.jsonl"))


class _KeepSeen(beam.DoFn):
    """A stateful DoFn: its input is keyed, so a Flatten before it gets a stage of its own."""

    SEEN = userstate.BagStateSpec("seen", VarIntCoder())

    def process(self, kv, seen=beam.DoFn.StateParam(SEEN)):
        seen.add(kv[1])
        yield kv


@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "batch"])
def test_every_stage_is_labelled_with_the_users_steps(streaming):
    """Beam plans the Flatten before a keyed stage as a read and a write of
    buffers; its stage is named after the Flatten, not a PCollection's id."""
    from beam_ext.runner.planning import plan_pipeline

    p = beam.Pipeline(options=PipelineOptions(["--streaming"] if streaming else []))
    source = p | "Source" >> (TestStream().add_elements([("a", 1)]).advance_watermark_to_infinity()
                              if streaming else beam.Create([("a", 1)]))
    branches = [source | name >> beam.Map(lambda kv: kv) for name in ("Left", "Right")]
    _ = (branches | "Both" >> beam.Flatten()
         | "Check" >> beam.ParDo(_KeepSeen()).with_input_types(tuple[str, int]))
    plan = plan_pipeline(p.to_runner_api(), 1 << 20, 2, streaming=streaming)
    labels = [stage.label for stage in plan.stages]
    assert "Both" in labels and "Check" in labels
    assert not any("ref_" in label for label in labels)


def test_a_reshuffle_keeps_no_state_per_random_key(spark, tmp_path):
    """Beam's Reshuffle groups each element under a random key, with a
    trigger firing every time; the pane count each key would keep, as long as
    the global window lasts, is not kept: nobody reads those panes."""
    import pickle
    import time

    from apache_beam.transforms.periodicsequence import PeriodicImpulse

    from beam_ext.runner.planning import plan_pipeline

    def build(p):
        impulses = p | PeriodicImpulse(fire_interval=0.05) | beam.Map(float)
        grouped = (impulses | "Hour" >> beam.WindowInto(window.FixedWindows(3600))
                   | "Pair" >> beam.Map(lambda t: (int(t) % 2, t)) | beam.GroupByKey()
                   | "Sizes" >> beam.MapTuple(lambda k, ts: len(ts)))
        return impulses | beam.Reshuffle(), grouped

    p = beam.Pipeline(options=PipelineOptions(["--streaming"]))
    build(p)
    plan = plan_pipeline(p.to_runner_api(), 1 << 20, 2, streaming=True)
    assert sorted((g.step.split("/")[0], g.passes_through) for g in plan.groups.values()) == [
        ("GroupByKey", False), ("Reshuffle", True)]

    checkpoint, path = tmp_path / "checkpoint", str(tmp_path / "out.jsonl")
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(
        ["--streaming", "--spark_batch_interval=0.05", f"--checkpoint_dir={checkpoint}"]))
    reshuffled, _ = build(p)
    _ = reshuffled | beam.ParDo(AppendLines(path))
    result = p.run()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(read_lines(path)) < 20:
        assert result.wait_until_finish(duration=200) == PipelineState.RUNNING
    assert result.cancel() == PipelineState.CANCELLED
    stamps = read_lines(path)
    assert len(stamps) >= 20 and len(set(stamps)) == len(stamps)  # each impulse once, through the Reshuffle
    # Each group's largest saved state, in keys: the GroupByKey's holds its
    # two keys' elements until the hour ends; the Reshuffle's holds none.
    owners = {f.parts[-3] for f in checkpoint.glob("**/group*/*/*.bin")}
    largest = sorted(max(len(pickle.loads(f.read_bytes())) for f in checkpoint.glob(f"**/{owner}/*/*.bin"))
                     for owner in owners)
    assert len(largest) == 2 and largest[0] == 0 and 1 <= largest[1] <= 2, largest


@pytest.mark.parametrize("windowfn", [window.FixedWindows(10), window.Sessions(5)], ids=["fixed", "sessions"])
def test_a_key_keeps_only_the_windows_elements_can_still_reach(spark, tmp_path, windowfn):
    """Beam's driver keeps every fired window's pane counts as long as its key
    lives; a grouping here drops a window once the watermark is past its end
    by the allowed lateness (and the gap, for sessions): at the end of the
    stream, nothing. The panes, and the late values dropped, stay the
    DirectRunner's. (``tests/test_trigger_driver.py`` checks the state stays
    small while the stream runs.)"""
    import pickle

    events = []
    for i in range(12):
        events += [("elements", [("a", i, 20 * i), ("b", i, 20 * i + 1), ("a", 100 + i, max(0, 20 * i - 30))]),
                   ("watermark", 20 * i + 15)]

    def build(p):
        return (p | keyed_test_stream(events) | "Keep" >> beam.Map(lambda kv: kv)
                | beam.WindowInto(windowfn, allowed_lateness=10) | beam.GroupByKey()
                | beam.MapTuple(lambda k, vs, w=beam.DoFn.WindowParam, pane=beam.DoFn.PaneInfoParam:
                                [k, sorted(vs), repr(w), repr(pane)]))

    checkpoint = tmp_path / "checkpoint"
    got = streaming_equals_direct(build, tmp_path, [f"--checkpoint_dir={checkpoint}"])
    assert len(got) > 20
    saved = [pickle.loads(f.read_bytes()) for f in checkpoint.glob("**/group*/*/*.bin")]
    assert saved and all(states == {} for states in saved), saved


@pytest.mark.parametrize("windowfn", [window.FixedWindows(10), window.Sessions(5)], ids=["fixed", "sessions"])
def test_late_values_a_grouping_drops_are_counted(spark, tmp_path, windowfn):
    """Values behind the watermark past their window's allowed lateness are
    dropped, as Beam's DirectRunner drops them, and counted per value and
    window in ``dropped_due_to_lateness`` (Beam's driver for sessions, ours
    for fixed windows, their values gathered before the shuffle)."""
    events = [("elements", [("a", 1, 1), ("b", 2, 2)]), ("watermark", 30),
              ("elements", [("a", 3, 3), ("b", 4, 4), ("a", 5, 31)])]  # 3 and 4 come too late

    def build(p):
        return (p | keyed_test_stream(events) | "Keep" >> beam.Map(lambda kv: kv) | beam.WindowInto(windowfn)
                | beam.GroupByKey() | "Sorted" >> beam.MapTuple(lambda k, vs: [k, sorted(vs)]))

    assert sorted(streaming_equals_direct(build, tmp_path)) == [["a", [1]], ["a", [5]], ["b", [2]]]
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(["--streaming"]))
    _ = build(p) | beam.ParDo(AppendLines(str(tmp_path / "counted.jsonl")))
    result = p.run()
    result.wait_until_finish()
    [dropped] = result.metrics().query(beam.metrics.MetricsFilter().with_name("dropped_due_to_lateness"))["counters"]
    assert (dropped.key.metric.namespace, dropped.key.step, dropped.committed) == ("beam_ext.runner", "GroupByKey", 2)



@pytest.mark.parametrize("combiner", [window.TimestampCombiner.OUTPUT_AT_EOW,
                                      window.TimestampCombiner.OUTPUT_AT_EARLIEST], ids=["end", "earliest"])
def test_a_grouping_of_panes_closing_as_they_come_gives_the_direct_runners_panes(spark, tmp_path, combiner):
    """The second grouping gets the first's on-time panes in the micro-batch
    whose watermark closes their windows. A key it keeps nothing for, whose
    windows are all past the allowed lateness then, gets its panes without
    Beam's driver (``_ClosingKeys`` in ``worker/_streaming_group.py``); a
    window still open to late values, a late pane and a key with state take
    the driver. The panes, their timestamps and the late value dropped: the
    DirectRunner's."""
    events = [("elements", [("a", 1, 1), ("b", 2, 12), ("c", 4, 13)]), ("watermark", 25),
              # 6 is late, within the lateness: a late pane; 7 is past it, dropped.
              ("elements", [("b", 6, 15), ("a", 7, 3)]),
              ("elements", [("a", 8, 31), ("d", 9, 44)]), ("watermark", 60)]

    def build(p):
        sums = (p | keyed_test_stream(events) | "Keep" >> beam.Map(lambda kv: kv)
                | "Fixed" >> beam.WindowInto(window.FixedWindows(10), allowed_lateness=10)
                | "Sums" >> beam.CombinePerKey(sum))
        return (sums | "ByParity" >> beam.MapTuple(lambda k, total: (total % 2, k))
                | "Again" >> beam.WindowInto(window.FixedWindows(10), allowed_lateness=10,
                                             timestamp_combiner=combiner)
                | "Regroup" >> beam.GroupByKey()
                # Milliseconds: Beam's windowed value coder keeps no more between stages.
                | beam.MapTuple(lambda k, keys, w=beam.DoFn.WindowParam, t=beam.DoFn.TimestampParam,
                                pane=beam.DoFn.PaneInfoParam:
                                [k, sorted(keys), repr(w), t.micros // 1000, repr(pane)]))

    got = streaming_equals_direct(build, tmp_path)
    assert sorted([k, keys] for k, keys, *_ in got) == [
        [0, ["a"]], [0, ["b"]], [0, ["b", "c"]], [1, ["a"]], [1, ["d"]]]


def test_sessions_of_panes_closing_as_they_come_give_the_direct_runners_panes(spark, tmp_path):
    """As above, in sessions: the second grouping's keys, new when the first
    grouping's panes reach it, merge and close in that micro-batch (the
    batch's merging of sessions, ``_ClosingKeys``), the last at the end of
    the stream; the first grouping, under the earliest-timestamp combiner,
    takes the driver."""
    events = [("elements", [("a", 1, 1), ("a", 2, 3), ("b", 3, 2), ("c", 4, 20), ("e", 5, 22)]),
              ("watermark", 50), ("elements", [("d", 6, 52)])]

    def build(p):
        firsts = (p | keyed_test_stream(events) | "Keep" >> beam.Map(lambda kv: kv)
                  # The values' own timestamps: whole seconds, the same on both runners.
                  | "Sessions" >> beam.WindowInto(window.Sessions(5),
                                                  timestamp_combiner=window.TimestampCombiner.OUTPUT_AT_EARLIEST)
                  | "Group" >> beam.GroupByKey())
        return (firsts | "BySize" >> beam.MapTuple(lambda k, values: (len(values) % 2, k))
                | "Again" >> beam.WindowInto(window.Sessions(5)) | "Regroup" >> beam.GroupByKey()
                | beam.MapTuple(lambda k, keys, w=beam.DoFn.WindowParam, t=beam.DoFn.TimestampParam,
                                pane=beam.DoFn.PaneInfoParam:
                                [k, sorted(keys), repr(w), t.micros // 1000, repr(pane)]))

    got = streaming_equals_direct(build, tmp_path)
    # c's and e's sessions, 2 s apart, merge in the second grouping.
    assert sorted([k, keys] for k, keys, *_ in got) == [[0, ["a"]], [1, ["b"]], [1, ["c", "e"]], [1, ["d"]]]
