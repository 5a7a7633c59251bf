"""SlidingAggregate on SparkRunner (vectorised native path) and against Spark SQL RANGE."""
from __future__ import annotations

import collections
import glob
import json
import logging
import math
import os
import random
import subprocess
import sys

import apache_beam as beam
import numpy as np
import pytest
import sliding_separate_workers_job as separate_job
from _sliding_oracle import assert_features_close, every_kind, oracle

from beam_ext import SlidingAggregate, SlidingWindow, agg
from beam_ext.runner import SparkRunner
from beam_ext.transforms import sliding
from beam_ext.transforms.aggregators.registry import KINDS

WINDOWS = {"3s": (3, 0), "8s": (8, 0), "3s_d2": (3, 2), "5s_d3": (5, 3)}  # edges 3 and 8 shared
AGGS = every_kind("amount", "shop")  # every registered kind


def _transform(**kw):
    return SlidingAggregate(key="card", timestamp="ts",
                            windows={n: SlidingWindow(s, d) for n, (s, d) in WINDOWS.items()},
                            aggregations={n: getattr(agg, k)(f) for n, (k, f) in AGGS.items()}, **kw)


def _events(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"id": i, "card": rng.choice(["a", "b", "c", 4]), "ts": rng.randint(0, 60) / 2,
             "amount": rng.choice([None, math.nan, rng.uniform(-50, 50), 1e9 + rng.random(), -3e12]),
             "shop": rng.choice(["s1", "s2", "s3", None, 7])} for i in range(n)]


def _collect(events, runner, out_dir, **kw):
    """Run the transform and read its output back: {event id: features}.

    Output goes through files (json) because a matcher defined in this test
    module cannot be unpickled inside Spark's Python workers.
    """
    prefix = str(out_dir / runner_name(runner) / "out")
    with beam.Pipeline(runner=runner) as p:
        _ = (p | beam.Create(events) | _transform(**kw) | beam.Map(json.dumps)
             | beam.io.WriteToText(prefix))
    got = {}
    for path in glob.glob(prefix + "*"):
        with open(path) as f:
            for line in f:
                event, feats = json.loads(line)
                got[event["id"]] = feats
    return got


def runner_name(runner) -> str:
    return type(runner).__name__ if not isinstance(runner, str) else runner


def test_spark_runner_substitutes_the_native_path_and_equals_the_oracle(spark, tmp_path, caplog):
    events = _events(1, 300)
    want = oracle(events, "card", "ts", WINDOWS, AGGS)
    with caplog.at_level(logging.INFO, logger="beam_ext.runner"):
        got = _collect(events, SparkRunner(), tmp_path)
    assert f"runs Spark-natively ({sliding.NATIVE_URN})" in caplog.text
    direct = _collect(events, "BundleBasedDirectRunner", tmp_path)
    assert len(got) == len(direct) == len(events)
    assert_features_close([got[e["id"]] for e in events], want, rel=0)
    # Identical, not just close: both paths compute exact sums.
    assert got == direct


def test_keys_group_by_encoding_as_on_the_beam_path(spark, tmp_path):
    # GroupByKey groups by encoded key: NaN keys are one key, and 1, 1.0 and
    # True are three, though Python equality says otherwise.
    rng = random.Random(5)
    events = [dict(e, card=rng.choice([None, math.nan, 1, 1.0, True, "1"])) for e in _events(2, 200)]
    got = _collect(events, SparkRunner(), tmp_path)
    direct = _collect(events, "BundleBasedDirectRunner", tmp_path)
    assert len(got) == len(events)
    assert got == direct


def _windowed_rows(element, window=beam.DoFn.WindowParam):
    event, feats = element
    yield json.dumps([event["id"], str(window), feats])


def _collect_windowed(events, runner, out_dir, windowfn, transform=None) -> list:
    """Sorted ``[event id, window, features]`` rows of the transform after ``windowfn``."""
    prefix = str(out_dir / runner_name(runner) / "windowed")
    with beam.Pipeline(runner=runner) as p:
        _ = (p | beam.Create(events)
             | beam.Map(lambda e: beam.window.TimestampedValue(e, e["ts"]))
             | beam.WindowInto(windowfn) | (transform or _transform()) | beam.ParDo(_windowed_rows)
             | beam.io.WriteToText(prefix))
    return sorted(line for path in glob.glob(prefix + "*") for line in open(path))


@pytest.mark.parametrize("windowfn", [beam.window.SlidingWindows(10, 5), beam.window.Sessions(2)],
                         ids=["sliding", "sessions"])
def test_windows_of_several_or_merging_per_event_equal_the_beam_path(spark, tmp_path, windowfn):
    # GroupByKey groups an event in several windows once per window, and
    # merges session windows: the per-event batch path groups by the
    # event's own windows and can do neither, so such input keeps the
    # Beam expansion.
    events = _events(4, 60)
    got = _collect_windowed(events, SparkRunner(), tmp_path, windowfn)
    assert got == _collect_windowed(events, "BundleBasedDirectRunner", tmp_path, windowfn)


@pytest.mark.parametrize("timestamp", ["ts", None], ids=["field", "element-timestamp"])
def test_fixed_windows_and_element_timestamps_equal_the_beam_path(spark, tmp_path, caplog, timestamp):
    # One window per event: the native path, which groups a key's events
    # within their window; events at timestamps of their own travel to it
    # one by one, not as batches sharing one timestamp and window.
    events = _events(6, 300)
    transform = SlidingAggregate(key="card", timestamp=timestamp,
                                 windows={n: SlidingWindow(s, d) for n, (s, d) in WINDOWS.items()},
                                 aggregations={"n": agg.count(), "total": agg.sum("amount")})
    with caplog.at_level(logging.INFO, logger="beam_ext.runner"):
        got = _collect_windowed(events, SparkRunner(), tmp_path, beam.window.FixedWindows(10), transform)
    assert f"runs Spark-natively ({sliding.NATIVE_URN})" in caplog.text
    assert got == _collect_windowed(events, "BundleBasedDirectRunner", tmp_path, beam.window.FixedWindows(10),
                                    transform)
    assert len({json.loads(row)[1] for row in got}) == 4  # ts up to 30 s: four 10-second windows


def test_native_step_whose_output_nothing_reads(spark):
    # A pipeline may end at the transform; planning gave its output no coder.
    p = beam.Pipeline(runner=SparkRunner())
    _ = p | beam.Create(_events(3, 20)) | _transform()
    assert p.run().wait_until_finish() == beam.runners.runner.PipelineState.DONE


def test_native_annotation_is_dropped_for_custom_aggregates_and_streaming():
    plain = _transform()
    plain._streaming = False
    assert sliding.NATIVE_URN.encode() in plain.annotations().values()
    custom = SlidingAggregate(key="card", windows={"w": SlidingWindow(1)},
                              aggregations={"c": agg.custom("amount", KINDS["sum"].factory)})
    custom._streaming = False
    assert sliding.NATIVE_URN.encode() not in custom.annotations().values()
    plain._streaming = True
    assert sliding.NATIVE_URN.encode() not in plain.annotations().values()


def test_equals_spark_sql_range_frames(spark):
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    rng = random.Random(7)
    # Timestamps come from a pool of random reals (so peers exist) whose
    # pairwise differences are never the integer window sizes: no timestamp
    # sits on a window's start edge, the one place SQL's frame is closed.
    pool = [rng.uniform(0, 200) for _ in range(250)]
    rows = [(rng.choice(["a", "b", "c"]), rng.choice(pool),
             rng.choice([None, rng.uniform(-100, 100), 1e9 + rng.uniform(0, 10)]), i) for i in range(400)]
    events = [{"card": c, "ts": t, "amount": a, "id": i} for c, t, a, i in rows]
    df = spark.createDataFrame(rows, "card string, ts double, amount double, id long")
    sizes = {"10s": 10, "60s": 60}
    cols = []
    for name, size in sizes.items():
        w = Window.partitionBy("card").orderBy("ts").rangeBetween(-size, 0)
        cols += [F.count(F.lit(1)).over(w).alias(f"n_{name}"), F.sum("amount").over(w).alias(f"total_{name}"),
                 F.avg("amount").over(w).alias(f"avg_{name}"), F.max("amount").over(w).alias(f"top_{name}"),
                 F.min("amount").over(w).alias(f"low_{name}"),
                 F.stddev_pop("amount").over(w).alias(f"sd_{name}")]
    sql = {r["id"]: r.asDict() for r in df.select("id", *cols).collect()}
    got = _collect_plain(events, sizes)
    for e in events:
        s, g = sql[e["id"]], got[e["id"]]
        for name in sizes:
            assert g[f"n_{name}"] == s[f"n_{name}"]
            assert g[f"top_{name}"] == s[f"top_{name}"] and g[f"low_{name}"] == s[f"low_{name}"]
            # SQL sums in plain floating point (and gives NULL, not 0, for no values).
            for f in ("total", "avg", "sd"):
                a, b = g[f"{f}_{name}"], s[f"{f}_{name}"]
                if b is None:
                    assert a in (None, 0.0)
                else:
                    assert abs(a - b) <= 1e-6 * max(1.0, abs(b)) + (1e-3 if f == "sd" else 0), (f, name, a, b)


def _collect_plain(events, sizes):
    import numpy as np

    from beam_ext.transforms.sliding._plan import _Plan
    from beam_ext.transforms.sliding._vectorised import compute_batch

    plan = _Plan("card", "ts", {n: SlidingWindow(s) for n, s in sizes.items()},
                 {"n": agg.count(), "total": agg.sum("amount"), "avg": agg.mean("amount"),
                  "top": agg.max("amount"), "low": agg.min("amount"), "sd": agg.stddev("amount")}, None)
    feats = compute_batch(plan, [e["card"] for e in events], np.array([e["ts"] for e in events]), events)
    return {e["id"]: f for e, f in zip(events, feats)}


@pytest.mark.slow  # a JVM of its own and a fresh Python worker per Spark task
def test_none_and_nan_keys_on_separate_python_workers(tmp_path):
    # Python's hash() of None and NaN depends on the object's address: two
    # workers that partition by it split such a key's events. The job runs in
    # its own SparkContext, whose Python workers are separate interpreters.
    job = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sliding_separate_workers_job.py")
    done = subprocess.run(
        [sys.executable, job, str(tmp_path), "--runner=beam_ext.runner.SparkRunner",
         "--spark_master=local[2]", "--spark_parallelism=3",
         "--spark_conf=spark.python.use.daemon=false", "--spark_conf=spark.ui.enabled=false"],
        env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"), capture_output=True, text=True,
        timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    got = {}
    for path in glob.glob(str(tmp_path / "*.json")):
        with open(path) as f:
            got.update(json.loads(line) for line in f)
    events = separate_job.events()
    assert len(got) == len(events)

    def group(key):  # as GroupByKey groups: by encoding, so every NaN is one key
        return "NaN" if isinstance(key, float) and math.isnan(key) else key

    times = collections.defaultdict(list)
    for e in events:
        times[group(e["card"])].append(e["ts"])
    times = {k: np.sort(v) for k, v in times.items()}
    wrong = {}
    for e in events:
        ts = times[group(e["card"])]
        want = int(np.searchsorted(ts, e["ts"], side="right")
                   - np.searchsorted(ts, e["ts"] - separate_job.WINDOW, side="right"))
        if got[e["id"]] != want:
            wrong[e["id"]] = (e["card"], got[e["id"]], want)
    assert not wrong, f"{len(wrong)} wrong counts, e.g. {list(wrong.values())[:5]}"
