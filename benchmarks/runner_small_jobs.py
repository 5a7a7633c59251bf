"""Small jobs on a warm session: a 5-stage pipeline over 1,000 elements.

What a user of a notebook or a test suite waits for: the same pipeline
(Create -> Map -> GroupByKey -> Map -> Filter -> Count) on SparkRunner with
a running SparkSession (local[2], Python workers started by a warm-up run),
and on Beam's DirectRunner, several runs each, alternating. Writes
docs/benchmarks/runner_small_jobs.md and runner_small_jobs.png.

    python benchmarks/runner_small_jobs.py            # 10 runs each
    python benchmarks/runner_small_jobs.py --runs 3 --out /tmp/report
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

TARGET_SECONDS = 1.0  # the target for this pipeline on a warm session


def build(p: beam.Pipeline) -> None:
    (p | beam.Create(range(1000))
       | "Key" >> beam.Map(lambda x: (x % 10, x))
       | "Group" >> beam.GroupByKey()
       | "Sum" >> beam.MapTuple(lambda k, v: (k, sum(v)))
       | "Keep" >> beam.Filter(lambda kv: kv[0] > 2)
       | "Count" >> beam.combiners.Count.Globally())


def _time(runner) -> float:
    start = time.perf_counter()
    with beam.Pipeline(runner=runner, options=PipelineOptions([])) as p:
        build(p)
    return time.perf_counter() - start


def run(runs: int) -> dict[str, list[float]]:
    from spark_settings import local_session

    from beam_ext.runner import SparkRunner
    spark = local_session("runner-small-jobs")
    try:
        _time(SparkRunner())  # warm-up: Python workers, Beam imported in them
        times: dict[str, list[float]] = {"SparkRunner": [], "DirectRunner": []}
        for i in range(runs):
            times["SparkRunner"].append(_time(SparkRunner()))
            times["DirectRunner"].append(_time("DirectRunner"))
            print(f"run {i + 1}/{runs}: SparkRunner {times['SparkRunner'][-1]:.2f}s  "
                  f"DirectRunner {times['DirectRunner'][-1]:.2f}s", flush=True)
        return times
    finally:
        spark.stop()


def write_report(times: dict[str, list[float]], out_dir: str, runs: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.boxplot(list(times.values()), tick_labels=list(times))
    ax.axhline(TARGET_SECONDS, color="grey", linestyle="--", label="target (SparkRunner)")
    ax.set_ylabel("seconds per pipeline")
    ax.set_title("5 stages, 1,000 elements, warm session (2 cores)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "runner_small_jobs.png"), dpi=110)
    spark, direct = statistics.median(times["SparkRunner"]), statistics.median(times["DirectRunner"])
    lines = [
        "# Small jobs on a warm session",
        "",
        f"Reproduce: `.venv/bin/python benchmarks/runner_small_jobs.py --runs {runs}`",
        "",
        "Create -> Map -> GroupByKey -> Map -> Filter -> Count.Globally over 1,000 integers, "
        "on SparkRunner with a running SparkSession (local[2], Python workers warmed up) and on "
        "Beam's DirectRunner, alternating, in one process. Machine: 2 cores.",
        "",
        "| runner | median s | min s | max s |",
        "|---|---:|---:|---:|",
    ]
    for name, values in times.items():
        lines.append(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |")
    lines += ["", f"SparkRunner / DirectRunner (median time): {spark / direct:.1f}x; target for "
              f"SparkRunner: {TARGET_SECONDS:.0f} s ({'met' if spark <= TARGET_SECONDS else 'missed'}).",
              "", "![small jobs](runner_small_jobs.png)", ""]
    with open(os.path.join(out_dir, "runner_small_jobs.md"), "w") as f:
        f.write("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "docs",
                                                      "benchmarks"))
    args = parser.parse_args()
    times = run(args.runs)
    write_report(times, args.out, args.runs)
    print(f"report: {os.path.join(args.out, 'runner_small_jobs.md')}")


if __name__ == "__main__":
    main()
