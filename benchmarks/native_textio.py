"""Wordcount, a line count and a 64 MiB line over ReadFromText on SparkRunner (local[2]): run before and after a change.

    cd /tmp && PYTHONPATH=<checkout> python <checkout>/benchmarks/native_textio.py

Run from outside the checkout: Spark's Python workers put the working
directory first on sys.path. The text (12 MB) and a file holding one line
of 64 MiB and a short one are generated once in /tmp.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

import apache_beam as beam

import beam_ext

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runner_throughput import beam_wordcount, make_text  # noqa: E402

TEXT = "/tmp/beam_ext_native_textio_words12.txt"
LONG_LINE = "/tmp/beam_ext_native_textio_long_line.txt"


def _median_seconds(build, runs: int) -> tuple[float, list[float]]:
    from beam_ext.runner import SparkRunner

    times = []
    for _ in range(runs):
        start = time.perf_counter()
        with beam.Pipeline(runner=SparkRunner()) as p:
            build(p)
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def main() -> None:
    from pyspark.sql import SparkSession

    from beam_ext.runner import SparkRunner

    if not os.path.exists(TEXT):
        make_text(TEXT, 2_076_972)  # words: 12 MB of text
    if not os.path.exists(LONG_LINE):
        with open(LONG_LINE, "wb") as f:
            f.write(b"x" * (64 << 20) + b"\nshort\n")
    from spark_settings import session_conf
    spark = (SparkSession.builder.master("local[2]").appName("native-textio")
             .config(map=session_conf())
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    with beam.Pipeline(runner=SparkRunner()) as p:  # warm-up: Python workers, imports
        _ = p | beam.Create(["a b"]) | beam.FlatMap(str.split) | beam.combiners.Count.PerElement()
    words = sum(len(line.split()) for line in open(TEXT))
    print(f"checkout {os.path.dirname(os.path.dirname(beam_ext.__file__))}, "
          f"{os.path.getsize(TEXT) / 1e6:.1f} MB, {words:,} words")
    for name, build, runs in [
            ("wordcount", lambda p: beam_wordcount(p, TEXT), 3),
            ("read + count lines", lambda p: p | beam.io.ReadFromText(TEXT) | beam.combiners.Count.Globally(), 4),
            ("a 64 MiB line", lambda p: (p | beam.io.ReadFromText(LONG_LINE) | beam.Map(len)
                                         | beam.CombineGlobally(sum)), 3)]:
        median, times = _median_seconds(build, runs)
        print(f"{name:20s} median {median:.2f}s of {[round(t, 2) for t in times]}")


if __name__ == "__main__":
    main()
