"""Streaming benchmark: a windowed count with 5 % late data, arrival-to-result latency.

Anchors, side by side in one run, each engine in its own process, one after
the other, all fed by the same generator:

* ``spark-ss`` - the query written natively in Spark Structured Streaming
  (PySpark 4): a Python streaming data source (``DataSourceStreamReader``,
  Spark owns the offsets), ``withWatermark``, ``groupBy(window, key)``,
  ``count`` and ``max(arrival)``, output mode ``update``, a ``foreachBatch``
  sink that stamps the emit time; ``local[2]``.
* ``direct`` - the Beam pipeline below on Beam's DirectRunner with
  ``--streaming`` (the BundleBasedDirectRunner).
* ``sparkrunner`` - the same Beam pipeline, unchanged, on
  ``beam_ext.runner.SparkRunner()`` with ``--streaming`` (``--watermarks``
  passed through when given). Recorded as "not run" when the runner refuses
  streaming pipelines.

The workload: events generated in real time at ``--rate`` events/s for
``--duration`` s, keys = 100 users, event time = arrival time except for 5 %
late events whose event time is 2-10 s in the past. Fixed 1 s event-time
windows, allowed lateness 30 s, an on-time pane when the watermark passes the
window's end and a late pane per late firing (Beam:
``AfterWatermark(late=AfterCount(1))``, accumulating; Spark's update mode
re-emits the accumulated count of every window a micro-batch touched). Every
result row carries (key, window, count, max arrival time of the events it
counts); its latency is the wall time it was written minus that max arrival.

The Beam pipeline uses standard transforms only: ``Impulse`` -> a splittable
DoFn emitting the events due by the wall clock (``ManualWatermarkEstimator``
at the next event's arrival, ``defer_remainder`` between batches, done after
``--duration``) -> ``WindowInto`` -> ``CombinePerKey`` (count, max arrival)
-> a ``ParDo`` appending result rows to a file.

    python benchmarks/streaming.py             # 10,000 events/s, 60 s per engine (~4 min)
    python benchmarks/streaming.py --quick     # smoke run (~15 s per engine)
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

ENGINES = ("spark-ss", "direct", "sparkrunner")
_LABELS = {"spark-ss": "Spark Structured Streaming", "direct": "Beam DirectRunner --streaming",
           "sparkrunner": "beam_ext SparkRunner --streaming"}
# Events are drawn per block of this many indices, each block from its own
# seeded generator, so any engine can produce any index range and all agree.
_BLOCK = 4096
# The Beam source emits what is due at most every this many seconds: one
# invocation per event would cost more than the events (the DirectRunner
# starts a checkpoint timer thread per invocation).
_SOURCE_BATCH_SECONDS = 0.05
_BLOCKS: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
# Each engine first runs the same job this long at this rate, in the same process.
_WARM_UP_SECONDS = 3.0
_WARM_UP_RATE = 200.0


@dataclass
class Config:
    engine: str
    rate: float = 10_000.0
    duration: float = 60.0
    keys: int = 100
    late_fraction: float = 0.05
    late_min: float = 2.0
    late_max: float = 10.0
    window: float = 1.0
    lateness: float = 30.0
    seed: int = 0
    out: str = ""               # result rows are appended here; ``out + ".t0"`` holds the start time
    watermarks: str | None = None  # SparkRunner only: tracker | min
    deadline: float = 120.0     # seconds after the generator ends before the engine is stopped
    warmup: float = 20.0        # rows whose events arrived earlier are left out of the steady percentiles
    spark_master: str = "local[2]"

    @property
    def total(self) -> int:
        return int(round(self.rate * self.duration))


@dataclass
class Result:
    config: Config
    not_run: str | None = None
    t0: float = 0.0
    rows: int = 0
    events: int = 0            # events counted in the final result of every (key, window)
    expected_events: int = 0
    mismatched_windows: int = 0
    windows: int = 0
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    p999_ms: float = math.nan
    steady_rows: int = 0
    steady_p50_ms: float = math.nan
    steady_p99_ms: float = math.nan
    steady_p999_ms: float = math.nan
    late_rows: int = 0         # rows whose newest event is a late one
    first_result_s: float = math.nan  # start to the first result row
    batch_interval_s: float = math.nan  # spark-ss: median time between micro-batch outputs, steady state
    wall_seconds: float = 0.0  # first arrival to last result
    drain_seconds: float = 0.0  # end of generation to last result
    events_per_s: float = 0.0
    kept_up: bool = False
    finished: bool = True      # False: stopped at the deadline
    load: tuple[float, float] = (math.nan, math.nan)  # 1-minute load average at start and end
    latencies_ms: list[float] = field(default_factory=list)  # for the plots, not saved
    arrivals: list[float] = field(default_factory=list)


# -- the generator, shared by every engine ----------------------------------
def _block(cfg: Config, b: int) -> tuple[np.ndarray, np.ndarray]:
    """Keys and lateness (0 for on-time events) of block ``b``; the last few are cached, as
    a source's batches are much smaller than a block."""
    # A plain dict, not functools.lru_cache: Spark pickles this module's
    # functions by value into its Python workers, and the cache wrapper would
    # be pickled by reference to a module they cannot import.
    cache_key = (cfg.seed, cfg.keys, cfg.late_fraction, cfg.late_min, cfg.late_max, b)
    hit = _BLOCKS.get(cache_key)
    if hit is None:
        rng = np.random.default_rng([cfg.seed, b])
        key = rng.integers(0, cfg.keys, _BLOCK)
        late = rng.random(_BLOCK) < cfg.late_fraction
        delay = rng.uniform(cfg.late_min, cfg.late_max, _BLOCK)
        hit = _BLOCKS[cache_key] = key, np.where(late, delay, 0.0)
        if len(_BLOCKS) > 8:
            del _BLOCKS[next(iter(_BLOCKS))]
    return hit


def generate(cfg: Config, t0: float, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Events ``lo`` to ``hi`` (exclusive) of the run started at ``t0``:
    (key, arrival time, event time) arrays. Event ``i`` arrives at
    ``t0 + i / rate``; late events are stamped 2-10 s before their arrival."""
    keys, delays = [], []
    for b in range(lo // _BLOCK, (hi - 1) // _BLOCK + 1 if hi > lo else 0):
        k, d = _block(cfg, b)
        start, stop = max(lo - b * _BLOCK, 0), min(hi - b * _BLOCK, _BLOCK)
        keys.append(k[start:stop])
        delays.append(d[start:stop])
    key = np.concatenate(keys) if keys else np.zeros(0, np.int64)
    delay = np.concatenate(delays) if delays else np.zeros(0)
    arrival = t0 + np.arange(lo, hi) / cfg.rate
    return key, arrival, arrival - delay


def expected_counts(cfg: Config, t0: float) -> dict[tuple[int, float], int]:
    """(key, window start) -> count of the whole run, computed from the generator."""
    key, _, event_time = generate(cfg, t0, 0, cfg.total)
    start = np.floor(event_time / cfg.window) * cfg.window
    out: dict[tuple[int, float], int] = {}
    for k, s in zip(key.tolist(), np.round(start, 6).tolist()):
        out[(k, s)] = out.get((k, s), 0) + 1
    return out


def _write_t0(cfg: Config, t0: float) -> None:
    with open(cfg.out + ".t0", "w") as f:
        f.write(repr(t0))


def _append_rows(path: str, lines: list[str]) -> None:
    # One O_APPEND write per call: rows from several processes never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, "".join(lines).encode())
    finally:
        os.close(fd)


# -- the Beam pipeline (DirectRunner and SparkRunner) -----------------------
def build_pipeline(p, cfg: Config):
    """The judged Beam pipeline: standard transforms only."""
    import apache_beam as beam
    from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
    from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
    from apache_beam.transforms import trigger, window
    from apache_beam.utils.timestamp import Duration, Timestamp

    class _Restrictions(beam.transforms.core.RestrictionProvider):
        def initial_restriction(self, t0):
            return OffsetRange(0, cfg.total)

        def create_tracker(self, restriction):
            return OffsetRestrictionTracker(restriction)

        def restriction_size(self, t0, restriction):
            return restriction.size()

        def truncate(self, t0, restriction):
            return None  # on drain, stop generating

    class _EventSource(beam.DoFn):
        """Emits the events due by the wall clock; the watermark is the next event's arrival."""

        @beam.DoFn.unbounded_per_element()
        def process(self, t0, tracker=beam.DoFn.RestrictionParam(_Restrictions()),
                    watermark=beam.DoFn.WatermarkEstimatorParam(
                        ManualWatermarkEstimator.default_provider())):
            lo = tracker.current_restriction().start
            first_due = t0 + lo / cfg.rate
            # Runners that re-invoke at once (the DirectRunner ignores the
            # resume time) wait here instead of spinning.
            wait = first_due + _SOURCE_BATCH_SECONDS - time.time()
            if wait > 0:
                time.sleep(min(wait, _SOURCE_BATCH_SECONDS))
            hi = min(cfg.total, int((time.time() - t0) * cfg.rate) + 1)
            if hi > lo:
                if not tracker.try_claim(hi - 1):
                    return
                key, arrival, event_time = generate(cfg, t0, lo, hi)
                for k, a, e in zip(key.tolist(), arrival.tolist(), event_time.tolist()):
                    yield window.TimestampedValue((k, a), e)
            if hi >= cfg.total:
                tracker.try_claim(cfg.total)  # done: the watermark goes to the end of time
                return
            next_arrival = Timestamp.of(t0 + hi / cfg.rate)
            current = watermark.current_watermark()
            if current is None or next_arrival > current:
                watermark.set_watermark(next_arrival)
            tracker.defer_remainder(Duration.of(_SOURCE_BATCH_SECONDS))

    class _CountMaxArrival(beam.CombineFn):
        def create_accumulator(self):
            return 0, -math.inf

        def add_input(self, acc, arrival):
            return acc[0] + 1, max(acc[1], arrival)

        def merge_accumulators(self, accs):
            accs = list(accs)
            return sum(a[0] for a in accs), max(a[1] for a in accs)

        def extract_output(self, acc):
            return acc

    class _AppendResults(beam.DoFn):
        """Appends (emit time, key, window, count, max arrival, pane) rows to ``cfg.out``."""

        def process(self, element, w=beam.DoFn.WindowParam, pane=beam.DoFn.PaneInfoParam):
            now = time.time()
            key, (count, max_arrival) = element
            timing = {0: "EARLY", 1: "ON_TIME", 2: "LATE"}.get(pane.timing, "UNKNOWN")
            _append_rows(cfg.out, [f"{now:.6f},{key},{float(w.start):.6f},{count},{max_arrival:.6f},"
                                   f"{timing}\n"])

    def start(_):
        t0 = time.time()
        _write_t0(cfg, t0)
        return t0

    return (p
            | "Start" >> beam.Impulse()
            | "StampStart" >> beam.Map(start)
            | "Events" >> beam.ParDo(_EventSource())
            | "Window" >> beam.WindowInto(
                window.FixedWindows(cfg.window),
                trigger=trigger.AfterWatermark(late=trigger.AfterCount(1)),
                allowed_lateness=Duration.of(cfg.lateness),
                accumulation_mode=trigger.AccumulationMode.ACCUMULATING)
            | "CountMaxArrival" >> beam.CombinePerKey(_CountMaxArrival())
            | "Write" >> beam.ParDo(_AppendResults()))


def run_beam(cfg: Config) -> dict:
    """Runs the Beam pipeline on ``cfg.engine``'s runner; {"not_run": reason} if it refuses."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    flags = ["--streaming"]
    runner = None
    if cfg.engine == "sparkrunner":
        from beam_ext.runner import SparkRunner

        runner = SparkRunner()
        flags += [f"--spark_master={cfg.spark_master}",
                  "--spark_conf=spark.ui.enabled=false",
                  f"--checkpoint_dir={cfg.out}.checkpoint"]
        if cfg.watermarks:
            flags.append(f"--watermarks={cfg.watermarks}")
    p = beam.Pipeline(runner=runner, options=PipelineOptions(flags))
    build_pipeline(p, cfg)
    try:
        result = p.run()
    except NotImplementedError as e:
        return {"not_run": f"{type(e).__name__}: {e}"}
    if cfg.engine == "sparkrunner":
        # Beam's API: milliseconds. The DirectRunner refuses a duration; the
        # parent process stops it at the deadline instead.
        result.wait_until_finish(duration=int((cfg.duration + cfg.deadline) * 1000))
        if str(result.state) not in ("DONE", "PipelineState.DONE"):
            result.cancel()
            return {"finished": False}
    else:
        result.wait_until_finish()
    return {}


# -- the same query in Spark Structured Streaming ---------------------------
def run_spark_ss(cfg: Config) -> dict:
    """The query written natively for Spark Structured Streaming (the session is left running
    for the next query)."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class _Range(InputPartition):
        def __init__(self, t0: float, lo: int, hi: int) -> None:
            self.t0, self.lo, self.hi = t0, lo, hi

    class _Reader(DataSourceStreamReader):
        def __init__(self) -> None:
            self.t0: float | None = None

        def initialOffset(self) -> dict:
            self.t0 = time.time()
            _write_t0(cfg, self.t0)
            return {"index": 0}

        def latestOffset(self, start: dict, limit) -> dict:
            due = min(cfg.total, int((time.time() - self.t0) * cfg.rate) + 1)
            return {"index": max(due, start["index"])}

        def partitions(self, start: dict, end: dict):
            lo, hi = start["index"], end["index"]
            mid = (lo + hi) // 2  # one partition per core of local[2]
            return [_Range(self.t0, a, b) for a, b in ((lo, mid), (mid, hi)) if b > a]

        def read(self, partition: _Range):
            import pyarrow as pa

            key, arrival, event_time = generate(cfg, partition.t0, partition.lo, partition.hi)
            yield pa.RecordBatch.from_arrays(
                [pa.array(key, pa.int64()), pa.array(event_time), pa.array(arrival)],
                names=["key", "event_ts", "arrival"])

        def commit(self, end: dict) -> None:
            pass

    class _Events(DataSource):
        @classmethod
        def name(cls) -> str:
            return "bench_streaming_events"

        def schema(self) -> str:
            return "key bigint, event_ts double, arrival double"

        def streamReader(self, schema):
            return _Reader()

    from spark_settings import session_conf
    spark = (SparkSession.builder.master(cfg.spark_master).appName("bench-streaming-spark-ss")
             .config(map=session_conf())
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.default.parallelism", "2")
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(_Events)  # a warm-up run's source of the same name is replaced
    counts = (spark.readStream.format("bench_streaming_events").load()
              .withColumn("event_time", F.col("event_ts").cast("timestamp"))
              .withWatermark("event_time", f"{int(cfg.lateness)} seconds")
              .groupBy(F.window("event_time", f"{int(cfg.window * 1000)} milliseconds"), "key")
              .agg(F.count("*").alias("n"), F.max("arrival").alias("max_arrival")))

    def sink(df, batch_id: int) -> None:
        rows = df.select("key", F.col("window.start").cast("double").alias("start"), "n",
                         "max_arrival").collect()
        now = time.time()
        _append_rows(cfg.out, [f"{now:.6f},{r.key},{r.start:.6f},{r.n},{r.max_arrival:.6f},"
                               f"BATCH{batch_id}\n" for r in rows])

    query = (counts.writeStream.outputMode("update").foreachBatch(sink)
             .option("checkpointLocation", cfg.out + ".checkpoint")
             .start())
    started = time.time()
    while not os.path.exists(cfg.out + ".t0"):
        if query.exception() or time.time() > started + cfg.deadline:
            query.stop()
            raise RuntimeError(f"the source never started: {query.exception()}")
        time.sleep(0.05)
    with open(cfg.out + ".t0") as f:
        t0 = float(f.read())
    deadline = t0 + cfg.duration + cfg.deadline
    while time.time() < t0 + cfg.duration:
        time.sleep(0.2)
    finished = True
    while True:  # until the last offset is in a finished batch
        progress = query.lastProgress
        end = progress["sources"][0]["endOffset"] if progress else None
        if isinstance(end, str):
            end = json.loads(end)
        if end and end["index"] >= cfg.total:
            break
        if time.time() > deadline:
            finished = False
            break
        time.sleep(0.1)
    query.stop()
    return {"finished": finished}


# -- measuring ----------------------------------------------------------------
def _run_job(cfg: Config, warm_up: bool) -> dict:
    """Runs ``cfg.engine``'s job; first, when ``warm_up``, the same job for a few seconds at a
    trickle, so that the measured run does not pay the engine's start-up (JVM, Python workers,
    code generation), as in the other benchmarks."""
    run = run_spark_ss if cfg.engine == "spark-ss" else run_beam
    if warm_up:
        trial = replace(cfg, rate=min(cfg.rate, _WARM_UP_RATE), duration=_WARM_UP_SECONDS,
                        out=cfg.out + ".warmup")
        refused = run(trial).get("not_run")
        if refused:
            return {"not_run": refused}
    for path in (cfg.out, cfg.out + ".t0"):
        if os.path.exists(path):
            os.remove(path)
    try:
        return run(cfg)
    finally:
        if cfg.engine == "spark-ss":
            from pyspark.sql import SparkSession

            SparkSession.builder.getOrCreate().stop()


def run_engine(cfg: Config, warm_up: bool = True) -> Result:
    """Runs one engine in this process; reads its result rows back."""
    extra = _run_job(cfg, warm_up)
    return summarize(cfg, extra.get("not_run"), extra.get("finished", True))


def summarize(cfg: Config, not_run: str | None = None, finished: bool = True) -> Result:
    """Latency percentiles, events processed and keeping up, from the rows in ``cfg.out``."""
    if not_run:
        return Result(cfg, not_run=not_run)
    if not os.path.exists(cfg.out + ".t0"):  # stopped before its source started
        return Result(cfg, finished=finished)
    with open(cfg.out + ".t0") as f:
        t0 = float(f.read())
    rows = np.loadtxt(cfg.out, delimiter=",", usecols=(0, 1, 2, 3, 4), ndmin=2) \
        if os.path.exists(cfg.out) and os.path.getsize(cfg.out) else np.zeros((0, 5))
    if not len(rows):
        return Result(cfg, t0=t0, finished=finished)
    emit, key, start, count, max_arrival = rows.T
    latency = (emit - max_arrival) * 1000
    final: dict[tuple[int, float], int] = {}
    for k, s, c in zip(key.astype(int).tolist(), np.round(start, 6).tolist(), count.astype(int).tolist()):
        final[(k, s)] = max(final.get((k, s), 0), c)
    expected = expected_counts(cfg, t0)
    mismatched = sum(final.get(w, 0) != c for w, c in expected.items()) + len(set(final) - set(expected))
    # A row whose newest event is a late one: its max arrival is not in its own window.
    late = int(np.sum(max_arrival >= start + cfg.window + 1e-6))
    steady = latency[max_arrival >= t0 + cfg.warmup]
    steady_q = np.percentile(steady, [50, 99, 99.9]) if len(steady) else [math.nan] * 3
    interval = math.nan
    if cfg.engine == "spark-ss":  # a micro-batch's rows share one emit time
        batches = np.unique(emit[max_arrival >= t0 + cfg.warmup])
        interval = float(np.median(np.diff(batches))) if len(batches) > 1 else math.nan
    events = sum(final.values())
    end_of_input = t0 + cfg.total / cfg.rate
    wall = float(emit.max() - t0)
    drain = float(emit.max() - end_of_input)
    return Result(
        cfg, t0=t0, rows=len(rows), events=events, expected_events=cfg.total,
        mismatched_windows=mismatched, windows=len(expected),
        p50_ms=float(np.percentile(latency, 50)), p99_ms=float(np.percentile(latency, 99)),
        p999_ms=float(np.percentile(latency, 99.9)), steady_rows=len(steady),
        steady_p50_ms=float(steady_q[0]), steady_p99_ms=float(steady_q[1]), steady_p999_ms=float(steady_q[2]),
        late_rows=late, batch_interval_s=interval, first_result_s=float(emit.min() - t0), wall_seconds=wall,
        drain_seconds=drain, events_per_s=events / wall,
        kept_up=finished and events == cfg.total and drain <= max(5.0, 0.1 * cfg.duration),
        finished=finished, latencies_ms=latency.tolist(), arrivals=(max_arrival - t0).tolist())


def _run_in_subprocess(cfg: Config) -> Result:
    load_start = os.getloadavg()[0]
    result = _run_engine_process(cfg)
    result.load = (load_start, os.getloadavg()[0])
    return result


def _run_engine_process(cfg: Config) -> Result:
    cmd = [sys.executable, os.path.abspath(__file__), "--one", json.dumps(asdict(cfg))]
    # Start-up (twice: warm-up run, then the measured one) on top of the engine's own deadline.
    timeout = cfg.duration + cfg.deadline + _WARM_UP_SECONDS + 240
    # Its own process group: at the timeout, the engine's JVM and Python workers go with it.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        print(f"{cfg.engine}: stopped after {timeout:.0f} s", flush=True)
        return summarize(cfg, finished=False)
    if proc.returncode != 0:
        print(f"{cfg.engine} failed:\n{err[-4000:]}", file=sys.stderr, flush=True)
        last = [line for line in err.strip().splitlines() if line.strip()][-1:] or ["no error output"]
        return Result(cfg, not_run=f"failed: {last[0][:300]}")
    data = json.loads(out.strip().splitlines()[-1])
    return summarize(cfg, data.get("not_run"), data.get("finished", True))


# -- report -------------------------------------------------------------------
def _fmt_ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:,.0f}"


def _command(args: argparse.Namespace) -> str:
    cmd = "python benchmarks/streaming.py"
    if args.quick:
        return cmd + " --quick"
    if args.rate != 10_000:
        cmd += f" --rate {args.rate:g}"
    if args.duration != 60:
        cmd += f" --duration {args.duration:g}"
    if args.engines != ",".join(ENGINES):
        cmd += f" --engines {args.engines}"
    if args.watermarks:
        cmd += f" --watermarks {args.watermarks}"
    for name in ("warmup", "deadline"):
        if getattr(args, name) is not None:
            cmd += f" --{name} {getattr(args, name):g}"
    return cmd


def _plot(results: list[Result], cmd: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        if not r.latencies_ms:
            continue
        label = _LABELS[r.config.engine]
        lat = np.sort(np.maximum(np.array(r.latencies_ms), 1.0))
        axes[0].plot(lat, np.arange(1, len(lat) + 1) / len(lat), label=label)
        rng = np.random.default_rng(0)
        pick = rng.choice(len(lat), min(len(lat), 4000), replace=False)
        axes[1].scatter(np.array(r.arrivals)[pick], np.maximum(np.array(r.latencies_ms)[pick], 1.0),
                        s=3, alpha=0.4, label=label)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("arrival-to-result latency (ms)")
    axes[0].set_ylabel("fraction of result rows")
    axes[0].set_title("latency CDF")
    axes[0].legend(fontsize=8)
    if results:
        axes[1].axvline(results[0].config.warmup, color="grey", lw=0.8, ls=":")
    axes[1].set_yscale("log")
    axes[1].set_xlabel("max arrival of the row's events (s after start)")
    axes[1].set_ylabel("latency (ms)")
    axes[1].set_title("latency over the run")
    axes[1].legend(fontsize=8, markerscale=4)
    from matplotlib.ticker import FuncFormatter, NullFormatter

    # After set_*scale, which installs its own formatters: plain numbers, no minor labels.
    for axis in (axes[0].xaxis, axes[1].yaxis):
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,g}"))
        axis.set_minor_formatter(NullFormatter())
    fig.suptitle(f"reproduce: {cmd}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _row(r: Result) -> str:
    c = r.config
    name = _LABELS[c.engine] + (f" (--watermarks={c.watermarks})" if c.engine == "sparkrunner"
                                and c.watermarks else "")
    if r.not_run:
        return f"| {name} | | not run: `{r.not_run}` |||||||||||||"
    if not r.rows:
        return f"| {name} | | no result rows{'' if r.finished else ' (stopped at the deadline)'} |||||||||||||"
    ok = "yes" if r.mismatched_windows == 0 else f"{r.mismatched_windows} of {r.windows} differ"
    return (f"| {name} | {r.load[0]:.1f} -> {r.load[1]:.1f} | {_fmt_ms(r.p50_ms)} | {_fmt_ms(r.p99_ms)} | {_fmt_ms(r.p999_ms)} | "
            f"{_fmt_ms(r.steady_p50_ms)} | {_fmt_ms(r.steady_p99_ms)} | {_fmt_ms(r.steady_p999_ms)} | "
            f"{r.first_result_s:.1f} | {r.rows:,} ({r.late_rows:,}) | {r.events:,} / {r.expected_events:,} | "
            f"{r.events_per_s:,.0f} | {r.drain_seconds:.1f} | {'yes' if r.kept_up else 'no'} | {ok} |")


def _write_report(results: list[Result], cmd: str, out_dir: str, plot: bool = True) -> None:
    if plot:
        _plot(results, cmd, os.path.join(out_dir, "streaming_latency.png"))
    by = {r.config.engine: r for r in results}
    ran = [r for r in results if r.rows]
    c = results[0].config
    lines = [
        "# Streaming benchmark: windowed count with late data",
        "",
        f"Reproduce: `{cmd}` (writes this file, `streaming.json` and `streaming_latency.png`; "
        "`--report-only` rewrites this file from the JSON). "
        "2-core VM shared with other jobs (the load column is the 1-minute load average when the "
        "engine started and ended); each engine runs in its own process, one after the other.",
        "",
        f"Workload: {c.rate:,.0f} events/s generated in real time for {c.duration:g} s per engine "
        f"({c.total:,} events), {c.keys} keys, {100 * c.late_fraction:g} % late events whose event "
        f"time is {c.late_min:g}-{c.late_max:g} s before their arrival, the others stamped with "
        f"their arrival time. Fixed {c.window:g} s event-time windows, allowed lateness "
        f"{c.lateness:g} s, accumulating panes. Every engine draws the same events from the same "
        "generator (`generate()`), starting its clock when its source starts. Each engine first "
        f"runs the same job for {_WARM_UP_SECONDS:g} s at {_WARM_UP_RATE:g} events/s in the same "
        "process, so that the measured run finds the JVM, Python workers and code generation warm, "
        "as a long-running job would.",
        "",
        "Latency of a result row = wall time it was written - max arrival time of the events it "
        "counts. Events/s = events counted in the final result of every (key, window) / (last "
        "result - start). Drain = last result - end of generation. Kept up: every event counted, "
        "and drained within max(5 s, 10 % of the run). Counts check: the last count of every "
        "(key, window) equals the generator's. First result: seconds from the source's start to "
        "the first result row. Percentiles are over all result rows, then over "
        f"the rows whose events arrived after the first {c.warmup:g} s (steady state: the engines' "
        "first micro-batches or bundles pay start-up). Result rows in brackets: those whose "
        "newest event is a late one.",
        "",
        "| engine | load | p50 ms | p99 ms | p99.9 ms | steady p50 ms | steady p99 ms | steady p99.9 ms | "
        "first result s | result rows (late) | events counted | events/s | drain s | kept up | counts check |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    lines += [_row(r) for r in results]
    lines += ["", "![latency](streaming_latency.png)", "", "## Ratios", ""]
    ss = by.get("spark-ss")
    for r in ran:
        if ss and ss.rows and r is not ss:
            lines.append(f"- {_LABELS[r.config.engine]} / Spark Structured Streaming: steady p50 "
                         f"{r.steady_p50_ms / ss.steady_p50_ms:.2f}x, p99 "
                         f"{r.steady_p99_ms / ss.steady_p99_ms:.2f}x, p99.9 "
                         f"{r.steady_p999_ms / ss.steady_p999_ms:.2f}x; events/s "
                         f"{r.events_per_s / ss.events_per_s:.2f}x.")
    lines.append("- Railgun's target for per-event windows, p99.9 below 250 ms (steady): "
                 + ", ".join(f"{_LABELS[r.config.engine]} "
                             f"{'meets' if r.steady_p999_ms < 250 else 'misses'} it"
                             for r in ran) + ".")
    lines += ["", "## Reading the numbers", ""] + _readings(by, c)
    with open(os.path.join(out_dir, "streaming.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out_dir, "streaming.json"), "w") as f:
        json.dump({"command": cmd, "results": [
            {k: v for k, v in asdict(r).items() if k not in ("latencies_ms", "arrivals")}
            for r in results]}, f, indent=1)


def _readings(by: dict[str, Result], c: Config) -> list[str]:
    out = [
        "- Semantics differ where the engines do: Spark's update mode re-emits the accumulated "
        "count of every (key, window) a micro-batch touched, before the window ends and on "
        "every late event after; Beam emits one on-time pane when the watermark passes the "
        "window's end and a late pane per late firing. Both give every event a result row that "
        "counts it, which is what arrival-to-result measures. Spark's watermark is the largest "
        f"event time seen minus {c.lateness:g} s (so nothing within the allowed lateness is "
        "dropped); Beam's is the source's watermark estimator, set to the next event's arrival.",
    ]
    ss = by.get("spark-ss")
    if ss and ss.rows:
        out.append(
            f"- Spark Structured Streaming: its first result came {ss.first_result_s:.1f} s after the "
            "source started. In steady state a micro-batch ended every "
            f"{ss.batch_interval_s:.2f} s (median): a row waits for the micro-batch after the one "
            "running when its newest event arrived, and for that batch to be planned, read, "
            "aggregated and committed, so its latency is one to two batch intervals.")
    d = by.get("direct")
    if d and d.rows:
        out.append(
            f"- DirectRunner throughput: {d.events:,} events counted in {d.wall_seconds:.0f} s, "
            f"{d.events_per_s:,.0f} events/s against {c.rate:,.0f} offered; it ended {d.drain_seconds:.0f} s "
            "after the generator did. It runs every element through Beam's Python per-element "
            "machinery on one interpreter (GIL), the streaming GroupByKey buffering every element "
            "until its window fires.")
        out.append(
            "- Beam's Python DirectRunner holds the output watermark of a splittable DoFn at "
            "minus infinity while it has a residual (`runners/direct/sdf_direct_runner.py`, "
            "`ProcessFn.process`: `watermark_hold_tag` set to `WATERMARK_NEG_INF`, and a "
            "re-invocation timer at minus infinity since it has no processing-time timers): the "
            "watermark estimator is ignored, so no on-time pane fires until the source is done, "
            "every event is on time, and each (key, window) gets one pane at the end. Its latency "
            "is the time from an event's arrival to the end of the run, by construction.")
    sr = by.get("sparkrunner")
    if sr and sr.not_run:
        out.append("- SparkRunner: the runner in this tree refuses `--streaming`; the row runs "
                   "the same Beam pipeline unchanged once it does.")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 1,000 events/s for 5 s")
    parser.add_argument("--rate", type=float, default=10_000.0, help="events per second")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of events per engine")
    parser.add_argument("--engines", default=",".join(ENGINES),
                        help=f"comma-separated subset of {','.join(ENGINES)}")
    parser.add_argument("--watermarks", choices=("tracker", "min"), default=None,
                        help="SparkRunner's watermark computation (passed only when given)")
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds an engine may take after the generator ends")
    parser.add_argument("--warmup", type=float, default=None,
                        help="seconds of events left out of the steady percentiles "
                        "(default: the first third of the run; --quick: 0)")
    parser.add_argument("--out", default=os.path.join(_ROOT, "docs", "benchmarks"))
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite streaming.md from the last run's streaming.json (the plot stays)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        cfg = Config(**json.loads(args.one))
        print(json.dumps(_run_job(cfg, warm_up=True)))
        return
    if args.report_only:
        with open(os.path.join(args.out, "streaming.json")) as f:
            saved = json.load(f)
        results = [Result(**{**d, "config": Config(**d["config"]), "load": tuple(d["load"])})
                   for d in saved["results"]]
        _write_report(results, saved["command"], args.out, plot=False)
        return
    if args.quick:
        args.rate, args.duration = 1000.0, 5.0
    deadline = args.deadline if args.deadline is not None else (20.0 if args.quick else 60.0)
    warmup = args.warmup if args.warmup is not None else (0.0 if args.quick else args.duration / 3)
    engines = [e for e in args.engines.split(",") if e]
    unknown = set(engines) - set(ENGINES)
    if unknown:
        parser.error(f"--engines: unknown {sorted(unknown)}; choose from {ENGINES}")
    work = tempfile.mkdtemp(prefix="bench-streaming-")
    results = []
    for engine in engines:
        cfg = Config(engine, rate=args.rate, duration=args.duration,
                     out=os.path.join(work, f"{engine}.csv"), deadline=deadline, warmup=warmup,
                     watermarks=args.watermarks if engine == "sparkrunner" else None)
        if os.path.exists(cfg.out):
            os.remove(cfg.out)
        r = _run_in_subprocess(cfg)
        results.append(r)
        if r.not_run:
            print(f"{engine:12s} not run: {r.not_run}", flush=True)
        else:
            print(f"{engine:12s} p50={_fmt_ms(r.p50_ms)} ms p99={_fmt_ms(r.p99_ms)} ms "
                  f"p99.9={_fmt_ms(r.p999_ms)} ms rows={r.rows} events={r.events}/{r.expected_events} "
                  f"{r.events_per_s:,.0f} ev/s drain={r.drain_seconds:.1f}s kept_up={r.kept_up} "
                  f"mismatched={r.mismatched_windows}/{r.windows}", flush=True)
    ss = next((r for r in results if r.config.engine == "spark-ss" and r.rows), None)
    for r in results:
        if ss and r.rows and r is not ss:
            print(f"ratio {r.config.engine}/spark-ss: p50 {r.p50_ms / ss.p50_ms:.2f} p99 "
                  f"{r.p99_ms / ss.p99_ms:.2f} p99.9 {r.p999_ms / ss.p999_ms:.2f} "
                  f"events/s {r.events_per_s / ss.events_per_s:.2f}")
    os.makedirs(args.out, exist_ok=True)
    _write_report(results, _command(args), args.out)
    shutil.rmtree(work, ignore_errors=True)
    print(f"wrote {os.path.join(args.out, 'streaming.md')}")


if __name__ == "__main__":
    main()
