"""Where a pipeline spends its time on the driver, before, around and in its Spark jobs.

Runs a pipeline of ``runner_throughput.py`` on SparkRunner (local[2], a
warm session: the first runs are discarded) and profiles one more run of the
driver process with cProfile: building the pipeline (and, inside it, Beam's
type inference of each ``Create``'s values), the overrides and the proto,
planning, and the Spark jobs the driver waits for. cProfile slows Python
down, so read the shares; the wall time without the profiler is printed
beside. A secondary, diagnostic figure: the headline is
``runner_throughput.py``.

    cd /tmp && PYTHONPATH=<checkout> python <checkout>/benchmarks/driver_profile.py side_join
"""
from __future__ import annotations

import argparse
import cProfile
import inspect
import os
import pstats
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import apache_beam as beam  # noqa: E402
from runner_throughput import PIPELINES, _Texts, case  # noqa: E402
from spark_settings import local_session  # noqa: E402


def _where(function) -> tuple[str, int, str]:
    code = inspect.unwrap(function).__code__
    return code.co_filename, code.co_firstlineno, code.co_name


def _parts() -> list[tuple[str, tuple[str, int, str]]]:
    """(what, the function whose cumulative time measures it), in the order a run goes."""
    from pyspark import RDD

    from beam_ext.runner import planning, spark_runner
    from beam_ext.runner.executors import _batch

    return [
        ("Beam's type inference of Create's values (inside building)", _where(beam.Create.infer_output_type)),
        ("overrides (replace_all)", _where(beam.Pipeline.replace_all)),
        ("proto (Pipeline.to_runner_api)", _where(beam.Pipeline.to_runner_api)),
        ("runner from the proto on (run_proto)", _where(spark_runner.SparkRunner.run_proto)),
        ("planning (plan_pipeline)", _where(planning.plan_pipeline)),
        ("executor (BatchExecutor.run)", _where(_batch.BatchExecutor.run)),
        ("Spark actions the driver waits for (collect)", _where(RDD.collect)),
        ("Spark actions the driver waits for (foreachPartition)", _where(RDD.foreachPartition)),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pipeline", choices=PIPELINES)
    parser.add_argument("--elements", type=int, default=2_000_000)
    parser.add_argument("--runs", type=int, default=4, help="unprofiled runs; the first warms the session")
    args = parser.parse_args(argv)

    from beam_ext.runner import SparkRunner

    spark = local_session("driver-profile")
    texts = tempfile.TemporaryDirectory(prefix="driver_profile_")
    label, build, _ = case(args.pipeline, args.elements, _Texts(texts.name), spark.sparkContext)
    timings = {}

    def run() -> None:
        start = time.perf_counter()
        with beam.Pipeline(runner=SparkRunner()) as p:
            started = time.perf_counter()
            build(p)
            timings["build"] = time.perf_counter() - started
        timings["all"] = time.perf_counter() - start

    walls = []
    for _ in range(args.runs):
        run()
        walls.append(timings["all"])
    profiler = cProfile.Profile()
    profiler.runcall(run)
    stats = pstats.Stats(profiler).stats
    by_function = {(f, line, name): cumulative for (f, line, name), (_, _, _, cumulative, _) in stats.items()}
    print(f"{label}, {args.elements:,} elements: unprofiled {statistics.median(walls[1:]):.2f} s "
          f"(median of {len(walls) - 1} warm runs); profiled {timings['all']:.2f} s")
    print("| part | profiled s | share |\n|---|---:|---:|")
    print(f"| building the pipeline (the user's code: Beam's transforms expand) | {timings['build']:.2f} | "
          f"{100 * timings['build'] / timings['all']:.0f}% |")
    for what, where in _parts():
        seconds = by_function.get(where, 0.0)
        print(f"| {what} | {seconds:.2f} | {100 * seconds / timings['all']:.0f}% |")
    spark.stop()
    texts.cleanup()


if __name__ == "__main__":
    main()
