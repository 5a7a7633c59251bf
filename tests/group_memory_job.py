"""A GroupByKey bigger than its Python worker's memory limit, on a Spark of its own.

Run by tests/test_group_spill.py in a subprocess: ``spark.executor.pyspark.memory``
makes PySpark cap each Python worker's address space (RLIMIT_AS), so a task
that holds the whole partition's groups in memory fails, and one that spills
sorted runs does not. Runs the pipeline once per ``--spark_group_memory``
budget, in that order, in one Spark session, and prints a line per run:
``OK <keys> <bytes>`` or ``FAILED <error>``.

    python tests/group_memory_job.py --pyspark_memory=700m --spark_group_memory=16777216,1099511627776
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys

import apache_beam as beam

VALUE_REPEAT = 320  # a value: 32 bytes * 320 = 10 KiB


def _values(shard: int, per_shard: int, keys: int):
    for i in range(shard * per_shard, (shard + 1) * per_shard):
        key = f"k{i % keys}"
        yield key, hashlib.sha256(f"{i}".encode()).digest() * VALUE_REPEAT


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pyspark_memory", required=True)
    parser.add_argument("--spark_group_memory", required=True, help="comma-separated budgets, one run each")
    parser.add_argument("--elements", type=int, default=40000)
    args = parser.parse_args(argv)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # Fewer malloc arenas: less address space reserved per thread, so the limit measures data.
    os.environ["MALLOC_ARENA_MAX"] = "2"
    from pyspark.sql import SparkSession

    from beam_ext.runner import PipelineError, SparkRunner

    spark = (SparkSession.builder.master("local[1]").appName("group_memory_job")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.executor.pyspark.memory", args.pyspark_memory).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    # Groups of 100 values (1 MiB): small next to the limit, and few bundles downstream.
    shards, keys = 200, args.elements // 100
    per_shard = args.elements // shards
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.testing.util import assert_that, equal_to

    total = shards * per_shard * 32 * VALUE_REPEAT
    try:
        for budget in args.spark_group_memory.split(","):
            p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions([
                f"--spark_group_memory={budget}", "--spark_parallelism=1",
                # One shard per bundle: a bundle's output is held until it ends.
                "--spark_bundle_size=16"]))
            sizes = (p | beam.Create(range(shards))
                     | beam.FlatMap(_values, per_shard, keys)
                     | beam.GroupByKey()
                     | beam.MapTuple(lambda key, values: (1, sum(map(len, values))))
                     | beam.CombineGlobally(lambda pairs: tuple(map(sum, zip(*pairs))) or (0, 0)))
            assert_that(sizes, equal_to([(keys, total)]))
            try:
                p.run().wait_until_finish()
            except PipelineError as e:
                print(f"FAILED {type(e).__name__}: {e}"[:2000].replace("\n", " "), flush=True)
                continue
            print(f"OK {keys} {total}", flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
