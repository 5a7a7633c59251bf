"""Wall time of benchmark pipelines on SparkRunner, for comparing two checkouts.

Runs the chosen pipelines of ``runner_throughput.py`` and the sliding
benchmark's headline pipeline on SparkRunner (local[2], a warm session:
the first run of each is discarded, with the Spark settings SparkRunner
gives a session it starts) and prints the median of the other runs. The ``beam_ext`` imported, on the driver and in the Python workers,
is the one on ``PYTHONPATH``, so running it once per checkout compares two
versions side by side on the same data:

    cd /tmp && PYTHONPATH=<old checkout> python <checkout>/benchmarks/runner_ab.py wordcount sliding_1min
    cd /tmp && PYTHONPATH=<new checkout> python <checkout>/benchmarks/runner_ab.py wordcount sliding_1min
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import apache_beam as beam  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402
from runner_throughput import (  # noqa: E402
    beam_cogbk,
    beam_combine,
    beam_gbk,
    beam_rows,
    beam_rows_grouped,
    beam_sessions,
    beam_side_join,
    beam_side_mean,
    beam_windowed,
    beam_wordcount,
    make_text,
)
from sliding import DAY, MINUTE, build_sliding, make_data, write_parquet  # noqa: E402
from spark_settings import session_conf  # noqa: E402
from streaming_jobs import build_stream  # noqa: E402

CASES = ("wordcount", "side_mean", "combine", "combine_1m", "gbk", "cogbk", "side_join", "dofn_setup", "windowed",
         "sessions", "rows", "rows_grouped", "sliding_1min", "sliding_1day", "parquet_pick", "parquet_keyed",
         "parquet_sum", "streaming")
STREAMING = {"streaming"}


class _Rates(beam.DoFn):
    """A DoFn as Dataflow pipelines write them: a table loaded once in ``setup``."""

    def setup(self):
        self._rates = {c: 1 + c / 100 for c in range(1_000)}

    def process(self, x):
        yield x % 1_000, x * self._rates[x % 1_000]


def _dofn_setup(p, n: int):
    """``n`` numbers through a ``DoFn`` with ``setup``, summed per key (1,000 keys)."""
    per = n // 8
    return (p | "Shards" >> beam.Create(range(8)) | beam.Reshuffle()
            | beam.FlatMap(lambda s: range(s * per, (s + 1) * per))
            | beam.ParDo(_Rates()) | beam.CombinePerKey(sum) | beam.combiners.Count.Globally())


def _parquet_pick(p, path: str, out: str):
    """The sliding benchmark's events read from Parquet, three fields picked per row, written as Parquet."""
    import pyarrow as pa

    schema = pa.schema([("id", pa.int64()), ("key", pa.int64()), ("amount", pa.float64())])
    _ = (p | beam.io.ReadFromParquet(path)
         | beam.Map(lambda r: {"id": r["id"], "key": r["key"], "amount": r["amount"]})
         | beam.io.WriteToParquet(out, schema))


def _parquet_keyed(p, path: str):
    """The sliding benchmark's events read from Parquet, keyed by a ``Map`` to a tuple, summed per key, counted."""
    return (p | beam.io.ReadFromParquet(path) | beam.Map(lambda r: (r["key"], r["amount"]))
            | beam.CombinePerKey(sum) | beam.combiners.Count.Globally())


def _parquet_sum(p, path: str):
    """The sliding benchmark's events read from Parquet, one field taken by a ``Map``, summed."""
    return p | beam.io.ReadFromParquet(path) | beam.Map(lambda r: r["amount"]) | beam.CombineGlobally(sum)


def _builders(tmp: str, words: int, events: int) -> dict:
    text = os.path.join(tmp, "words.txt")
    make_text(text, words)
    parquet = os.path.join(tmp, "events.parquet")
    write_parquet(make_data(events, 100), parquet)
    out = os.path.join(tmp, "out")
    return {"wordcount": lambda p: beam_wordcount(p, text),
            "side_mean": lambda p: beam_side_mean(p, text),
            "combine": lambda p: beam_combine(p, words, 1_000),
            "combine_1m": lambda p: beam_combine(p, words, words // 2),
            "gbk": lambda p: beam_gbk(p, words, words // 2),
            "cogbk": lambda p: beam_cogbk(p, words, 1_000),
            "side_join": lambda p: beam_side_join(p, words, 10_000),
            "dofn_setup": lambda p: _dofn_setup(p, words),
            "windowed": lambda p: beam_windowed(p, words, 1_000),
            "sessions": lambda p: beam_sessions(p, words, 1_000),
            "rows": lambda p: beam_rows(p, words, 1_000),
            "rows_grouped": lambda p: beam_rows_grouped(p, words, 1_000),
            "sliding_1min": lambda p: build_sliding(p, parquet, MINUTE, out),
            "sliding_1day": lambda p: build_sliding(p, parquet, DAY, out),
            "parquet_pick": lambda p: _parquet_pick(p, parquet, os.path.join(out, "picked")),
            "parquet_keyed": lambda p: _parquet_keyed(p, parquet),
            "parquet_sum": lambda p: _parquet_sum(p, parquet),
            # 10 micro-batches with an element, 10 more moving the watermark
            "streaming": lambda p: build_stream(p, 10)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", choices=CASES)
    parser.add_argument("--runs", type=int, default=4, help="runs per pipeline; the first warms the session")
    parser.add_argument("--words", type=int, default=2_000_000)
    parser.add_argument("--events", type=int, default=1_000_000)
    args = parser.parse_args()
    from pyspark.sql import SparkSession

    import beam_ext
    from beam_ext.runner import SparkRunner

    spark = (SparkSession.builder.config(map=session_conf()).master("local[2]").config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", "3g").getOrCreate())
    spark.sparkContext.setLogLevel("FATAL")
    print(f"beam_ext from {os.path.dirname(beam_ext.__file__)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="runner_ab_") as tmp:
        builders = _builders(tmp, args.words, args.events)
        for name in args.cases:
            times = []
            for _ in range(args.runs):
                start = time.perf_counter()
                options = PipelineOptions(["--streaming"] if name in STREAMING else [])
                with beam.Pipeline(runner=SparkRunner(), options=options) as p:
                    builders[name](p)
                times.append(time.perf_counter() - start)
            print(f"{name}: median {statistics.median(times[1:]):.2f} s of {[round(t, 2) for t in times[1:]]}",
                  flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
