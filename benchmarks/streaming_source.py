"""An unbounded source's steps in streaming: SparkRunner's time, its output checked against the definition.

The pipeline: ``PeriodicImpulse`` (100 impulses, one per second of event
time, all due at once: their times are in the past) -> ``FlatMap`` (each
impulse into ``--size / 100`` numbers) -> ``Map`` (keyed by ``x % 100``) ->
``WindowInto(FixedWindows(10))`` -> ``CombinePerKey(sum)``, on
``SparkRunner --streaming`` (local[2], the settings SparkRunner gives a
session it starts; one warm-up run, then ``--runs`` timed). Every run's
output must equal the sums computed here from the definition.

Beam's fusion puts the steps after the source's splittable ``DoFn`` in the
``DoFn``'s stage. Beam's DirectRunner cannot run a splittable ``DoFn`` in
streaming (its override of the expansion fails), so there is no DirectRunner
anchor: compare checkouts, each in its own run (``beam_ext`` comes from
``PYTHONPATH``). Writes docs/benchmarks/streaming_source.md and .png.

    cd /tmp && PYTHONPATH=<checkout> python <this checkout>/benchmarks/streaming_source.py [--size 200000]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import apache_beam as beam

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

_IMPULSES = 100
_KEYS = 100
_WINDOW = 10


def build(p, size: int):
    """The pipeline, its output ``"key window-start sum"`` lines."""
    from apache_beam.transforms import window
    from apache_beam.transforms.periodicsequence import PeriodicImpulse

    per = size // _IMPULSES
    return (p | PeriodicImpulse(start_timestamp=0, stop_timestamp=_IMPULSES, fire_interval=1)
            | "Numbers" >> beam.FlatMap(lambda t: range(int(t) * per, (int(t) + 1) * per))
            | "Key" >> beam.Map(lambda x: (x % _KEYS, x))
            | beam.WindowInto(window.FixedWindows(_WINDOW)) | beam.CombinePerKey(sum)
            | "Format" >> beam.Map(lambda kv, w=beam.DoFn.WindowParam: f"{kv[0]} {int(w.start)} {kv[1]}"))


def expected(size: int) -> list[tuple[int, int, int]]:
    per = size // _IMPULSES
    sums: dict[tuple[int, int], int] = {}
    for impulse in range(_IMPULSES):
        start = impulse // _WINDOW * _WINDOW
        for x in range(impulse * per, (impulse + 1) * per):
            sums[(x % _KEYS, start)] = sums.get((x % _KEYS, start), 0) + x
    return sorted((k, start, total) for (k, start), total in sums.items())


def run(size: int, out: str) -> tuple[float, list[tuple[int, int, int]]]:
    """One run's seconds and its ``(key, window start, sum)`` outputs, sorted."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_ext.runner import SparkRunner

    start = time.perf_counter()
    with beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(["--streaming"])) as p:
        _ = build(p, size) | beam.ParDo(_AppendLines(out))
    seconds = time.perf_counter() - start
    with open(out) as f:
        return seconds, sorted(tuple(map(int, line.split())) for line in f)


class _AppendLines(beam.DoFn):
    """Appends each element as a line to one file (an unbounded PCollection
    has no ``WriteToText``; the output is 1,000 lines)."""

    def __init__(self, path: str) -> None:
        self._path = path

    def process(self, line: str) -> None:
        with open(self._path, "a") as f:
            f.write(line + "\n")


def write_report(times: list[float], size: int, commit: str, out_dir: str, command: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(out_dir, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 2.4))
    ax.bar(range(1, len(times) + 1), times, color="tab:blue")
    ax.set_xlabel("run")
    ax.set_ylabel("seconds")
    ax.set_title(f"PeriodicImpulse -> FlatMap -> ... -> CombinePerKey, {size:,} numbers, streaming")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "streaming_source.png"), dpi=110)
    lines = [
        "# An unbounded source's steps in streaming (SparkRunner)",
        "",
        f"Reproduce: `{command}` (on `{commit}`)",
        "",
        f"`PeriodicImpulse` (100 impulses, all due at once) -> `FlatMap` into {size:,} numbers -> `Map` -> "
        "`WindowInto(FixedWindows(10))` -> `CombinePerKey(sum)` on SparkRunner in streaming mode, local[2], "
        "warm session. Every run's output equals the sums computed from the definition. Beam's DirectRunner "
        "cannot run a splittable `DoFn` in streaming, so checkouts are compared instead, each in its own run. "
        "Machine: 2 cores.",
        "",
        "| run | seconds |",
        "|---:|---:|",
        *(f"| {i} | {t:.2f} |" for i, t in enumerate(times, 1)),
        "",
        f"Median {statistics.median(times):.2f} s.",
        "",
        "![runs](streaming_source.png)",
        "",
    ]
    with open(os.path.join(out_dir, "streaming_source.md"), "w") as f:
        f.write("\n".join(lines))


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "docs", "benchmarks"))
    args = parser.parse_args()
    from spark_settings import local_session

    import beam_ext

    spark = local_session("streaming-source")
    tmp = tempfile.mkdtemp(prefix="beam_ext_source_")
    want = expected(args.size)
    try:
        run(args.size, os.path.join(tmp, "warm"))
        times = []
        for i in range(args.runs):
            seconds, got = run(args.size, os.path.join(tmp, f"run{i}"))
            if got != want:
                raise SystemExit(f"run {i}: the output differs from the definition ({len(got)} rows, "
                                 f"{len(want)} expected)")
            times.append(seconds)
            print(f"run {i + 1}: {seconds:.2f} s, output equal to the definition", flush=True)
    finally:
        spark.stop()
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(beam_ext.__file__)))
    commit = subprocess.run(["git", "-C", checkout, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    command = "python benchmarks/streaming_source.py" + "".join(
        f" --{flag} {value}" for flag, value, default in (("size", args.size, 200_000), ("runs", args.runs, 3))
        if value != default)
    write_report(times, args.size, commit, args.out, command)
    print(f"median {statistics.median(times):.2f} s; report: {os.path.join(args.out, 'streaming_source.md')}")


if __name__ == "__main__":
    main()
