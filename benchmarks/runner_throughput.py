"""SparkRunner vs DirectRunner vs hand-written PySpark, same machine, same run.

Eight pipelines: wordcount over generated text, a per-key mean whose values
come from a side-input dict, CombinePerKey over generated pairs, GroupByKey
with many keys, a side-input join, CombinePerKey in one-minute fixed
windows and in sessions, and rows with a schema (``beam.Row``) summed by
Beam's schema-aware ``GroupBy``. Each runs on SparkRunner (local[2]),
on Beam's DirectRunner as users get it (``beam.runners.DirectRunner()``,
which for a batch pipeline hands over to the FnApiRunner, in-process) and as
the same logic written directly with PySpark RDDs. Spark session and Python
worker start-up are excluded by a warm-up run.

Three parts:

- the main table: every pipeline at ``--main-size`` elements (2M);
- a size sweep (``--sizes``) of wordcount and the side-input mean, plotted
  as elements/s against size;
- the demo row: ``examples/payments_features.py`` (what ``make demo`` runs)
  in a fresh process per runner, Spark start-up included.

Writes runner.md, runner.png and runner.json to ``--out``.

    python benchmarks/runner_throughput.py                 # full run (about an hour on 2 cores)
    python benchmarks/runner_throughput.py --quick --out /tmp/runner-bench   # smoke run
    python benchmarks/runner_throughput.py --pipelines wordcount --sizes 1M,2M --runs 3
"""
from __future__ import annotations

import argparse
import json
import operator
import os
import random
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

import apache_beam as beam
from apache_beam.transforms import window

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKOUT = os.path.dirname(HERE)
_WORDS = [f"w{i}" for i in range(5000)]
_WEIGHTS = {w: (i % 97) / 10 for i, w in enumerate(_WORDS)}
_SHARDS = 32
_SIDE_JOIN_DICT = 10_000
_COMBINE_KEYS = 1000
ENGINES = ("spark", "direct", "pyspark")
ENGINE_NAMES = {"spark": "SparkRunner", "direct": "DirectRunner", "pyspark": "PySpark RDD"}
# The targets for SparkRunner on a pipeline of at least TARGET_ELEMENTS elements.
TARGET_ELEMENTS = 2_000_000
TARGET_VS_PYSPARK = 1.0
TARGET_VS_DIRECT = 2.0


def make_text(path: str, words: int, seed: int = 7) -> int:
    """Writes ``words`` words (12 a line) from a 5,000-word vocabulary; returns the byte count."""
    rng = random.Random(seed)
    written = 0
    with open(path, "w") as f:
        left = words
        while left > 0:
            line = " ".join(rng.choices(_WORDS, k=min(12, left))) + "\n"
            f.write(line)
            written += len(line)
            left -= 12
    return written


def _pairs(n: int, keys: int):
    per = n // _SHARDS

    def gen(shard: int):
        start = shard * per
        return ((i % keys, 1) for i in range(start, start + per))
    return gen


# -- the pipelines, as Beam --------------------------------------------------
def beam_wordcount(p, path):
    return (p | beam.io.ReadFromText(path) | beam.FlatMap(str.split)
            | beam.combiners.Count.PerElement() | beam.combiners.Count.Globally())


def beam_side_mean(p, path):
    weights = p | "Weights" >> beam.Create(sorted(_WEIGHTS.items()))
    return (p | beam.io.ReadFromText(path) | beam.FlatMap(str.split)
            | beam.Map(lambda w, d: (w, d[w]), d=beam.pvalue.AsDict(weights))
            | beam.combiners.Mean.PerKey() | beam.combiners.Count.Globally())


def beam_combine(p, n, keys):
    return (p | beam.Create(range(_SHARDS)) | beam.Reshuffle()
            | beam.FlatMap(_pairs(n, keys)) | beam.CombinePerKey(sum)
            | beam.combiners.Count.Globally())


def _amounts(n: int):
    """Shard ``s``'s numbers: ``n`` in all, split evenly over the shards."""
    per = n // _SHARDS
    return lambda shard: range(shard * per, (shard + 1) * per)


def beam_rows(p, n, keys):
    """Rows with a schema (``beam.Row``, RowCoder) summed per key by Beam's
    schema-aware ``GroupBy``; the keys counted."""
    return (p | beam.Create(range(_SHARDS)) | beam.Reshuffle() | beam.FlatMap(_amounts(n))
            | beam.Map(lambda i: beam.Row(key=i % keys, amount=float(i)))
            | beam.GroupBy("key").aggregate_field("amount", sum, "total")
            | beam.combiners.Count.Globally())


def beam_rows_grouped(p, n, keys):
    """The same rows grouped whole by Beam's schema-aware ``GroupBy``; the groups counted."""
    return (p | beam.Create(range(_SHARDS)) | beam.Reshuffle() | beam.FlatMap(_amounts(n))
            | beam.Map(lambda i: beam.Row(key=i % keys, amount=float(i)))
            | beam.GroupBy("key") | beam.MapTuple(lambda key, rows: len(rows))
            | beam.combiners.Count.Globally())


def beam_gbk(p, n, keys):
    return (p | beam.Create(range(_SHARDS)) | beam.Reshuffle()
            | beam.FlatMap(_pairs(n, keys)) | beam.GroupByKey()
            | beam.MapTuple(lambda k, vs: len(vs)) | beam.CombineGlobally(sum))


def beam_side_join(p, n, side_size):
    side = p | "Side" >> beam.Create([(i, i * 2) for i in range(side_size)])
    return (p | beam.Create(range(_SHARDS)) | beam.Reshuffle()
            | beam.FlatMap(_amounts(n))
            | beam.Map(lambda x, d: d[x % side_size], d=beam.pvalue.AsDict(side))
            | beam.CombineGlobally(sum))


def beam_cogbk(p, n, keys):
    """``n`` keyed ones and a ``keys``-entry table of names joined by Beam's
    ``CoGroupByKey``; the keys counted."""
    numbers = p | "Shards" >> beam.Create(range(_SHARDS)) | beam.Reshuffle() | beam.FlatMap(_pairs(n, keys))
    names = p | "Names" >> beam.Create([(k, str(k)) for k in range(keys)])
    return ({"numbers": numbers, "names": names} | beam.CoGroupByKey()
            | beam.MapTuple(lambda k, g: (g["names"][0], len(g["numbers"]))) | beam.combiners.Count.Globally())


def _events(n: int, keys: int, seconds: Callable[[int], int], timestamped: bool):
    """Shard ``s``'s ``(key, value)`` pairs, the ``i``-th at ``seconds(i)``: Beam's
    ``TimestampedValue`` or, for PySpark, ``(key, value, seconds)``."""
    per = n // _SHARDS

    def gen(shard: int):
        start = shard * per
        if timestamped:
            return (window.TimestampedValue((i % keys, i), seconds(i)) for i in range(start, start + per))
        return ((i % keys, i, seconds(i)) for i in range(start, start + per))
    return gen


def _timed_pairs(n: int, keys: int, timestamped: bool):
    """One-second timestamps over a day."""
    return _events(n, keys, lambda i: i % 86_400, timestamped)


def _session_events(n: int, keys: int, timestamped: bool):
    """Each key's events 25 s apart in runs of 8, runs 5 minutes apart."""
    return _events(n, keys, lambda i: i // keys * 25 + i // keys // 8 * 300, timestamped)


def _windowed_sum(p, events, windowfn):
    """``events`` summed per key and window; the key-windows counted."""
    return (p | beam.Create(range(_SHARDS)) | beam.Reshuffle() | beam.FlatMap(events)
            | beam.WindowInto(windowfn) | beam.CombinePerKey(sum)
            | "Global" >> beam.WindowInto(window.GlobalWindows()) | beam.combiners.Count.Globally())


def beam_windowed(p, n, keys):
    """Numbers summed per key in one-minute fixed windows; the key-windows counted."""
    return _windowed_sum(p, _timed_pairs(n, keys, True), window.FixedWindows(60))


def beam_sessions(p, n, keys):
    """Numbers summed per key in sessions of a one-minute gap (8 events each); the sessions counted."""
    return _windowed_sum(p, _session_events(n, keys, True), window.Sessions(60))


# -- the same logic as hand-written PySpark ---------------------------------
def rdd_wordcount(sc, path):
    return (sc.textFile(path, 2 * sc.defaultParallelism).flatMap(str.split)
            .map(lambda w: (w, 1)).reduceByKey(operator.add).count())


def rdd_side_mean(sc, path):
    weights = sc.broadcast(_WEIGHTS)
    return (sc.textFile(path, 2 * sc.defaultParallelism).flatMap(str.split)
            .map(lambda w: (w, weights.value[w]))
            .aggregateByKey((0.0, 0), lambda acc, v: (acc[0] + v, acc[1] + 1),
                            lambda a, b: (a[0] + b[0], a[1] + b[1]))
            .mapValues(lambda acc: acc[0] / acc[1]).count())


def rdd_combine(sc, n, keys):
    return (sc.parallelize(range(_SHARDS), _SHARDS).flatMap(_pairs(n, keys))
            .reduceByKey(operator.add).count())


def rdd_rows(sc, n, keys):
    return (sc.parallelize(range(_SHARDS), _SHARDS).flatMap(_amounts(n))
            .map(lambda i: (i % keys, float(i))).reduceByKey(operator.add).count())


def rdd_rows_grouped(sc, n, keys):
    return (sc.parallelize(range(_SHARDS), _SHARDS).flatMap(_amounts(n))
            .map(lambda i: (i % keys, (i % keys, float(i)))).groupByKey().mapValues(len).count())


def rdd_cogbk(sc, n, keys):
    numbers = sc.parallelize(range(_SHARDS), _SHARDS).flatMap(_pairs(n, keys))
    names = sc.parallelize([(k, str(k)) for k in range(keys)], sc.defaultParallelism)
    return numbers.cogroup(names).map(lambda kv: (list(kv[1][1])[0], len(kv[1][0]))).count()


def rdd_gbk(sc, n, keys):
    return (sc.parallelize(range(_SHARDS), _SHARDS).flatMap(_pairs(n, keys))
            .groupByKey().mapValues(len).values().sum())


def rdd_windowed(sc, n, keys):
    return (sc.parallelize(range(_SHARDS), _SHARDS).flatMap(_timed_pairs(n, keys, False))
            .map(lambda e: ((e[0], e[2] - e[2] % 60), e[1])).reduceByKey(operator.add).count())


def _session_sums(events) -> list:
    """A key's ``(seconds, value)`` events summed per session of a one-minute gap, as Beam's
    ``Sessions(60)`` merges them: a new session where an event starts at or after the last one's end."""
    sums: list = []
    end = None
    for ts, value in sorted(events):
        if end is None or ts >= end:
            sums.append(0)
        sums[-1] += value
        end = ts + 60 if end is None or ts + 60 > end else end
    return sums


def rdd_sessions(sc, n, keys):
    return (sc.parallelize(range(_SHARDS), _SHARDS).flatMap(_session_events(n, keys, False))
            .map(lambda e: (e[0], (e[2], e[1]))).groupByKey().flatMap(lambda kv: _session_sums(kv[1])).count())


def rdd_side_join(sc, n, side_size):
    side = sc.broadcast({i: i * 2 for i in range(side_size)})
    return (sc.parallelize(range(_SHARDS), _SHARDS)
            .flatMap(_amounts(n))
            .map(lambda x: side.value[x % side_size]).sum())


# -- cases ----------------------------------------------------------------------
PIPELINES = ("wordcount", "side_mean", "combine", "combine_many_keys", "gbk", "cogbk", "side_join", "windowed",
             "sessions", "rows", "rows_grouped")
SWEPT = ("wordcount", "side_mean")


class _Texts:
    """Generated text files by word count, written once per run."""

    def __init__(self, directory: str):
        self.directory, self.paths = directory, {}

    def get(self, words: int) -> tuple[str, int]:
        if words not in self.paths:
            path = os.path.join(self.directory, f"words_{words}.txt")
            started = time.perf_counter()
            size = make_text(path, words)
            print(f"  generated {words:,} words ({size / 1e6:.1f} MB) in "
                  f"{time.perf_counter() - started:.1f} s", flush=True)
            self.paths[words] = (path, size)
        return self.paths[words]


# Pipelines of numbers over _COMBINE_KEYS keys: label, Beam build and PySpark
# job, the last two taking (pipeline or SparkContext, elements, keys).
_KEYED = {
    "combine": ("CombinePerKey", beam_combine, rdd_combine),
    "windowed": ("CombinePerKey in 1-minute windows", beam_windowed, rdd_windowed),
    "sessions": ("CombinePerKey in sessions, 1-minute gap", beam_sessions, rdd_sessions),
    "rows": ("schema rows, GroupBy(field).aggregate_field", beam_rows, rdd_rows),
    "rows_grouped": ("schema rows, GroupBy(field), groups counted", beam_rows_grouped, rdd_rows_grouped),
    "cogbk": ("CoGroupByKey with a table of names, keys counted", beam_cogbk, rdd_cogbk),
}


def case(name: str, n: int, texts: _Texts, sc) -> tuple[str, Callable, Callable]:
    """(label, Beam build, PySpark job) of pipeline ``name`` at ``n`` elements."""
    if name in ("wordcount", "side_mean"):
        path, size = texts.get(n)
        if name == "wordcount":
            return (f"wordcount ({size / 1e6:.1f} MB text)", lambda p: beam_wordcount(p, path),
                    lambda: rdd_wordcount(sc, path))
        return (f"per-key mean, side-input dict ({size / 1e6:.1f} MB text, 5k keys)",
                lambda p: beam_side_mean(p, path), lambda: rdd_side_mean(sc, path))
    if name in _KEYED:
        label, beam_build, rdd_job = _KEYED[name]
        return (f"{label} ({_COMBINE_KEYS:,} keys)", lambda p: beam_build(p, n, _COMBINE_KEYS),
                lambda: rdd_job(sc, n, _COMBINE_KEYS))
    if name in ("gbk", "combine_many_keys"):
        keys = max(1, n // 2)
        if name == "gbk":
            return (f"GroupByKey ({keys:,} keys)", lambda p: beam_gbk(p, n, keys), lambda: rdd_gbk(sc, n, keys))
        return (f"CombinePerKey ({keys:,} keys)", lambda p: beam_combine(p, n, keys),
                lambda: rdd_combine(sc, n, keys))
    if name == "side_join":
        return (f"side-input join ({_SIDE_JOIN_DICT:,}-entry dict)",
                lambda p: beam_side_join(p, n, _SIDE_JOIN_DICT),
                lambda: rdd_side_join(sc, n, _SIDE_JOIN_DICT))
    raise ValueError(f"unknown pipeline {name!r}; known: {', '.join(PIPELINES)}")


def _time(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _on(runner_factory: Callable[[], Any], build: Callable) -> None:
    with beam.Pipeline(runner=runner_factory()) as p:
        build(p)


def measure(name: str, n: int, runs: int, texts: _Texts, sc, max_direct: int) -> dict:
    """Median seconds of ``runs`` runs on each engine; DirectRunner skipped above ``max_direct``."""
    from beam_ext.runner import SparkRunner

    label, build, rdd = case(name, n, texts, sc)
    jobs = {"spark": lambda: _on(SparkRunner, build),
            "direct": lambda: _on(beam.runners.DirectRunner, build),
            "pyspark": rdd}
    seconds: dict[str, float | None] = {}
    for engine in ENGINES:
        if engine == "direct" and n > max_direct:
            seconds[engine] = None
            print(f"  {label} at {n:,}: DirectRunner skipped (--max-direct {max_direct:,})", flush=True)
            continue
        times = []
        for i in range(runs):
            times.append(_time(jobs[engine]))
            print(f"  {label} at {n:,}: {ENGINE_NAMES[engine]} run {i + 1}/{runs} "
                  f"{times[-1]:.2f} s", flush=True)
        seconds[engine] = statistics.median(times)
    row = dict(name=name, pipeline=label, elements=n, runs=runs, seconds=seconds,
               rate={e: (n / s if s else None) for e, s in seconds.items()})
    print(f"{label:55s} {n:>11,}  " + "  ".join(
        f"{ENGINE_NAMES[e]} {_rate(row['rate'][e])}" + ("/s" if row["rate"][e] else "") for e in ENGINES)
        + f"  vs Direct {_ratio(row, 'direct')}  vs PySpark {_ratio(row, 'pyspark')}", flush=True)
    return row


def _rate(x: float | None) -> str:
    return "skipped" if x is None else f"{x:,.0f}"


def _ratio(row: dict, other: str) -> str:
    r = ratio(row, other)
    return "n/a" if r is None else f"{r:.2f}x"


def ratio(row: dict, other: str) -> float | None:
    """SparkRunner's elements/s over ``other``'s, or None if one was not measured."""
    a, b = row["rate"]["spark"], row["rate"][other]
    return None if a is None or b is None else a / b


# -- the demo, in a fresh process per runner ------------------------------------
DEMO_RUNNERS = (("SparkRunner", []), ("DirectRunner", ["--runner", "DirectRunner"]),
                ("BundleBasedDirectRunner", ["--runner", "BundleBasedDirectRunner"]))


def demo_command(events: int, out: str, extra: list[str]) -> list[str]:
    return [sys.executable, os.path.join(CHECKOUT, "examples", "payments_features.py"),
            "--events", str(events), "--out", out, *extra]


def measure_demo(events: int, runs: int, timeout: float) -> list[dict]:
    """Wall time of ``examples/payments_features.py`` per runner: interpreter, imports,
    Spark start-up (on SparkRunner) and the pipeline, as ``make demo`` runs it."""
    env = dict(os.environ, PYTHONPATH=CHECKOUT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PYSPARK_PYTHON", None)  # as a user's shell has it: the example sets its own
    rows = []
    work = tempfile.mkdtemp(prefix="beam_ext_demo_")
    try:
        for runner, extra in DEMO_RUNNERS:
            walls, pipes, error = [], [], None
            for i in range(runs):
                cmd = demo_command(events, os.path.join(work, "out"), extra)
                started = time.perf_counter()
                try:
                    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True,
                                          timeout=timeout)
                except subprocess.TimeoutExpired:
                    error = f"not finished in {timeout:.0f} s"
                    break
                wall = time.perf_counter() - started
                took = re.search(r"pipeline took ([0-9.]+) s", proc.stdout)
                if proc.returncode != 0 or took is None:
                    error = f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-300:]}"
                    break
                walls.append(wall)
                pipes.append(float(took.group(1)))
                print(f"  demo on {runner} run {i + 1}/{runs}: {wall:.1f} s wall "
                      f"(pipeline {pipes[-1]:.1f} s)", flush=True)
            rows.append(dict(runner=runner, wall=statistics.median(walls) if walls and not error else None,
                             pipeline=statistics.median(pipes) if pipes and not error else None,
                             error=error, runs=runs,
                             command=shlex.join(["python", "examples/payments_features.py", "--events",
                                                 str(events), *extra])))
            if error:
                print(f"  demo on {runner}: {error}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


# -- the run ------------------------------------------------------------------------
def run(args) -> dict:
    from spark_settings import local_session

    from beam_ext.runner import SparkRunner

    results: dict = {"main": [], "sweep": [], "demo": [], "args": vars(args).copy()}
    tmp = tempfile.mkdtemp(prefix="beam_ext_bench_")
    spark = local_session("runner-benchmark")
    sc = spark.sparkContext
    texts = _Texts(tmp)
    try:
        # Warm-up: start the Python workers and import Beam in them, on every engine.
        _, build, rdd = case("side_mean", 1200, texts, sc)
        _on(SparkRunner, build)
        _on(beam.runners.DirectRunner, build)
        rdd()
        rdd_combine(sc, 1000, 10)

        measured: dict[tuple[str, int], dict] = {}

        def get(name: str, n: int) -> dict:
            if (name, n) not in measured:
                runs = args.runs or (3 if n <= 100_000 else 1)
                measured[name, n] = measure(name, n, runs, texts, sc, args.max_direct)
                _save(results, args.out)
            return measured[name, n]

        print(f"== main table at {args.main_size:,} elements", flush=True)
        for name in args.pipelines:
            results["main"].append(get(name, args.main_size))
        swept = [name for name in args.pipelines if name in SWEPT]
        if swept:
            print(f"== size sweep {', '.join(f'{s:,}' for s in args.sizes)}", flush=True)
        for name in swept:
            for n in args.sizes:
                results["sweep"].append(get(name, n))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        spark.stop()
    if args.demo_events:
        print(f"== demo, {args.demo_events:,} payments, fresh process per runner", flush=True)
        results["demo"] = measure_demo(args.demo_events, args.demo_runs, args.demo_timeout)
    return results


def _save(results: dict, out_dir: str) -> None:
    """Raw numbers so far: a long unattended run leaves what it measured even if it stops."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "runner.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)


# -- the report ---------------------------------------------------------------------
def _fmt_ratio(r: float | None) -> str:
    return "n/a" if r is None else f"{r:.2f}x"


def plot(results: dict, out_dir: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n in SWEPT if any(r["name"] == n for r in results["sweep"])]
    if not names:
        names_main = results["main"]
        fig, ax = plt.subplots(figsize=(9, 4.5))
        width = 0.27
        xs = range(len(names_main))
        for offset, engine in zip((-width, 0, width), ENGINES):
            ax.bar([x + offset for x in xs], [r["rate"][engine] or 0 for r in names_main], width,
                   label=ENGINE_NAMES[engine])
        ax.set_xticks(list(xs), [r["name"] for r in names_main])
        ax.set_ylabel("elements / s")
        ax.legend()
    else:
        fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 4.2), squeeze=False)
        for ax, name in zip(axes[0], names):
            rows = sorted((r for r in results["sweep"] if r["name"] == name), key=lambda r: r["elements"])
            for engine, style in zip(ENGINES, ("o-", "s--", "^:")):
                pts = [(r["elements"], r["rate"][engine]) for r in rows if r["rate"][engine]]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=ENGINE_NAMES[engine])
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("elements (words)")
            ax.set_ylabel("elements / s")
            ax.set_title(rows[0]["pipeline"].split(" (")[0])
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(f"Throughput against input size, 2-core machine, warm Spark session\n{results['command']}",
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "runner.png"), dpi=110)
    plt.close(fig)


def _table(rows: list[dict]) -> list[str]:
    lines = ["| pipeline | elements | runs | SparkRunner el/s | DirectRunner el/s | PySpark el/s | "
             "SparkRunner / DirectRunner | SparkRunner / PySpark |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['pipeline']} | {r['elements']:,} | {r['runs']} | {_rate(r['rate']['spark'])} | "
                     f"{_rate(r['rate']['direct'])} | {_rate(r['rate']['pyspark'])} | "
                     f"{_fmt_ratio(ratio(r, 'direct'))} | {_fmt_ratio(ratio(r, 'pyspark'))} |")
    return lines


def _verdict(value: float | None, target: float) -> str:
    if value is None:
        return "not measured"
    if value >= target:
        return f"{value:.2f}x, met"
    return f"{value:.2f}x, missed: SparkRunner needs {target / value:.2f}x its throughput"


def _fastest(row: dict) -> str:
    rates = {e: v for e, v in row["rate"].items() if v}
    best = max(rates, key=rates.get)
    others = [v for e, v in rates.items() if e != best]
    lead = f" by {rates[best] / max(others):.2f}x" if others else ""
    missing = [ENGINE_NAMES[e] for e in ENGINES if e not in rates]
    return f"{ENGINE_NAMES[best]}{lead}" + (f" ({', '.join(missing)} not run)" if missing else "")


def targets(results: dict) -> list[str]:
    """The 'Against the targets' section, computed from the numbers."""
    lines = ["## Against the targets", "",
             f"Targets: every pipeline of at least {TARGET_ELEMENTS:,} elements runs on SparkRunner at "
             f"{TARGET_VS_PYSPARK:.1f}x or more the throughput of the same logic in hand-written PySpark and "
             f"at {TARGET_VS_DIRECT:.0f}x or more that of DirectRunner; `make demo`'s pipeline runs faster on "
             "SparkRunner than on DirectRunner, Spark start-up included.", ""]
    rows = {(r["name"], r["elements"]): r for r in results["main"] + results["sweep"]}
    big = [r for _, r in sorted(rows.items()) if r["elements"] >= TARGET_ELEMENTS]
    if not big:
        lines.append(f"No pipeline of {TARGET_ELEMENTS:,} elements or more in this run: nothing to judge "
                     "against the throughput targets.")
    met = total = 0
    for r in big:
        vs_p, vs_d = ratio(r, "pyspark"), ratio(r, "direct")
        ok_p = vs_p is not None and vs_p >= TARGET_VS_PYSPARK
        ok_d = vs_d is not None and vs_d >= TARGET_VS_DIRECT
        met += ok_p + ok_d
        total += 2
        lines.append(f"- {r['pipeline']}, {r['elements']:,} elements: vs PySpark "
                     f"{_verdict(vs_p, TARGET_VS_PYSPARK)}; vs DirectRunner {_verdict(vs_d, TARGET_VS_DIRECT)}.")
    if total:
        lines += ["", f"{met} of {total} throughput targets met."]
    demo = {d["runner"]: d for d in results["demo"]}
    if "SparkRunner" in demo and "DirectRunner" in demo:
        s, d = demo["SparkRunner"]["wall"], demo["DirectRunner"]["wall"]
        if s is None or d is None:
            lines += ["", "- demo: not judged, a run failed (see the demo table)."]
        elif s < d:
            lines += ["", f"- demo: SparkRunner {s:.1f} s against DirectRunner {d:.1f} s, Spark start-up "
                      f"included: {d / s:.2f}x faster, met."]
        else:
            lines += ["", f"- demo: SparkRunner {s:.1f} s against DirectRunner {d:.1f} s, Spark start-up "
                      f"included: missed, SparkRunner takes {s / d:.2f}x DirectRunner's time "
                      f"({s - d:.1f} s more)."]
    return lines + [""]


def write_report(results: dict, out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    plot(results, out_dir)
    quick = results["args"]["quick"]
    lines = [
        "# SparkRunner throughput", "",
        f"Reproduce: `{results['command']}`" + (" (a smoke run at small sizes)" if quick else ""), "",
        f"Machine: {os.cpu_count()} cores; Spark `local[2]`. "
        "Absolute rates are noisy; the ratios, measured side by side in one process, are what to read.", "",
        "Each pipeline runs on SparkRunner, on Beam's DirectRunner as users get it "
        "(`beam.runners.DirectRunner()`: for a batch pipeline it hands over to the FnApiRunner, in-process, "
        "one worker) and as the same logic written with PySpark RDDs, one after the other. Each figure "
        "excludes Spark session and Python worker start-up: a warm-up run on every engine comes first. "
        "A figure is the median of the runs column.", "",
        f"## Main table, {results['args']['main_size']:,} elements", "",
    ]
    lines += _table(results["main"])
    if any(r["rate"]["direct"] is None for r in results["main"]):
        lines += ["", f"DirectRunner was not run above {results['args']['max_direct']:,} elements (`--max-direct`)."]
    if results["sweep"]:
        skipped = [r for r in results["sweep"] if r["rate"]["direct"] is None]
        lines += ["", "## Size sweep", "",
                  "Elements are words; the text file grows with them (12 words a line, ~5.8 bytes a word).", ""]
        lines += _table(sorted(results["sweep"], key=lambda r: (SWEPT.index(r["name"]), r["elements"])))
        if skipped:
            lines += ["", f"DirectRunner was not run above {results['args']['max_direct']:,} elements "
                      f"(`--max-direct`): " + ", ".join(f"{r['name']} at {r['elements']:,}" for r in skipped)
                      + "."]
        lines += ["", "Fastest engine at each size:", ""]
        for name in SWEPT:
            rows = sorted((r for r in results["sweep"] if r["name"] == name), key=lambda r: r["elements"])
            if rows:
                lines.append(f"- {rows[0]['pipeline'].split(' (')[0]}: " + ", ".join(
                    f"{r['elements']:,} {_fastest(r)}" for r in rows) + ".")
        lines += ["", "![throughput against size](runner.png)"]
    if results["demo"]:
        lines += ["", "## The demo, Spark start-up included", "",
                  f"`examples/payments_features.py` (what `make demo` runs: two SlidingAggregates over "
                  f"{results['args']['demo_events']:,} payments, written as JSON lines) in a fresh process per "
                  "run, from a scratch directory with `PYTHONPATH` set to the checkout. Wall time covers the "
                  "interpreter, imports, data generation, Spark start-up on SparkRunner and the pipeline; "
                  "\"pipeline\" is the time the example prints for the pipeline alone (on SparkRunner it "
                  "includes starting the session). SparkRunner's driver JVM maps the class archive an "
                  "earlier start wrote (docs/runner.md, Start-up), as it does for a user from their second "
                  "run on. Median of "
                  f"{results['args']['demo_runs']} run(s).", "",
                  "| runner | command | wall s | pipeline s |", "|---|---|---:|---:|"]
        for d in results["demo"]:
            if d["error"]:
                lines.append(f"| {d['runner']} | `{d['command']}` | failed: {d['error']} | |")
            else:
                lines.append(f"| {d['runner']} | `{d['command']}` | {d['wall']:.1f} | {d['pipeline']:.1f} |")
    lines += [""] + targets(results)
    lines += ["", "## Where the time goes", "",
              "`benchmarks/runner_profile.py` profiles these pipelines (Spark jobs from Spark's REST API, "
              "Python worker time by what the code does) into [runner_profile.md](runner_profile.md).", ""]
    if not results["sweep"]:
        lines += ["![throughput](runner.png)", ""]
    with open(os.path.join(out_dir, "runner.md"), "w") as f:
        f.write("\n".join(lines))


def _size(text: str) -> int:
    text = text.strip().lower().replace("_", "")
    mult = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    return int(float(text.rstrip("km")) * mult)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="small sizes, for a smoke run (main size 50k, sizes 10k,50k, 1 run, demo 500 payments)")
    parser.add_argument("--pipelines", default=",".join(PIPELINES),
                        help=f"comma-separated subset of {','.join(PIPELINES)}")
    parser.add_argument("--sizes", default=None,
                        help="element counts for the sweep of wordcount and side_mean (default 10k,100k,1M,2M,10M)")
    parser.add_argument("--main-size", default=None, help="element count of the main table (default 2M)")
    parser.add_argument("--runs", type=int, default=None,
                        help="median of N runs per figure (default 3 up to 100k elements, 1 above)")
    parser.add_argument("--max-direct", default="10M",
                        help="skip DirectRunner above this many elements (it is the slowest engine)")
    parser.add_argument("--demo-events", type=int, default=None,
                        help="payments in the demo row (default 5000); 0 skips it")
    parser.add_argument("--demo-runs", type=int, default=None, help="median of N demo runs (default 3)")
    parser.add_argument("--demo-timeout", type=float, default=1800.0, help="seconds before a demo run is abandoned")
    parser.add_argument("--out", default=os.path.join(CHECKOUT, "docs", "benchmarks"))
    args = parser.parse_args(argv)
    command = shlex.join(["python", "benchmarks/runner_throughput.py", *(sys.argv[1:] if argv is None else argv)])
    # --quick changes only the defaults: sizes, runs or demo given explicitly still apply.
    for name, full, quick in (("sizes", "10k,100k,1M,2M,10M", "10k,50k"), ("main_size", "2M", "50k"),
                              ("demo_events", 5000, 500), ("demo_runs", 3, 1), ("runs", None, 1)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    args.pipelines = [p.strip() for p in args.pipelines.split(",") if p.strip()]
    for name in args.pipelines:
        if name not in PIPELINES:
            parser.error(f"unknown pipeline {name!r}; known: {', '.join(PIPELINES)}")
    args.sizes = [_size(s) for s in args.sizes.split(",")]
    args.main_size, args.max_direct = _size(args.main_size), _size(args.max_direct)
    results = run(args)
    results["command"] = command
    _save(results, args.out)
    write_report(results, args.out)
    print(open(os.path.join(args.out, "runner.md")).read(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
