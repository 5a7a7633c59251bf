"""Spark start-up as SparkRunner does it: with and without the driver JVM's
class archive, with and without a warm Python worker daemon, or with and
without Spark SQL's ``SparkSession`` on top of the ``SparkContext``.

Each run is a fresh Python process that calls the runner's
``get_or_create_context`` (local[2]) and runs one tiny Python job, timed
from before the call to the job's end; the settings compared alternate.

- ``--compare archive`` (the default): ``BEAM_EXT_JVM_CACHE=off`` against a
  cache directory whose archive the first (untimed) start wrote. Writes
  ``docs/benchmarks/spark_startup.md``.
- ``--compare daemon``: the runner's session as it starts (a warm daemon
  that imports Beam and the runner while the JVM starts), against its
  daemon module before that (``beam_ext.runner.worker._daemon``, which
  imports them when Spark launches it), and PySpark's own daemon (imports
  nothing; secondary: tasks then import the runner's code themselves).
  Writes ``docs/benchmarks/spark_startup_daemon.md`` and its plot.
- ``--compare context``: the runner's bare ``SparkContext`` against the
  same context with a ``SparkSession`` built on it at once, as the runner
  started Spark before 2026-11-28 (``SparkSession.builder.getOrCreate()``).
  Writes ``docs/benchmarks/spark_startup_context.md`` and its plot.

    python benchmarks/spark_startup.py [--runs 5] [--compare daemon|context]
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
from beam_ext.runner.session import get_or_create_context
from pyspark.sql import SparkSession
parts = {"sql_session": 0.0, "sql_session_jvm_cpu": 0.0}
def jvm_cpu(context):  # the driver JVM's CPU seconds so far, from /proc
    fields = open(f"/proc/{context._gateway.proc.pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
build_sql_session = SparkSession.__init__
def timed_sql_session(self, context, *args, **kwargs):  # the JVM's SparkSession, after its SparkContext
    began, began_cpu = time.perf_counter(), jvm_cpu(context)
    build_sql_session(self, context, *args, **kwargs)
    parts.update(sql_session=time.perf_counter() - began, sql_session_jvm_cpu=jvm_cpu(context) - began_cpu)
SparkSession.__init__ = timed_sql_session
options = PipelineOptions(["--spark_master=local[2]", "--spark_conf=spark.ui.showConsoleProgress=false",
                           *[f"--spark_conf={kv}" for kv in sys.argv[1:]]])
context = get_or_create_context(options.view_as(SparkRunnerOptions), "startup")
if os.environ.get("BEAM_EXT_BENCH_SQL_SESSION"):
    SparkSession.builder.getOrCreate()
started = time.perf_counter()
context.parallelize([1, 2], 2).map(lambda x: x).collect()
done = time.perf_counter()
print(json.dumps({"session": started - start, "first_job": done - started, "total": done - start,
                  "jvm_cpu": jvm_cpu(context), **parts}))
"""

CHECKOUT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def _start(cache: str | None, *conf: str, sql_session: bool = False) -> dict:
    """One fresh start; ``cache``: ``BEAM_EXT_JVM_CACHE`` (None: as the user has it);
    ``sql_session``: build a SparkSession on the context before the job."""
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable,
               PYTHONPATH=os.pathsep.join([CHECKOUT, os.environ.get("PYTHONPATH", "")]))
    if cache is not None:
        env["BEAM_EXT_JVM_CACHE"] = cache
    if sql_session:
        env["BEAM_EXT_BENCH_SQL_SESSION"] = "1"
    # From a scratch directory: Spark's Python workers put their working directory first on sys.path.
    done = subprocess.run([sys.executable, "-c", _CHILD, *conf], env=env, capture_output=True, text=True,
                          cwd=tempfile.gettempdir(), timeout=300)
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(CHECKOUT, "docs", "benchmarks"))
    parser.add_argument("--compare", choices=("archive", "daemon", "context"), default="archive")
    args = parser.parse_args(argv)
    if args.compare == "daemon":
        return _compare_daemons(args.runs, args.out)
    if args.compare == "context":
        return _compare_contexts(args.runs, args.out)
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
             "`get_or_create_context` (local[2]) and runs one tiny Python job; the two settings alternate. "
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


def _alternated(settings: dict[str, tuple[tuple[str, ...], bool]],
                runs: int) -> tuple[dict[str, list[dict]], dict[str, dict]]:
    """``runs`` fresh starts of each setting (label -> ``(--spark_conf entries,
    sql_session)``), the settings alternating: each one's runs, and their medians."""
    _start(None)  # the class archive is in place, as after any first start
    rows: dict[str, list[dict]] = {label: [] for label in settings}
    for run in range(runs):
        for label, (conf, sql_session) in settings.items():
            rows[label].append(_start(None, *conf, sql_session=sql_session))
            print(f"run {run + 1}/{runs} {label}: start {rows[label][-1]['session']:.2f} s, "
                  f"first job {rows[label][-1]['first_job']:.2f} s", flush=True)
    medians = {label: {k: statistics.median(r[k] for r in results)
                       for k in ("session", "first_job", "total", "jvm_cpu", "sql_session",
                                 "sql_session_jvm_cpu")}
               for label, results in rows.items()}
    return rows, medians


def _write_report(name: str, lines: list[str], cells, rows: dict[str, list[dict]], medians: dict[str, dict],
                  base: str, trailer: list[str], out: str) -> None:
    """``docs/benchmarks/<name>.md`` and its plot: ``lines`` (title to table
    header), a row per setting (``cells(median)``: its middle columns; the
    ratio to ``base``'s total, the JVM's CPU and every run follow), ``trailer``."""
    base_total = medians[base]["total"]
    for label, med in medians.items():
        each = ", ".join(f"{r['total']:.2f}" for r in rows[label])
        lines.append(f"| {label} | {cells(med)} | {base_total / med['total']:.2f}x | {med['jvm_cpu']:.2f} | {each} |")
        print(f"{label}: start {med['session']:.2f} s, first job {med['first_job']:.2f} s, "
              f"total {med['total']:.2f} s ({base_total / med['total']:.2f}x)")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.md"), "w") as f:
        f.write("\n".join(lines + ["", *trailer, "", f"![start-up]({name}.png)", ""]))
    _plot(medians, os.path.join(out, f"{name}.png"))


# Label -> the daemon module a session runs, as --spark_conf entries.
_DAEMONS = {
    "warm daemon (SparkRunner's session)": ((), False),
    "runner's daemon, imports when Spark launches it": (
        ("spark.python.daemon.module=beam_ext.runner.worker._daemon",), False),
    "PySpark's daemon (secondary)": (("spark.python.daemon.module=pyspark.daemon",), False),
}


def _compare_daemons(runs: int, out: str) -> int:
    rows, medians = _alternated(_DAEMONS, runs)
    lines = ["# Spark start-up: the Python worker daemon, warm or not", "",
             f"Reproduce: `python benchmarks/spark_startup.py --compare daemon --runs {runs}`", "",
             f"Machine: {os.cpu_count()} cores. A fresh process per run calls SparkRunner's "
             "`get_or_create_context` (local[2]) and runs one tiny Python job; the three settings "
             f"alternate. Median of {runs} runs each; every run in the last column.", "",
             "| daemon | session start s | first Python job s | total s | vs the runner's daemon "
             "| driver JVM's CPU s | runs (total s) |",
             "|---|---:|---:|---:|---:|---:|---|"]
    _write_report("spark_startup_daemon", lines,
                  lambda med: f"{med['session']:.2f} | {med['first_job']:.2f} | {med['total']:.2f}",
                  rows, medians, "runner's daemon, imports when Spark launches it",
                  ["The warm daemon imports while the JVM starts, so the session's start takes "
                   "longer on 2 cores (both are busy: the JVM alone uses more than a core's worth of CPU "
                   "by the end of the first job) and the first job finds the imports done. PySpark's "
                   "own daemon imports nothing: its first job is quick, and each task then imports the "
                   "runner's code itself on its first task."], out)
    return 0


_CONTEXTS = {
    "SparkContext alone (SparkRunner's start)": ((), False),
    "SparkContext, then a SparkSession on it (before)": ((), True),
}


def _compare_contexts(runs: int, out: str) -> int:
    rows, medians = _alternated(_CONTEXTS, runs)
    lines = ["# Spark start-up: a bare SparkContext, or a SparkSession on it", "",
             f"Reproduce: `python benchmarks/spark_startup.py --compare context --runs {runs}`", "",
             f"Machine: {os.cpu_count()} cores. A fresh process per run calls SparkRunner's "
             "`get_or_create_context` (local[2], warm daemon) and runs one tiny Python job; in the second "
             "row it builds a `SparkSession` on the context first, as the runner's start did before "
             f"2026-11-28. The two alternate. Median of {runs} runs each; every run in the last column.", "",
             "| start | Spark start s | of which the SparkSession s (the JVM's CPU s) | first Python job s "
             "| total s | vs before | driver JVM's CPU s | runs (total s) |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    _write_report("spark_startup_context", lines,
                  lambda med: (f"{med['session']:.2f} | {med['sql_session']:.2f} ({med['sql_session_jvm_cpu']:.2f}) "
                               f"| {med['first_job']:.2f} | {med['total']:.2f}"),
                  rows, medians, "SparkContext, then a SparkSession on it (before)",
                  ["SparkRunner runs its stages as RDD jobs and needs only the `SparkContext`. The "
                   "`SparkSession`, Spark SQL's entry point, is still built on the runner's context by a "
                   "user's own `SparkSession.builder.getOrCreate()` when wanted."], out)
    return 0


def _plot(medians: dict[str, dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(medians)
    session = [medians[label]["session"] for label in labels]
    first_job = [medians[label]["first_job"] for label in labels]
    fig, ax = plt.subplots(figsize=(8, 3.4))
    ax.barh(labels, session, label="session start")
    ax.barh(labels, first_job, left=session, label="first Python job")
    ax.set_xlabel("seconds (median)")
    ax.invert_yaxis()
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
