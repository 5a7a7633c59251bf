"""Where a SparkRunner pipeline spends its time: Spark jobs and stages, and a
profile of the Python workers split by what the code does.

Each pipeline runs once to warm the session, then once measured with
``spark.python.profile`` on (cProfile in every Python worker, merged per
RDD). The worker profile's exclusive time is grouped into categories: Beam's
per-element operations (Cython, counted in ``process_encoded``), DoFn
bodies, element encode/decode, bundle-processor set-up, SDF read machinery,
beam_ext's shuffle packing and grouping, PySpark's transfer to and from the
JVM, and built-ins. Spark's REST API gives each Spark job's and stage's
time. cProfile slows Python code down, so the shares matter, not the
seconds; the wall time without the profiler is printed beside, split into
the driver's phases: building the pipeline (Beam's ``apply``), Beam's
encoding of it (``to_runner_api``), planning, the Spark jobs, and the rest.

    python benchmarks/runner_profile.py            # writes docs/benchmarks/runner_profile.md
    python benchmarks/runner_profile.py --quick    # smoke run
    python benchmarks/runner_profile.py --only SlidingAggregate --top 30   # one pipeline, its costliest functions
    python benchmarks/runner_profile.py --only sessions --elements 10000000  # a throughput pipeline at 10M
    python benchmarks/runner_profile.py --common tagged,partition --top 20  # pipelines of runner_common.py
    python benchmarks/runner_profile.py --common cogbk --streaming --top 20  # the same, in streaming mode
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import glob
import json
import os
import pstats
import shutil
import sys
import tempfile
import time
import urllib.request

import apache_beam as beam

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

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
from sliding import MINUTE, build_sliding, make_data, write_parquet  # noqa: E402

# (category, tests on "file:function"); first match wins, in this order.
# PySpark's profiler keeps only the base name of each file.
# A Python worker reading its input from the JVM waits in BufferedReader.read
# while another Python worker of the same task (before a union, say) computes it.
_CATEGORIES: list[tuple[str, tuple[str, ...]]] = [
    ("waiting (locks, sockets: idle, or blocked on the JVM or another thread)",
     ("~:<method 'acquire' of '_thread", "~:<method 'recv", "~:<method 'readinto",
      "~:<method 'read' of '_io.BufferedReader'",
      "~:<built-in method select", "~:<method 'poll'", "~:<built-in method time.sleep",
      "threading.py:wait", "socket.py:readinto")),
    # Before the reads below: "parquetio.py:" would also match beam_ext's _parquetio.py.
    ("beam_ext native IO (Parquet read and write, file shards, Create) and element-object stages",
     ("_parquetio.py:", "_arrow_rows.py:", "_file_sink.py:", "_create.py:", "_direct.py:", "_projection.py:",
      "_plain_accumulators.py:", "_schema_group_by.py:", "_element_batches.py:")),
    ("file read (Beam's textio and parquetio SDF machinery, or the native text reader)",
     # "textio.py:" also matches the native reader, beam_ext's _textio.py.
     ("textio.py:", "iobase.py:", "sdf_utils.py:", "range_trackers.py:", "restriction_trackers.py:",
      "filebasedsource.py:", "filesystem.py:", "filesystems.py:", "localfilesystem.py:",
      "concat_source.py:", "parquetio.py:")),
    ("bundle-processor set-up (per task)",
     ("inspect.py:", "userstate.py:", "decorators.py:", "typehints.py:", "pickler.py:",
      "dill_pickler.py:", "cloudpickle_pickler.py:", "cloudpickle.py:", "pickle.py:", "dill",
      "bundle_processor.py:__init__", "bundle_processor.py:create_operation",
      "bundle_processor.py:topological_height", "sdk_worker.py:", "statecache.py:",
      "worker_handlers.py:", "data_plane.py:", "operation_specs.py:", "enum.py:", "copyreg.py:",
      "~:<built-in method _pickle.loads>", "~:<built-in method marshal.loads>",
      "monitoring_infos.py:", "metricbase.py:", "execution.py:", "~:<built-in method builtins.__build_class__>")),
    ("Beam per-element operations (operations, DoFn invocation, windowing)",
     ("bundle_processor.py:", "common.py:", "operations.py:", "core.py:", "combiners.py:", "window.py:",
      "windowed_value.py:", "timestamp.py:", "trigger.py:", "sideinputs.py:", "combinefn_lifecycle.py:",
      "util.py:", "cells.py:")),
    ("element encode/decode (Beam coders)", ("coder_impl.py:", "coders.py:", "row_coder.py:")),
    ("beam_ext task loop, shuffle packing and grouping",
     ("_shuffle.py:", "_task.py:", "_batch.py:", "_key_hash.py:", "_memory.py:", "_side_inputs.py:",
      "_group_spill.py:")),
    ("beam_ext transforms (native stages)", ("_sliding.py:", "_vectorised.py:", "_plan.py:", "numeric.py:",
                                             "fromnumeric.py:", "_columnar.py:", "_exact.py:", "_fields.py:")),
    ("PySpark transfer to/from the JVM (serializers, worker loop)",
     ("serializers.py:", "worker.py:", "rdd.py:", "shuffle.py:", "daemon.py:", "accumulators.py:",
      "profiler.py:", "worker_util.py:")),
    ("user code (the pipeline's functions)", ("runner_throughput.py:", "payments_features.py:",
                                              "runner_profile.py:", "sliding.py:")),
    (_BUILTINS := "built-ins (str.split, list and dict operations, ...)", ("~:",)),
]

# The temporary directory the process started with: runner_common.scratch() moves tempfile's while inside.
_SYSTEM_TEMP = tempfile.gettempdir()


def _category(filename: str, func: str) -> str:
    where = f"{filename}:{func}"
    for name, tests in _CATEGORIES:
        if any(t in where for t in tests):
            return name
    return "other"


def worker_profile(profile_dir: str, top: int = 0) -> tuple[dict[str, float], list[tuple[str, float]]]:
    """Exclusive seconds per category, summed over every worker profile, and
    the largest entries among built-ins and "other" (among all entries: the
    ``top`` largest, if given)."""
    totals: dict[str, float] = {}
    other: dict[str, float] = {}
    for path in glob.glob(os.path.join(profile_dir, "*.pstats")):
        stats = pstats.Stats(path).stats  # type: ignore[attr-defined]
        for (filename, line, func), (_, _, tottime, _, _) in stats.items():
            category = _category(filename, func)
            totals[category] = totals.get(category, 0.0) + tottime
            if top or category in ("other", _BUILTINS):
                where = f"{os.path.basename(filename)}:{line}({func})"
                other[where] = other.get(where, 0.0) + tottime
    return totals, sorted(other.items(), key=lambda kv: -kv[1])[:top or 6]


def spark_jobs(ui: str, since: int) -> list[dict]:
    """Spark jobs after job id ``since``, with their stages' task-time metrics."""
    def get(path: str):
        with urllib.request.urlopen(f"{ui}/api/v1/{path}", timeout=30) as r:
            return json.load(r)
    app = get("applications")[0]["id"]
    stages = {s["stageId"]: s for s in get(f"applications/{app}/stages")}
    jobs = []
    for job in sorted(get(f"applications/{app}/jobs"), key=lambda j: j["jobId"]):
        if job["jobId"] <= since:
            continue
        parts = [stages[i] for i in job["stageIds"] if i in stages and stages[i]["status"] == "COMPLETE"]
        jobs.append(dict(
            id=job["jobId"], description=job.get("description") or job["name"],
            seconds=wall_seconds(job), tasks=sum(s["numCompleteTasks"] for s in parts),
            run=sum(s["executorRunTime"] for s in parts) / 1e3,
            deserialize=sum(s["executorDeserializeTime"] for s in parts) / 1e3,
            shuffle_write_mb=sum(s["shuffleWriteBytes"] for s in parts) / 1e6,
            shuffle_write_s=sum(s["shuffleWriteTime"] for s in parts) / 1e9,
            shuffle_read_mb=sum(s["shuffleReadBytes"] for s in parts) / 1e6,
            stages=len(parts)))
    return jobs


def wall_seconds(job: dict) -> float:
    """A Spark job's or stage's wall time, from the REST API's submission and completion times."""
    from datetime import datetime

    fmt = "%Y-%m-%dT%H:%M:%S.%f%Z"
    start = datetime.strptime(job["submissionTime"].replace("GMT", "UTC"), fmt)
    end = datetime.strptime(job["completionTime"].replace("GMT", "UTC"), fmt)
    return (end - start).total_seconds()


def _last_job(sc) -> int:
    ids = sc.statusTracker().getJobIdsForGroup()
    return max(ids) if ids else -1


def profile(name: str, build, spark, out: dict, top: int = 0, streaming: bool = False) -> None:
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_ext.runner import SparkRunner

    sc = spark.sparkContext

    def run() -> float:
        start = time.perf_counter()
        with beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(["--streaming"] * streaming)) as p:
            build(p)
        return time.perf_counter() - start

    run()  # warm: Python workers started, Beam imported in them
    sc.profiler_collector.profilers = []  # only the measured run's profiles
    before = _last_job(sc)
    wall = run()
    jobs = spark_jobs(sc.uiWebUrl, before)
    profile_dir = tempfile.mkdtemp(prefix="beam_ext_profile_")
    try:
        sc.dump_profiles(profile_dir)
        categories, other = worker_profile(profile_dir, top)
    finally:
        shutil.rmtree(profile_dir, ignore_errors=True)
    out[name] = dict(wall=wall, jobs=jobs, categories=categories, other=other)
    total = sum(categories.values())
    print(f"\n== {name}: {wall:.2f} s with the profiler, {len(jobs)} Spark jobs", flush=True)
    for job in jobs:
        print(f"  job {job['id']}: {job['seconds']:.2f} s, {job['stages']} stages, {job['tasks']} tasks, "
              f"task run {job['run']:.2f} s, shuffle write {job['shuffle_write_mb']:.1f} MB "
              f"- {job['description'][:80]}", flush=True)
    for category, seconds in sorted(categories.items(), key=lambda kv: -kv[1]):
        print(f"  {100 * seconds / total:5.1f}%  {seconds:7.2f} s  {category}", flush=True)
    if top:
        for where, seconds in other:
            print(f"  {seconds:7.2f} s  {where}", flush=True)


def unprofiled_walls(quick: bool, only: str | None = None, elements: int | None = None) -> dict[str, dict]:
    """Median wall of 3 runs of each pipeline on a session without the profiler, in a
    subprocess, and the driver's phases of that run (see :func:`_walls`)."""
    import subprocess

    code = f"import json, runner_profile as rp; print(json.dumps(rp._walls({quick!r}, {only!r}, {elements!r})))"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          cwd=tempfile.gettempdir())
    if done.returncode:
        print(done.stderr[-3000:], file=sys.stderr)
        return {}
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cases(quick: bool, tmp: str, elements: int | None = None) -> list[tuple[str, object]]:
    import payments_features

    words = os.path.join(tmp, "words.txt")
    n = elements or (20_000 if quick else 2_000_000)
    make_text(words, n)
    pairs = n
    payments = payments_features.generate_payments(500 if quick else 5_000)
    out_dir = os.path.join(tmp, "features")
    events = 20_000 if quick else 1_000_000
    events_path = os.path.join(tmp, "events.parquet")
    write_parquet(make_data(events, 100), events_path)
    sliding_out = os.path.join(tmp, "sliding")
    return [
        (f"wordcount, {n:,} words", lambda p: beam_wordcount(p, words)),
        (f"GroupByKey, {pairs:,} pairs, {pairs // 2:,} keys", lambda p: beam_gbk(p, pairs, pairs // 2)),
        (f"CombinePerKey, {pairs:,} pairs, 1,000 keys", lambda p: beam_combine(p, pairs, 1_000)),
        (f"CombinePerKey, {pairs:,} pairs, {pairs // 2:,} keys", lambda p: beam_combine(p, pairs, pairs // 2)),
        (f"CoGroupByKey, {pairs:,} pairs with a 1,000-entry table", lambda p: beam_cogbk(p, pairs, 1_000)),
        (f"per-key mean with a side-input dict, {n:,} words", lambda p: beam_side_mean(p, words)),
        (f"side-input join, {n:,} numbers, 10,000-entry dict", lambda p: beam_side_join(p, n, 10_000)),
        (f"CombinePerKey in 1-minute windows, {pairs:,} pairs, 1,000 keys", lambda p: beam_windowed(p, pairs, 1_000)),
        (f"CombinePerKey in sessions (1-minute gap), {pairs:,} pairs, 1,000 keys",
         lambda p: beam_sessions(p, pairs, 1_000)),
        (f"schema rows, GroupBy(field).aggregate_field, {pairs:,} rows, 1,000 keys",
         lambda p: beam_rows(p, pairs, 1_000)),
        (f"schema rows, GroupBy(field), {pairs:,} rows, 1,000 keys",
         lambda p: beam_rows_grouped(p, pairs, 1_000)),
        (f"demo pipeline, {len(payments):,} payments",
         lambda p: payments_features.build(p, payments, out_dir)),
        (f"ReadFromParquet -> SlidingAggregate (1 minute) -> WriteToParquet, {events:,} events",
         lambda p: build_sliding(p, events_path, MINUTE, sliding_out)),
    ]


def _session(profile_workers: bool):
    from spark_settings import local_session
    if not profile_workers:
        return local_session("runner-profile", None)
    # A dump directory keeps PySpark from printing every profile at exit.
    # Outside any scratch directory (runner_common.scratch): PySpark writes it at exit.
    dump = tempfile.mkdtemp(prefix="beam_ext_profile_", dir=_SYSTEM_TEMP)
    # Registered before the session, so it runs after PySpark's own dump at exit.
    atexit.register(shutil.rmtree, dump, True)
    return local_session("runner-profile", {"spark.python.profile": "true", "spark.python.profile.dump": dump})


@contextlib.contextmanager
def _timed_calls(targets: list[tuple[object, str, str]]):
    """Seconds spent in each ``(owner, attribute, label)`` callable while inside, by label."""
    spent: dict[str, float] = {}
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in targets]

    def timed(call, label):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - start
        return run

    for (owner, attr, call), (_, _, label) in zip(saved, targets):
        setattr(owner, attr, timed(call, label))
    try:
        yield spent
    finally:
        for owner, attr, call in saved:
            setattr(owner, attr, call)


#: The driver's phases of a run, in order; "rest" is what the others leave of the wall.
PHASES = ("build (Beam's apply)", "Beam's encoding (to_runner_api)", "planning", "Spark jobs", "rest")


def _timed_run(build, spark, streaming: bool = False) -> tuple[float, dict[str, float]]:
    """One run's wall and its phases (:data:`PHASES`)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    from beam_ext.runner import SparkRunner, spark_runner

    sc = spark.sparkContext
    before = _last_job(sc)
    with _timed_calls([(beam.Pipeline, "to_runner_api", PHASES[1]),
                       (spark_runner, "plan_pipeline", PHASES[2])]) as spent:
        start = time.perf_counter()
        p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(["--streaming"] * streaming))
        build(p)
        built = time.perf_counter()
        p.run().wait_until_finish()
        wall = time.perf_counter() - start
    phases = {PHASES[0]: built - start, PHASES[1]: spent.get(PHASES[1], 0.0), PHASES[2]: spent.get(PHASES[2], 0.0),
              PHASES[3]: sum(job["seconds"] for job in spark_jobs(sc.uiWebUrl, before))}
    phases[PHASES[4]] = wall - sum(phases.values())
    return wall, phases


def _walls(quick: bool, only: str | None = None, elements: int | None = None) -> dict[str, dict]:
    spark = _session(False)
    tmp = tempfile.mkdtemp(prefix="beam_ext_profile_")
    walls = {}
    try:
        for name, build in _cases(quick, tmp, elements):
            if only is not None and only not in name:
                continue
            runs = [_timed_run(build, spark) for _ in range(4)][1:]  # the first warms the session
            wall, phases = sorted(runs, key=lambda run: run[0])[1]  # the median run
            walls[name] = dict(wall=wall, phases=phases)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        spark.stop()
    return walls


def _phases_line(measured: dict | None) -> str:
    if not measured:
        return "Wall without the profiler: not measured."
    return (f"Wall without the profiler: {measured['wall']:.2f} s, of which " + ", ".join(
        f"{label} {measured['phases'][label]:.2f} s" for label in PHASES) + ".")


def write_report(results: dict, walls: dict[str, dict], out_dir: str, quick: bool) -> None:
    lines = [
        "# Where SparkRunner's time goes",
        "",
        "Reproduce: `python benchmarks/runner_profile.py`" + (" --quick (smoke run)" if quick else ""),
        "",
        "Machine: 2 cores, Spark local[2], a warm session (Python workers started and Beam imported in "
        "them by a first run). Each pipeline then runs once with `spark.python.profile=true`: cProfile in "
        "every Python worker, merged. Spark's REST API gives the Spark jobs. The profiler slows Python "
        "code, so read the shares; \"wall\" is the median of 3 runs without it, in another process.",
        "",
    ]
    for name, r in results.items():
        total = sum(r["categories"].values()) or 1.0
        lines += [f"## {name}", "",
                  f"{_phases_line(walls.get(name))} With the profiler: {r['wall']:.2f} s. "
                  f"Spark jobs: {len(r['jobs'])}.", "",
                  "| Spark job | seconds | Spark stages | tasks | task run s | task deserialize s | "
                  "shuffle write MB | shuffle write s |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for j in r["jobs"]:
            lines.append(f"| {j['description'][:70]} | {j['seconds']:.2f} | {j['stages']} | {j['tasks']} | "
                         f"{j['run']:.2f} | {j['deserialize']:.2f} | {j['shuffle_write_mb']:.1f} | "
                         f"{j['shuffle_write_s']:.2f} |")
        lines += ["", "| Python worker time, by what the code does | share | profiled s |", "|---|---:|---:|"]
        for category, seconds in sorted(r["categories"].items(), key=lambda kv: -kv[1]):
            lines.append(f"| {category} | {100 * seconds / total:.1f}% | {seconds:.2f} |")
        if r["other"]:
            lines += ["", "Largest built-in and uncategorised entries: " + ", ".join(
                f"`{where}` {seconds:.2f} s" for where, seconds in r["other"])]
        lines.append("")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "runner_profile.md"), "w") as f:
        f.write("\n".join(lines))
    with open(os.path.join(out_dir, "runner_profile.json"), "w") as f:
        json.dump(dict(results=results, walls=walls), f, indent=1)


def profile_common(names: list[str], size: int, top: int, streaming: bool = False) -> None:
    """Profiles pipelines of ``runner_common.py`` by name, each over ``size`` numbers."""
    import runner_common

    # Its DoFns are pickled by reference to the module: the workers import it too.
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))
    with runner_common.scratch("beam_ext_profile_common_"):
        # The driver's phases first, on a session without the workers' profiler.
        spark = _session(False)
        walls = {}
        try:
            for name in names:
                _, build = runner_common.CASES[name]
                runs = [_timed_run(lambda p, build=build: build(p, size), spark, streaming) for _ in range(4)][1:]
                wall, phases = sorted(runs, key=lambda run: run[0])[1]  # the median of three warm runs
                walls[name] = dict(wall=wall, phases=phases)
        finally:
            spark.stop()
        spark = _session(True)
        try:
            for name in names:
                _, build = runner_common.CASES[name]
                profile(name, lambda p, build=build: build(p, size), spark, {}, top, streaming)
                print("  " + _phases_line(walls[name]))
        finally:
            spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "docs", "benchmarks"))
    parser.add_argument("--only", help="profile only the pipelines whose name contains this; writes no report")
    parser.add_argument("--top", type=int, default=0, help="with --only: print the N costliest functions")
    parser.add_argument("--common", help="profile these pipelines of runner_common.py (comma-separated, "
                                         "over --size numbers) instead; writes no report")
    parser.add_argument("--size", type=int, default=1_000_000, help="with --common: numbers per pipeline")
    parser.add_argument("--streaming", action="store_true", help="with --common: run them in streaming mode")
    parser.add_argument("--elements", type=int, default=None,
                        help="elements of each throughput pipeline (default 2,000,000; 20,000 with --quick)")
    args = parser.parse_args()
    if args.common:
        profile_common(args.common.split(","), args.size, args.top, args.streaming)
        return
    walls = unprofiled_walls(args.quick, args.only, args.elements)
    spark = _session(True)
    tmp = tempfile.mkdtemp(prefix="beam_ext_profile_")
    results: dict = {}
    try:
        for name, build in _cases(args.quick, tmp, args.elements):
            if args.only is None or args.only in name:
                profile(name, build, spark, results, args.top if args.only else 0)
                print(f"  {_phases_line(walls.get(name))}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        spark.stop()
    if args.only is None:
        write_report(results, walls, args.out, args.quick)


if __name__ == "__main__":
    main()
