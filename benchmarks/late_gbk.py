"""LateWindowedGroupByKey on SparkRunner against Beam's FnApiRunner.

The Beam pipeline ``n`` numbers -> timestamped pairs over an hour (100
keys) -> ``WindowInto(FixedWindows(60))`` -> ``LateWindowedGroupByKey()``
-> the panes' sizes summed, submitted end to end to SparkRunner (its
native step: a SpillStore per task) and to Beam's FnApiRunner (the
transform's Beam expansion: state and timers). FnApiRunner is
DirectRunner's batch engine, named directly: DirectRunner hands this
pipeline to its legacy engine for the processing-time timer the transform
declares. Both outputs are compared. Writes ``late_gbk.md`` and
``late_gbk.png`` to ``--out`` (default docs/benchmarks).

    python benchmarks/late_gbk.py                          # 200,000 numbers, 3 runs
    python benchmarks/late_gbk.py --size 20000 --runs 1 --out /tmp/late
"""
from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import tempfile

import apache_beam as beam
from apache_beam.transforms import window

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import runner_common  # noqa: E402

from beam_ext.transforms import LateWindowedGroupByKey  # noqa: E402


def build(p: beam.Pipeline, n: int) -> beam.PCollection:
    return (runner_common._stamped(p, n, 3600) | beam.WindowInto(window.FixedWindows(60)) | LateWindowedGroupByKey()
            | beam.MapTuple(lambda k, vs: len(vs)) | "Global" >> beam.WindowInto(window.GlobalWindows())
            | beam.CombineGlobally(sum))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "docs", "benchmarks"))
    args = parser.parse_args()
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from spark_settings import local_session

    from beam_ext.runner import SparkRunner

    spark = local_session("late-gbk")
    tmp = tempfile.mkdtemp(prefix="beam_ext_late_gbk_")
    times: dict[str, list[float]] = {"SparkRunner": [], "FnApiRunner": []}
    outputs = {}
    try:
        runner_common._run(SparkRunner(), build, args.size, os.path.join(tmp, "warm", "out"))
        for i in range(args.runs):
            for name, runner in (("SparkRunner", SparkRunner()), ("FnApiRunner", FnApiRunner())):
                seconds, outputs[name] = runner_common._run(runner, build, args.size,
                                                            os.path.join(tmp, f"{name}-{i}", "out"))
                times[name].append(seconds)
                print(f"{name:12s} run {i + 1}: {seconds:.2f} s", flush=True)
    finally:
        spark.stop()
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    same = outputs["SparkRunner"] == outputs["FnApiRunner"]
    ratio = medians["FnApiRunner"] / medians["SparkRunner"]
    print(f"SparkRunner {medians['SparkRunner']:.2f} s, FnApiRunner {medians['FnApiRunner']:.2f} s: "
          f"{ratio:.2f}x; same output: {same}")
    _report(args, medians, ratio, same)


def _report(args, medians: dict[str, float], ratio: float, same: bool) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(args.out, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 2.2))
    ax.barh(list(medians), list(medians.values()), color=["tab:green", "tab:grey"])
    ax.invert_yaxis()
    ax.set_xlabel("seconds (median)")
    ax.set_title(f"LateWindowedGroupByKey, {args.size:,} numbers, 2 cores")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "late_gbk.png"), dpi=110)
    command = "python benchmarks/late_gbk.py " + shlex.join(sys.argv[1:])
    lines = [
        "# LateWindowedGroupByKey: SparkRunner against Beam's FnApiRunner", "",
        f"Reproduce: `{command.strip()}`", "",
        f"{args.size:,} numbers as timestamped pairs over an hour (100 keys), `FixedWindows(60)`, "
        "`LateWindowedGroupByKey()`, the panes' sizes summed; the Beam pipeline submitted end to end to each "
        f"runner, alternating, median of {args.runs} run(s) after a warm-up run on SparkRunner (local[2]). "
        "FnApiRunner is DirectRunner's batch engine, named directly: DirectRunner hands this pipeline to its "
        "legacy engine. Machine: 2 cores.", "",
        "| runner | seconds | FnApiRunner / runner | same output |", "|---|---:|---:|---|",
        f"| SparkRunner | {medians['SparkRunner']:.2f} | {ratio:.2f}x | {'yes' if same else '**no**'} |",
        f"| FnApiRunner | {medians['FnApiRunner']:.2f} | 1.00x | |", "",
        "![LateWindowedGroupByKey](late_gbk.png)", ""]
    with open(os.path.join(args.out, "late_gbk.md"), "w") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()
