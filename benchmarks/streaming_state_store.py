"""Per-key cost of Spark's state store behind transformWithState, from Python.

A rate source at ``--rate`` rows/s (two partitions), key = value mod
``--keys``, the RocksDB state store provider, ``local[2]``, two shuffle
partitions, a ``foreachBatch`` sink in update mode. Side by side in one run, each in
its own process (a fresh JVM), one after the other:

* ``tws-pandas`` - ``transformWithStateInPandas``: a ``ValueState`` counter
  per key, the batch's rows of a key arrive as pandas DataFrames;
* ``tws-row`` - ``transformWithState`` (Row-based), the same processor;
* ``native-count`` - ``groupBy(key).count()``: Spark's own stateful
  aggregation over the same state store, no Python, the floor.

Read from ``query.recentProgress``: rows per micro-batch, batch durations,
rows/s processed, and whether the query kept up with the source.

    python benchmarks/streaming_state_store.py            # 20,000 rows/s, 1,000 keys, 30 s each (~4-6 min)
    python benchmarks/streaming_state_store.py --quick    # smoke run
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

VARIANTS = ("tws-pandas", "tws-row", "native-count")
# variant[:keys], e.g. tws-pandas:100 for a run with another number of keys.
DEFAULT_RUNS = "tws-pandas,tws-row,native-count"
_LABELS = {"tws-pandas": "transformWithStateInPandas", "tws-row": "transformWithState (Row)",
           "native-count": "groupBy().count() (JVM)"}
_ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# Seconds to wait, after the run, for the micro-batch in flight to finish.
_IN_FLIGHT_WAIT = 45.0


@dataclass
class Config:
    variant: str
    rate: int = 20_000
    keys: int = 1_000
    duration: float = 30.0

    @property
    def label(self) -> str:
        return f"{_LABELS[self.variant]}, {self.keys:,} keys"


@dataclass
class Result:
    config: Config
    error: str | None = None
    batches: list[dict] = field(default_factory=list)  # per micro-batch, from recentProgress and the sink
    wall_seconds: float = 0.0
    load: tuple[float, float] = (math.nan, math.nan)  # 1-minute load average at start and end
    first_batch_s: float = math.nan  # query start to the end of its first micro-batch

    def per_key_us(self, what: str) -> float:
        """Microseconds per key and micro-batch spent in ``state_us`` or ``handler_us``, all batches."""
        keys = sum(b["keys"] for b in self.batches if b[what])
        return sum(b[what] for b in self.batches) / keys if keys else math.nan

    def steady(self) -> list[dict]:
        """Batches with input: the first micro-batch (no input yet) is the query's start-up."""
        return [b for b in self.batches if b["rows"]]

    @property
    def rows(self) -> int:
        return sum(b["rows"] for b in self.batches)

    @property
    def rows_per_s(self) -> float:
        """Rows processed / time spent in micro-batches with input: the query's capacity at the
        batch sizes it ran (a backlog makes batches larger and amortises per-batch costs)."""
        s = self.steady()
        ms = sum(b["ms"] for b in s)
        return 1000 * sum(b["rows"] for b in s) / ms if ms else math.nan

    def batch_ms(self, q: float) -> float:
        s = self.steady()
        return float(np.percentile([b["ms"] for b in s], q)) if s else math.nan

    @property
    def kept_up(self) -> bool | None:
        """Back-to-back micro-batches take in what the source made meanwhile: the query keeps
        up when it processes at least the source's rate (its backlog shrinks). None: fewer than
        three batches with input, too few to tell."""
        if len(self.steady()) < 3:
            return None
        return self.rows_per_s >= self.config.rate


def run_variant(cfg: Config) -> Result:
    """Runs one variant in this process."""
    import pandas as pd
    from pyspark.sql import Row, SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

    load_start = os.getloadavg()[0]
    spark = (SparkSession.builder.master("local[2]").appName(f"bench-state-{cfg.variant}")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.default.parallelism", "2")
             .config("spark.sql.streaming.stateStore.providerClass", _ROCKSDB)
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    rows = (spark.readStream.format("rate").option("rowsPerSecond", cfg.rate)
            .option("numPartitions", 2).load()
            .select((F.col("value") % cfg.keys).alias("key"), "value"))

    # Each processor times its own state calls (exists, get, update) and its
    # whole handler per key, and emits them with the key's count: the state
    # store's per-key cost as Python sees it, apart from Spark's per-batch work.
    class PandasCounter(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.count = handle.getValueState("count", "n long")

        def handleInputRows(self, key, rows, timerValues):
            t0 = time.perf_counter()
            n = sum(len(pdf) for pdf in rows)
            t1 = time.perf_counter()
            total = (self.count.get()[0] if self.count.exists() else 0) + n
            self.count.update((total,))
            t2 = time.perf_counter()
            yield pd.DataFrame({"key": [key[0]], "n": [total], "state_us": [1e6 * (t2 - t1)],
                                "handler_us": [1e6 * (t2 - t0)]})

        def close(self) -> None:
            pass

    class RowCounter(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.count = handle.getValueState("count", "n long")

        def handleInputRows(self, key, rows, timerValues):
            t0 = time.perf_counter()
            n = sum(1 for _ in rows)
            t1 = time.perf_counter()
            total = (self.count.get()[0] if self.count.exists() else 0) + n
            self.count.update((total,))
            t2 = time.perf_counter()
            yield Row(key=key[0], n=total, state_us=1e6 * (t2 - t1), handler_us=1e6 * (t2 - t0))

        def close(self) -> None:
            pass

    schema = "key long, n long, state_us double, handler_us double"
    grouped = rows.groupBy("key")
    if cfg.variant == "tws-pandas":
        out = grouped.transformWithStateInPandas(PandasCounter(), schema, "Update", "None")
    elif cfg.variant == "tws-row":
        out = grouped.transformWithState(RowCounter(), schema, "Update", "None")
    else:
        out = (grouped.count().withColumn("state_us", F.lit(None).cast("double"))
               .withColumn("handler_us", F.lit(None).cast("double")))
    sunk: dict[int, dict] = {}

    def sink(df, batch_id: int) -> None:
        # The batch's only action: it runs the stateful operator once, like a noop sink.
        r = df.agg(F.count("*"), F.sum("state_us"), F.sum("handler_us")).first()
        sunk[batch_id] = {"keys": r[0], "state_us": r[1] or 0.0, "handler_us": r[2] or 0.0}

    checkpoint = tempfile.mkdtemp(prefix="bench-state-store-")
    start = time.time()
    query = (out.writeStream.foreachBatch(sink).outputMode("update")
             .option("checkpointLocation", checkpoint).start())
    try:
        # The clock starts when the first micro-batch (start-up, no input yet)
        # is done: on a loaded machine it alone can take half a minute.
        while not query.recentProgress and time.time() < start + _IN_FLIGHT_WAIT * 2:
            if query.exception():
                raise RuntimeError(str(query.exception()))
            time.sleep(0.2)
        measured_from = time.time()
        while time.time() < measured_from + cfg.duration:
            if query.exception():
                raise RuntimeError(str(query.exception()))
            time.sleep(0.5)
        # Let the micro-batch in flight finish: with batches of several seconds,
        # stopping at once would drop the last (and, early on, the only) one.
        running = len(query.recentProgress)
        give_up = time.time() + _IN_FLIGHT_WAIT
        while len(query.recentProgress) == running and time.time() < give_up and not query.exception():
            time.sleep(0.2)
        progress = list(query.recentProgress)
    finally:
        query.stop()
        spark.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)
    batches = []
    for p in progress:
        ops = p.get("stateOperators") or [{}]
        batches.append({
            "batch": p["batchId"], "rows": p["numInputRows"],
            "ms": p["durationMs"].get("triggerExecution", 0),
            "add_ms": p["durationMs"].get("addBatch", 0),
            "state_rows": ops[0].get("numRowsTotal", 0),
            "commit_ms": ops[0].get("commitTimeMs", 0),
            "t": p["timestamp"], **sunk.get(p["batchId"], {"keys": 0, "state_us": 0.0, "handler_us": 0.0})})
    return Result(cfg, batches=batches, wall_seconds=time.time() - start,
                  load=(load_start, os.getloadavg()[0]), first_batch_s=measured_from - start)


def _run_in_subprocess(cfg: Config) -> Result:
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", json.dumps(asdict(cfg))],
                          capture_output=True, text=True, timeout=cfg.duration + _IN_FLIGHT_WAIT * 3 + 120)
    if proc.returncode != 0:
        tail = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        err = next((line for line in reversed(tail) if "Error" in line or "Exception" in line),
                   tail[-1] if tail else "no error output")
        print(proc.stderr[-4000:], file=sys.stderr)
        return Result(cfg, error=err[:600])
    return _result_from_dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _result_from_dict(data: dict) -> Result:
    return Result(**{**data, "config": Config(**data["config"]), "load": tuple(data["load"])})


def _fmt(x: float, spec: str = ",.0f") -> str:
    return "-" if math.isnan(x) else format(x, spec)


def _plot(results: list[Result], cmd: str, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        if not r.batches:
            continue
        t0 = r.batches[0]["batch"]
        ids = [b["batch"] - t0 for b in r.batches]
        axes[0].plot(ids, [b["ms"] / 1000 for b in r.batches], "o-", ms=3, label=r.config.label)
        axes[1].plot(ids, [b["rows"] for b in r.batches], "o-", ms=3, label=r.config.label)
    axes[0].set_yscale("log")
    axes[0].set_xlabel("micro-batch")
    axes[0].set_ylabel("duration (s)")
    axes[0].set_title("micro-batch duration")
    from matplotlib.ticker import FuncFormatter

    axes[1].yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    axes[1].set_xlabel("micro-batch")
    axes[1].set_ylabel("input rows")
    axes[1].set_title("rows per micro-batch")
    for ax in axes:
        ax.legend(fontsize=8)
    fig.suptitle(f"reproduce: {cmd}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _write_report(results: list[Result], cmd: str, out_dir: str) -> None:
    _plot(results, cmd, os.path.join(out_dir, "streaming_state_store.png"))
    c = results[0].config
    lines = [
        "# Spark state store behind transformWithState, from Python",
        "",
        f"Reproduce: `{cmd}` (writes this file, `streaming_state_store.json` and `streaming_state_store.png`; `--report-only` rewrites them from the JSON). 2-core VM shared "
        "with other jobs (the load column is the 1-minute load average at the start and end of "
        "each variant); each variant in its own process, one after the other.",
        "",
        f"Setup: PySpark's rate source at {c.rate:,} rows/s (2 partitions), key = value mod "
        f"{c.keys:,}, RocksDB state store provider, local[2], 2 shuffle partitions, default trigger "
        f"(next micro-batch as soon as the previous ends), {c.duration:g} s per variant from the end "
        "of the first micro-batch (start-up, no input), plus the micro-batch then in flight. A `ValueState` counter per key: read, add the batch's rows, "
        "write, emit (key, count); a `foreachBatch` sink aggregates the batch's output (its only "
        "action). The first micro-batch has no input (the query's start-up: JVM code generation, "
        "Python workers, the first RocksDB instances) and is reported apart; the other columns are "
        "over the batches with input. Rows/s = their rows / their duration: the query's capacity "
        "at the batch sizes it ran; it keeps up when that is at least the source's rate. The "
        "processors time their own state calls (`exists`, `get`, `update`) and their whole handler "
        "per key: the state column is the state store's cost per key and micro-batch as Python "
        "sees it.",
        "",
        "| variant | load | first batch s | batches with input | rows | rows/s | batch p50 s "
        "| batch max s | state calls us/key | handler us/key | state calls share of batch time | kept up |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        name = r.config.label
        if r.error:
            lines.append(f"| {name} | | not run: `{r.error}` |||||||||")
            continue
        first = next((b["ms"] / 1000 for b in r.batches if not b["rows"]), math.nan)
        s = r.steady()
        ms = sum(b["ms"] for b in s)
        share = sum(b["state_us"] for b in s) / 1000 / ms if ms else math.nan
        lines.append(
            f"| {name} | {r.load[0]:.1f} -> {r.load[1]:.1f} | {_fmt(first, '.1f')} | {len(s)} | {r.rows:,} | "
            f"{_fmt(r.rows_per_s)} | {_fmt(r.batch_ms(50) / 1000, '.2f')} | "
            f"{_fmt(r.batch_ms(100) / 1000, '.2f')} | {_fmt(r.per_key_us('state_us'), ',.0f')} | "
            f"{_fmt(r.per_key_us('handler_us'), ',.0f')} | "
            f"{'-' if math.isnan(share) or not share else f'{100 * share:.0f} %'} | {_kept_up(r)} |")
    lines += ["", "![batches](streaming_state_store.png)", "", "## Ratios", ""]
    ok = [r for r in results if not r.error and r.steady()]
    native = next((r for r in ok if r.config.variant == "native-count"), None)
    for r in ok:
        if r is not native and native and native.config.keys == r.config.keys:
            lines.append(f"- {r.config.label} / native count: rows/s "
                         f"{r.rows_per_s / native.rows_per_s:.2f}x, batch p50 "
                         f"{r.batch_ms(50) / native.batch_ms(50):.2f}x (each at the batch sizes its "
                         "own backlog made).")
    for r in ok:
        state = r.per_key_us("state_us")
        if not math.isnan(state):
            lines.append(f"- {r.config.label}: its state calls alone cost {state / 1000:.1f} ms per key, "
                         f"{state * r.config.keys / 1e6:.1f} s of every micro-batch that touches all "
                         f"{r.config.keys:,} keys, however few rows it holds; the whole handler "
                         f"{r.per_key_us('handler_us') / 1000:.1f} ms per key.")
    python_rows = [b["rows"] for r in ok if r.config.variant != "native-count" for b in r.steady()]
    lines += [
        "",
        "## Reading the numbers",
        "",
        "- Each `ValueState` call (`exists`, `get`, `update`; up to three per key here) is a "
        "protobuf request and response between the Python worker and the JVM's state server over a "
        "local socket (`pyspark/sql/streaming/value_state_client.py`). The timings are wall time in "
        "the Python worker: on this machine, with other jobs holding the two cores (load column), "
        "they include waiting for the JVM thread and the worker to be scheduled. They are what a "
        "runner built on this API pays per key and micro-batch on a machine this busy; an idle one "
        "should pay less (not measured here).",
        "- That cost grows with the keys a batch touches, not with its rows: a floor under the "
        "micro-batch duration, hence under latency, once there are many keys. Larger batches "
        "amortise it"
        + (f"; the Python variants' batches held {min(python_rows):,}-{max(python_rows):,} rows."
           if python_rows else "."),
    ]
    if native:
        lines.append(f"- The native count runs the same aggregation in the JVM over the same RocksDB "
                     f"store: batch p50 {native.batch_ms(50) / 1000:.2f} s at "
                     f"{float(np.median([b['rows'] for b in native.steady()])):,.0f} rows (median).")
    lines += [
        "",
        "## Micro-batches (input rows, seconds)",
        "",
    ]
    for r in results:
        if not r.error:
            lines.append(f"- {r.config.label}, first batch ended {r.first_batch_s:.1f} s after start: " + ", ".join(
                f"({b['rows']:,}, {b['ms'] / 1000:.1f})" for b in r.batches))
    errors = [r for r in results if r.error]
    if errors:
        lines += ["", "## Errors", ""]
        lines += [f"- {r.config.label}: `{r.error}`" for r in errors]
    with open(os.path.join(out_dir, "streaming_state_store.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def _kept_up(r: Result) -> str:
    kept = r.kept_up
    return f"too few batches ({len(r.steady())})" if kept is None else ("yes" if kept else "no")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 2,000 rows/s, 100 keys, 10 s")
    parser.add_argument("--rate", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--variants", default=DEFAULT_RUNS,
                        help=f"comma-separated variant[:keys], variants {','.join(VARIANTS)}")
    parser.add_argument("--out", default=os.path.join(_ROOT, "docs", "benchmarks"))
    parser.add_argument("--report-only", action="store_true",
                        help="rewrite the report from the last run's streaming_state_store.json")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        result = run_variant(Config(**json.loads(args.one)))
        print(json.dumps(asdict(result)))
        return
    saved = os.path.join(args.out, "streaming_state_store.json")
    if args.report_only:
        with open(saved) as f:
            data = json.load(f)
        _write_report([_result_from_dict(d) for d in data["results"]], data["command"], args.out)
        return
    cmd = "python benchmarks/streaming_state_store.py"
    if args.quick:
        args.rate, args.keys, args.duration = 2_000, 100, 10.0
        cmd += " --quick"
    else:
        for name, default in (("rate", 20_000), ("keys", 1_000), ("duration", 30.0)):
            if getattr(args, name) != default:
                cmd += f" --{name} {getattr(args, name):g}"
    results = []
    for run in [v for v in args.variants.split(",") if v]:
        variant, _, keys = run.partition(":")
        if variant not in VARIANTS:
            parser.error(f"--variants: unknown {variant!r}; choose from {VARIANTS}")
        r = _run_in_subprocess(Config(variant, args.rate, int(keys) if keys else args.keys, args.duration))
        results.append(r)
        if r.error:
            print(f"{run:16s} error: {r.error}", flush=True)
        else:
            print(f"{run:16s} load={r.load[0]:.1f}->{r.load[1]:.1f} batches={len(r.batches)} rows={r.rows:,} "
                  f"state={_fmt(r.per_key_us('state_us'))} us/key handler={_fmt(r.per_key_us('handler_us'))} us/key "
                  f"steady {_fmt(r.rows_per_s)} rows/s "
                  f"batch p50={_fmt(r.batch_ms(50) / 1000, '.2f')} s max={_fmt(r.batch_ms(100) / 1000, '.2f')} s "
                  f"first={[round(b['ms'] / 1000, 1) for b in r.batches[:5]]} kept_up={_kept_up(r)}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(saved, "w") as f:
        json.dump({"command": cmd, "results": [asdict(r) for r in results]}, f, indent=1)
    _write_report(results, cmd, args.out)
    print(f"wrote {os.path.join(args.out, 'streaming_state_store.md')}")


if __name__ == "__main__":
    main()
