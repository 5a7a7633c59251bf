"""Spark jobs per micro-batch of a small streaming pipeline, against the cost of a trivial PySpark job.

Runs ``TestStream -> WindowInto(FixedWindows(5), early firings every 2
elements) -> GroupByKey`` on ``SparkRunner --streaming`` (local[2] with the
settings SparkRunner gives a session it starts, one element and one
watermark step per TestStream event) twice, the first to warm the session,
then reads Spark's
REST API: how many Spark jobs, stages and tasks the second run took, grouped by
micro-batch (the job descriptions name it), and their wall time. For
scale, it times trivial two-task PySpark jobs on the same session: a
``map`` and a ``partitionBy``. When the jobs' count times that floor is most
of the run, the cost is the number of jobs per micro-batch, not the work in
them.

    python benchmarks/streaming_jobs.py [--elements 10] [--per 1] [--direct]

``--per N`` puts N elements (N keys) in each TestStream event; ``--direct``
also times the same pipeline on Beam's DirectRunner in streaming mode (its
BundleBasedDirectRunner), which runs an event in a few milliseconds.

``beam_ext`` comes from ``PYTHONPATH``, so two checkouts compare side by side
(``cd /tmp && PYTHONPATH=<checkout> python <this checkout>/benchmarks/streaming_jobs.py``).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from runner_profile import wall_seconds  # noqa: E402
from spark_settings import session_conf  # noqa: E402


def _drain(records) -> None:
    for _ in records:
        pass


def _identity(x):
    return x


def trivial_job_seconds(sc, runs: int = 8) -> dict[str, float]:
    """Median wall of tiny two-task PySpark jobs (the first two runs warm up)."""
    cases = {"map": lambda: sc.parallelize([b"x"] * 10, 2).map(_identity),
             "partitionBy": lambda: sc.parallelize([(i, b"x") for i in range(10)], 2).partitionBy(2)}
    out = {}
    for name, make in cases.items():
        times = []
        for _ in range(runs):
            rdd = make()
            start = time.perf_counter()
            rdd.foreachPartition(_drain)
            times.append(time.perf_counter() - start)
        out[name] = statistics.median(times[2:])
    return out


def build_stream(p, elements: int, per: int = 1):
    """``TestStream -> WindowInto(FixedWindows(5), early firings every 2 elements) -> GroupByKey``,
    ``elements`` events of ``per`` keys' elements, each followed by a watermark step."""
    import apache_beam as beam
    from apache_beam.testing.test_stream import TestStream
    from apache_beam.transforms import trigger, window

    stream = TestStream()
    for i in range(elements):
        stream = stream.add_elements([window.TimestampedValue((f"k{k}", i), i) for k in range(per)]
                                     ).advance_watermark_to(i)
    return (p | stream.advance_watermark_to_infinity()
            | beam.WindowInto(window.FixedWindows(5), trigger=trigger.AfterWatermark(early=trigger.AfterCount(2)),
                              accumulation_mode=trigger.AccumulationMode.DISCARDING)
            | beam.GroupByKey())


def run_stream(elements: int, per: int = 1, runner=None) -> float:
    """Seconds to run :func:`build_stream` in streaming mode on ``runner`` (SparkRunner by default)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_ext.runner import SparkRunner

    start = time.perf_counter()
    with beam.Pipeline(runner=runner or SparkRunner(), options=PipelineOptions(["--streaming"])) as p:
        build_stream(p, elements, per)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=10, help="TestStream events of elements")
    parser.add_argument("--per", type=int, default=1, help="elements (keys) per event")
    parser.add_argument("--direct", action="store_true", help="also time DirectRunner in streaming mode")
    args = parser.parse_args()
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.config(map=session_conf()).master("local[2]")
             .config("spark.ui.showConsoleProgress", "false").config("spark.default.parallelism", "2").getOrCreate())
    sc = spark.sparkContext
    sc.setLogLevel("FATAL")
    run_stream(args.elements, args.per)  # warm: Python workers started, Beam imported in them
    before = max(sc.statusTracker().getJobIdsForGroup(), default=-1)
    wall = run_stream(args.elements, args.per)

    def get(path: str):
        with urllib.request.urlopen(f"{sc.uiWebUrl}/api/v1/{path}", timeout=30) as r:
            return json.load(r)

    app = get("applications")[0]["id"]
    jobs = [j for j in get(f"applications/{app}/jobs") if j.get("completionTime") and j["jobId"] > before]
    ids = {i for j in jobs for i in j["stageIds"]}
    stages = [s for s in get(f"applications/{app}/stages") if s["status"] == "COMPLETE" and s["stageId"] in ids]
    batches = {m.group(1) for j in jobs if (m := re.match(r"beam_ext batch (\d+):", j.get("description") or ""))}
    job_seconds = [wall_seconds(j) for j in jobs]
    floor = trivial_job_seconds(sc)
    print(f"Spark settings {session_conf()}")
    print(f"pipeline wall {wall:.2f} s (warm session); micro-batches with Spark jobs: {len(batches)}")
    print(f"Spark jobs {len(jobs)} ({sum(job_seconds):.2f} s in all, median {statistics.median(job_seconds):.3f} s), "
          f"stages {len(stages)}, tasks {sum(s['numTasks'] for s in stages)}, "
          f"task run {sum(s['executorRunTime'] for s in stages) / 1e3:.2f} s")
    print(f"trivial two-task PySpark job, median: map {floor['map']:.3f} s, partitionBy {floor['partitionBy']:.3f} s")
    if args.direct:
        direct = min(run_stream(args.elements, args.per, "BundleBasedDirectRunner") for _ in range(2))
        print(f"DirectRunner (streaming), best of 2: {direct:.2f} s; SparkRunner / DirectRunner speed "
              f"{direct / wall:.2f}x")
    spark.stop()


if __name__ == "__main__":
    main()
