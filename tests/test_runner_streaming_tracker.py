"""--watermarks=tracker: input watermarks from the tracking service, same results as min and DirectRunner."""
from __future__ import annotations

import os
import time

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.runner import PipelineState
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import trigger, userstate, window
from apache_beam.transforms.timeutil import TimeDomain
from pipeline_outputs import AppendLines, read_lines, streaming_equals_direct

from beam_ext.runner import SparkRunner
from beam_ext.watermark import LocalAgent, TrackerAuthError

TV = window.TimestampedValue
TRACKER = ["--watermarks=tracker"]


def _spark(build, path: str, options: list[str]):
    """Runs ``build`` on SparkRunner in streaming; returns (lines written, watermark stats)."""
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(["--streaming"] + options))
    _ = build(p) | beam.ParDo(AppendLines(path))
    result = p.run()
    assert result.wait_until_finish() == PipelineState.DONE
    return read_lines(path), result._executor.watermark_stats


def _tracker_min_direct(build, tmp_path) -> tuple[list, dict]:
    """Asserts tracker, min and the DirectRunner output the same; returns it and the tracker's stats."""
    tracked, stats = _spark(build, str(tmp_path / "tracker.jsonl"), TRACKER)
    classic, _ = _spark(build, str(tmp_path / "min.jsonl"), ["--watermarks=min"])
    assert tracked == classic
    assert streaming_equals_direct(build, tmp_path, TRACKER) == tracked
    assert stats["mode"] == "tracker" and stats["ahead"] == 0 and stats["behind"] == 0
    return tracked, stats


def _panes(pcoll):
    return pcoll | "Panes" >> beam.Map(
        lambda kv, w=beam.DoFn.WindowParam, p=beam.DoFn.PaneInfoParam:
        [kv[0], sorted(kv[1]), str(w), p.timing, p.index])


def _late_data(p):
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
        window.FixedWindows(10), trigger=trigger.AfterWatermark(
            early=trigger.AfterCount(2), late=trigger.AfterCount(1)),
        allowed_lateness=100, accumulation_mode=trigger.AccumulationMode.ACCUMULATING)
        | beam.GroupByKey())


def test_late_data_and_triggers_give_the_same_panes(spark, tmp_path):
    panes, stats = _tracker_min_direct(_late_data, tmp_path)
    assert ["a", [1, 3, 4], "[0.0, 10.0)", 2, 2] in panes  # the late pane
    assert stats["service_report_batches"] > 0 and stats["service_neoss_sent"] > 0
    assert stats["lag_max_s"] == 0.0  # integer watermarks, one-second buckets


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


def test_stateful_dofn_timers_then_a_grouping_downstream(spark, tmp_path):
    def build(p):
        stream = (TestStream()
                  .add_elements([TV(("a", 1), 1), TV(("b", 2), 2)])
                  .advance_watermark_to(5)
                  .add_elements([TV(("a", 3), 3), TV(("a", 11), 11)])
                  .advance_watermark_to(15)
                  .add_elements([TV(("b", 12), 12)])
                  # Past the second timers before the end: at +inf the DirectRunner
                  # drops what they emit as late, SparkRunner (min or tracker) does not.
                  .advance_watermark_to(25)
                  .advance_watermark_to_infinity())
        flushed = (p | stream | beam.WindowInto(window.FixedWindows(10))
                   | beam.ParDo(_BufferUntilTimer()))
        # The timers' outputs (held by the timers) feed a second grouping.
        return (flushed | beam.Map(lambda e: (e[0], len(e[1])))
                | "Again" >> beam.WindowInto(window.FixedWindows(20)) | beam.CombinePerKey(sum)
                | beam.Map(list))

    out, _ = _tracker_min_direct(build, tmp_path)
    assert out == [["a", 1], ["a", 2], ["b", 1], ["b", 1]]


def test_the_service_is_on_loopback_and_refuses_another_token(spark, tmp_path):
    stream = TestStream()
    for i in range(4):
        stream = stream.add_elements([TV(("k", i), i)]).advance_watermark_to(i + 1)
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(["--streaming"] + TRACKER))
    _ = (p | stream.advance_watermark_to_infinity() | beam.WindowInto(window.FixedWindows(2))
         | beam.GroupByKey() | beam.ParDo(AppendLines(str(tmp_path / "out.jsonl"))))
    result = p.run()
    tracker = result._executor._watermarks
    deadline = time.monotonic() + 120
    while tracker.service is None and time.monotonic() < deadline:
        time.sleep(0.01)
    address = tracker.service.address
    assert address.startswith("127.0.0.1:")
    with pytest.raises(TrackerAuthError):
        LocalAgent(address, "intruder", b"not-the-job-token", flush_interval=None)
    assert result.wait_until_finish() == PipelineState.DONE
    assert tracker.stats()["service_rejected_calls"] >= 1
    assert len(read_lines(str(tmp_path / "out.jsonl"))) == 2


def test_an_unbounded_source_and_its_residual_holds(spark, tmp_path):
    from apache_beam.transforms.periodicsequence import PeriodicImpulse

    start = time.time()

    def build(p):
        return (p | PeriodicImpulse(start_timestamp=start, stop_timestamp=start + 2, fire_interval=0.5)
                | beam.Map(lambda t: round(float(t) - start, 3)))

    # What the DirectRunner outputs (tests/test_runner_streaming.py compares the two).
    out, stats = _spark(build, str(tmp_path / "out.jsonl"), TRACKER)
    assert out == [0.0, 0.5, 1.0, 1.5]
    assert stats["ahead"] == 0 and stats["restarts"] == 0


def _eight_batches(p):
    stream = TestStream()
    for i in range(8):
        stream = stream.add_elements([TV(("k", i), i), TV(("j", i), i)]).advance_watermark_to(i + 1)
    return _panes(p | stream.advance_watermark_to_infinity()
                  | beam.WindowInto(window.FixedWindows(3)) | beam.GroupByKey())


def _start_tracked(tmp_path, path: str):
    """Starts ``_eight_batches`` with tracker watermarks; returns the result once batch 1 is committed."""
    checkpoint = str(tmp_path / "ckpt")
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(
        ["--streaming", f"--checkpoint_dir={checkpoint}", "--tracker_timeout=1"] + TRACKER))
    _ = _eight_batches(p) | beam.ParDo(AppendLines(path))
    result = p.run()
    while not os.path.exists(os.path.join(checkpoint, "commits", "1.commit")):
        assert result.state == PipelineState.RUNNING
        time.sleep(0.02)
    return result


def test_killing_the_service_mid_run_gives_the_same_results(spark, tmp_path):
    expected, _ = _spark(_eight_batches, str(tmp_path / "expected.jsonl"), ["--watermarks=min"])
    path = str(tmp_path / "out.jsonl")
    result = _start_tracked(tmp_path, path)
    tracker = result._executor._watermarks
    tracker.service.stop()  # gone, with its table, while the pipeline runs
    assert result.wait_until_finish() == PipelineState.DONE
    assert read_lines(path) == expected
    stats = tracker.stats()
    assert stats["restarts"] >= 1 and stats["ahead"] == 0


def test_a_report_no_task_accounts_for_only_delays_until_a_reseed(spark, tmp_path):
    # What a retried task that had already flushed leaves behind: an SND nothing will match.
    expected, _ = _spark(_eight_batches, str(tmp_path / "expected.jsonl"), ["--watermarks=min"])
    path = str(tmp_path / "out.jsonl")
    result = _start_tracked(tmp_path, path)
    tracker = result._executor._watermarks
    producer = f"{tracker._producers['group0'][0]}/0"  # the GroupByKey waits on it
    stray = LocalAgent(tracker.service.address, "stray", tracker._token, flush_interval=None,
                       hosts=[producer], listen=False)
    stray.sent(6, 12345, to=producer, at=producer)  # bucket [6 s, 7 s), ahead of the watermark
    stray.flush()
    stray.close()
    assert result.wait_until_finish() == PipelineState.DONE
    assert read_lines(path) == expected
    stats = tracker.stats()
    assert stats["restarts"] >= 1 and stats["ahead"] == 0 and stats["behind"] == 0
