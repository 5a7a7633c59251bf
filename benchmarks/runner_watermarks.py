"""Tracker vs min watermarks inside SparkRunner streaming, on the same pipeline.

Runs one TestStream pipeline (out-of-order and late events, a windowed
GroupByKey with early and late firings, a stateful DoFn with event-time
timers downstream) with ``--watermarks=min`` and ``--watermarks=tracker``
at two bucket widths, checks the outputs are equal, and prints the
counters of each run: the lag of the watermarks that timers fired under
behind the true low watermark (the classic one, exact in this executor),
the messages the tracking service handled, and what a punctuation scheme
would send for the same watermarks.

    PYTHONPATH=. python benchmarks/runner_watermarks.py [--batches 24] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import trigger, userstate, window
from apache_beam.transforms.timeutil import TimeDomain


class _Append(beam.DoFn):
    def __init__(self, path: str) -> None:
        self._path = path

    def process(self, element):
        with open(self._path, "a", encoding="utf-8") as f:
            f.write(json.dumps(element, sort_keys=True, default=repr) + "\n")


class _FlushAtWindowEnd(beam.DoFn):
    TOTAL = userstate.ReadModifyWriteStateSpec("total", VarIntCoder())
    FLUSH = userstate.TimerSpec("flush", TimeDomain.WATERMARK)

    def process(self, kv, w=beam.DoFn.WindowParam, total=beam.DoFn.StateParam(TOTAL),
                flush=beam.DoFn.TimerParam(FLUSH)):
        total.write((total.read() or 0) + kv[1])
        flush.set(w.end)

    @userstate.on_timer(FLUSH)
    def on_flush(self, key=beam.DoFn.KeyParam, total=beam.DoFn.StateParam(TOTAL),
                 ts=beam.DoFn.TimestampParam):
        yield key, total.read(), float(ts)
        total.clear()


def _stream(batches: int, seed: int = 7) -> TestStream:
    rng = random.Random(seed)
    stream = TestStream()
    mark = 0.0
    for _ in range(batches):
        events = []
        for _ in range(6):
            key = rng.choice("abcd")
            late = rng.random() < 0.15
            ts = mark - rng.uniform(0, 4) if late else mark + rng.uniform(0, 3)
            events.append(window.TimestampedValue((key, 1), max(ts, 0.0)))
        stream = stream.add_elements(events)
        mark += rng.uniform(0.2, 1.3)  # watermarks that fall inside buckets
        stream = stream.advance_watermark_to(round(mark, 3))
    return stream.advance_watermark_to_infinity()


def _build(p, batches: int, path: str):
    grouped = (p | _stream(batches)
               | beam.WindowInto(window.FixedWindows(5), trigger=trigger.AfterWatermark(
                   early=trigger.AfterCount(3), late=trigger.AfterCount(1)),
                   allowed_lateness=10, accumulation_mode=trigger.AccumulationMode.DISCARDING)
               | beam.GroupByKey() | beam.Map(lambda kv: (kv[0], len(kv[1]))))
    _ = (grouped | "Rewindow" >> beam.WindowInto(window.FixedWindows(10))
         | beam.ParDo(_FlushAtWindowEnd()) | beam.ParDo(_Append(path)))


def _run(options: list[str], batches: int, workdir: str) -> dict:
    from beam_ext.runner import SparkRunner

    path = os.path.join(workdir, f"out-{len(os.listdir(workdir))}.jsonl")
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(["--streaming"] + options))
    _build(p, batches, path)
    start = time.monotonic()
    result = p.run()
    result.wait_until_finish()
    seconds = time.monotonic() - start
    with open(path, encoding="utf-8") as f:
        lines = sorted(f)
    stats = dict(result._executor.watermark_stats)
    return {"options": " ".join(options), "seconds": round(seconds, 1), "outputs": len(lines),
            "lines": lines, **stats}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=24)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--json", default=None, help="write the rows here too")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from spark_settings import session_conf
    spark = (SparkSession.builder.master(args.master).appName("runner-watermarks")
             .config(map=session_conf())
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.default.parallelism", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for options in (["--watermarks=min"], ["--watermarks=tracker", "--tracker_bucket=1"],
                        ["--watermarks=tracker", "--tracker_bucket=0.1"]):
            rows.append(_run(options, args.batches, workdir))
    spark.stop()
    same = all(row["lines"] == rows[0]["lines"] for row in rows)
    keys = ["options", "seconds", "outputs", "timer_gathers", "lag_mean_s", "lag_p50_s", "lag_max_s",
            "behind", "wait_s", "punctuations", "service_messages", "service_report_batches",
            "service_heartbeats", "service_notification_messages", "service_neoss_sent", "task_reports",
            "task_report_entries", "restarts"]
    print(f"outputs equal in every run: {same}")
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row.get(k, "-")) for k in keys) + " |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump([{k: v for k, v in row.items() if k != "lines"} for row in rows], f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
