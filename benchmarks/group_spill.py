"""GroupByKey of 2M pairs over 1M keys with a given --spark_group_memory: time and the workers' peak RSS.

One budget per run, each on a Spark of its own (Python workers are reused
within a SparkContext, and their peak RSS counts from the worker's start):

    python benchmarks/group_spill.py                                # default budget (256 MiB)
    python benchmarks/group_spill.py --spark_group_memory=16777216  # spills

Prints seconds, pairs per second, the runs and bytes spilled, and the
largest peak RSS (VmHWM) of the Python workers that grouped.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import apache_beam as beam

sys.path.insert(0, os.path.dirname(__file__))
from runner_throughput import beam_gbk  # noqa: E402


class _PeakRss(beam.DoFn):
    """Reports the worker's peak RSS: it runs in the task that grouped, after the grouping."""

    def finish_bundle(self):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    beam.metrics.Metrics.distribution("bench", "worker_peak_rss_kb").update(int(line.split()[1]))

    def process(self, element):
        yield element


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spark_group_memory", type=int, default=256 << 20)
    parser.add_argument("--pairs", type=int, default=2_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from apache_beam.options.pipeline_options import PipelineOptions
    from pyspark.sql import SparkSession
    from spark_settings import session_conf

    from beam_ext.runner import SparkRunner
    spark = (SparkSession.builder.master("local[2]").appName("group-spill-benchmark")
             .config(map=session_conf())
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(
        [f"--spark_group_memory={args.spark_group_memory}"]))
    _ = beam_gbk(p, args.pairs, args.keys) | beam.ParDo(_PeakRss())
    start = time.perf_counter()
    result = p.run()
    result.wait_until_finish()
    seconds = time.perf_counter() - start
    spark.stop()
    found = {c.key.metric.name: c.committed for c in result.metrics().query()["counters"]}
    # The DoFn runs in the consuming stage of each GroupByKey; the last one's
    # (one task, one value) is not the big grouping: take the largest.
    rss = max(d.committed.max for d in result.metrics().query()["distributions"])
    print(f"--spark_group_memory={args.spark_group_memory}: {seconds:.1f} s, "
          f"{args.pairs / seconds:,.0f} pairs/s, spilled {found.get('group_spilled_runs', 0)} runs "
          f"({found.get('group_spilled_bytes', 0) / 1e6:.1f} MB), worker peak RSS {rss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
