"""Spark start-up as SparkRunner does it, with and without the driver JVM's class archive.

Each run is a fresh Python process that calls the runner's
``get_or_create_session`` (local[2]) and runs one tiny Python job, timed
from before the call to the job's end. Runs alternate between
``BEAM_EXT_JVM_CACHE=off`` and a cache directory whose archive the first
(untimed) start wrote. Prints medians and writes
``docs/benchmarks/spark_startup.md``.

    python benchmarks/spark_startup.py [--runs 5]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

_CHILD = """
import json, os, sys, time
start = time.perf_counter()
from apache_beam.options.pipeline_options import PipelineOptions
from beam_ext.runner import SparkRunnerOptions
from beam_ext.runner.session import get_or_create_session
options = PipelineOptions(["--spark_master=local[2]", "--spark_conf=spark.ui.showConsoleProgress=false"])
session = get_or_create_session(options.view_as(SparkRunnerOptions), "startup")
started = time.perf_counter()
session.sparkContext.parallelize([1, 2], 2).map(lambda x: x).collect()
done = time.perf_counter()
print(json.dumps({"session": started - start, "first_job": done - started, "total": done - start}))
"""

CHECKOUT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def _start(cache: str) -> dict:
    env = dict(os.environ, BEAM_EXT_JVM_CACHE=cache, PYSPARK_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join([CHECKOUT, os.environ.get("PYTHONPATH", "")]))
    # From a scratch directory: Spark's Python workers put their working directory first on sys.path.
    done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True,
                          cwd=tempfile.gettempdir(), timeout=300)
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(CHECKOUT, "docs", "benchmarks"))
    args = parser.parse_args(argv)
    cache = tempfile.mkdtemp(prefix="beam_ext_jvm_")
    _start(cache)  # writes the archive as the JVM exits
    time.sleep(25)  # a candidate is checked once it is 20 s old
    _start(cache)  # checks it and renames it into place
    if not any(name.endswith(".jsa") for name in os.listdir(cache)):
        raise RuntimeError(f"no class archive in {cache}: {os.listdir(cache)}")
    rows: dict[str, list[dict]] = {"without the archive": [], "with the archive": []}
    for run in range(args.runs):
        for label, setting in (("without the archive", "off"), ("with the archive", cache)):
            rows[label].append(_start(setting))
            print(f"run {run + 1}/{args.runs} {label}: {rows[label][-1]['total']:.2f} s", flush=True)
    lines = ["# Spark start-up, with and without the driver JVM's class archive", "",
             f"Reproduce: `python benchmarks/spark_startup.py --runs {args.runs}`", "",
             f"Machine: {os.cpu_count()} cores. A fresh process per run calls SparkRunner's "
             "`get_or_create_session` (local[2]) and runs one tiny Python job; the two settings alternate. "
             f"Median of {args.runs} runs each.", "",
             "| driver JVM | session start s | first Python job s | total s |", "|---|---:|---:|---:|"]
    medians = {}
    for label, results in rows.items():
        med = {k: statistics.median(r[k] for r in results) for k in ("session", "first_job", "total")}
        medians[label] = med
        lines.append(f"| {label} | {med['session']:.2f} | {med['first_job']:.2f} | {med['total']:.2f} |")
        print(f"{label}: session {med['session']:.2f} s, first job {med['first_job']:.2f} s, "
              f"total {med['total']:.2f} s")
    shutil.rmtree(cache, ignore_errors=True)  # the archive: about 110 MB
    saved = medians["without the archive"]["session"] - medians["with the archive"]["session"]
    lines += ["", f"The archive saves {saved:.2f} s of session start-up. The first Python job includes "
              "starting the Python workers, which the archive does not change.", ""]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "spark_startup.md"), "w") as f:
        f.write("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
