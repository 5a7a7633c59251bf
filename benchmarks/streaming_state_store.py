"""Per-key cost of Spark's state store behind transformWithState, from Python.

A rate source at ``--rate`` rows/s (two partitions), key = value mod
``--keys``, the RocksDB state store provider, ``local[2]``, two shuffle
partitions, a ``noop`` sink in update mode. Side by side in one run, each in
its own process (a fresh JVM), one after the other:

* ``tws-pandas`` - ``transformWithStateInPandas``: a ``ValueState`` counter
  per key, the batch's rows of a key arrive as pandas DataFrames;
* ``tws-row`` - ``transformWithState`` (Row-based), the same processor;
* ``native-count`` - ``groupBy(key).count()``: Spark's own stateful
  aggregation over the same state store, no Python, the floor.

Read from ``query.recentProgress``: rows per micro-batch, batch durations,
rows/s processed, and whether the query kept up with the source.

    python benchmarks/streaming_state_store.py            # 20,000 rows/s, 1,000 keys, 45 s each (~4 min)
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
# variant[:keys]; the second transformWithStateInPandas run with a tenth of
# the keys separates the per-key cost from the per-batch and per-row ones.
DEFAULT_RUNS = "tws-pandas,tws-pandas:100,tws-row,native-count"
_LABELS = {"tws-pandas": "transformWithStateInPandas", "tws-row": "transformWithState (Row)",
           "native-count": "groupBy().count() (JVM)"}
_ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# Batches started in the first seconds pay JVM code generation, Python worker
# start-up and the first RocksDB instances: they are shown, not averaged.
_WARMUP_BATCHES = 3


@dataclass
class Config:
    variant: str
    rate: int = 20_000
    keys: int = 1_000
    duration: float = 40.0

    @property
    def label(self) -> str:
        return f"{_LABELS[self.variant]}, {self.keys:,} keys"


@dataclass
class Result:
    config: Config
    error: str | None = None
    batches: list[dict] = field(default_factory=list)  # per micro-batch: t, rows, ms, state_rows, commit_ms
    wall_seconds: float = 0.0

    def steady(self) -> list[dict]:
        return [b for b in self.batches if b["rows"]][_WARMUP_BATCHES:]

    @property
    def rows(self) -> int:
        return sum(b["rows"] for b in self.batches)

    @property
    def rows_per_s(self) -> float:
        """Rows processed / time spent in micro-batches, after the warm-up batches."""
        s = self.steady()
        ms = sum(b["ms"] for b in s)
        return 1000 * sum(b["rows"] for b in s) / ms if ms else math.nan

    def batch_ms(self, q: float) -> float:
        s = self.steady()
        return float(np.percentile([b["ms"] for b in s], q)) if s else math.nan

    @property
    def kept_up(self) -> bool:
        """Back-to-back micro-batches take in what the source made meanwhile: a query that
        keeps up processes about the source's rate; one that does not, less, with growing batches."""
        return self.rows_per_s >= 0.9 * self.config.rate


def run_variant(cfg: Config) -> Result:
    """Runs one variant in this process."""
    import pandas as pd
    from pyspark.sql import Row, SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle

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

    class PandasCounter(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.count = handle.getValueState("count", "n long")

        def handleInputRows(self, key, rows, timerValues):
            n = sum(len(pdf) for pdf in rows)
            total = (self.count.get()[0] if self.count.exists() else 0) + n
            self.count.update((total,))
            yield pd.DataFrame({"key": [key[0]], "n": [total]})

        def close(self) -> None:
            pass

    class RowCounter(StatefulProcessor):
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.count = handle.getValueState("count", "n long")

        def handleInputRows(self, key, rows, timerValues):
            n = sum(1 for _ in rows)
            total = (self.count.get()[0] if self.count.exists() else 0) + n
            self.count.update((total,))
            yield Row(key=key[0], n=total)

        def close(self) -> None:
            pass

    grouped = rows.groupBy("key")
    if cfg.variant == "tws-pandas":
        out = grouped.transformWithStateInPandas(PandasCounter(), "key long, n long", "Update", "None")
    elif cfg.variant == "tws-row":
        out = grouped.transformWithState(RowCounter(), "key long, n long", "Update", "None")
    else:
        out = grouped.count()
    checkpoint = tempfile.mkdtemp(prefix="bench-state-store-")
    start = time.time()
    query = (out.writeStream.format("noop").outputMode("update")
             .option("checkpointLocation", checkpoint).start())
    try:
        while time.time() < start + cfg.duration:
            if query.exception():
                raise RuntimeError(str(query.exception()))
            time.sleep(0.5)
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
            "t": p["timestamp"]})
    return Result(cfg, batches=batches, wall_seconds=time.time() - start)


def _run_in_subprocess(cfg: Config) -> Result:
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", json.dumps(asdict(cfg))],
                          capture_output=True, text=True, timeout=cfg.duration + 180)
    if proc.returncode != 0:
        tail = [line for line in proc.stderr.strip().splitlines() if line.strip()]
        err = next((line for line in reversed(tail) if "Error" in line or "Exception" in line),
                   tail[-1] if tail else "no error output")
        print(proc.stderr[-4000:], file=sys.stderr)
        return Result(cfg, error=err[:600])
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return Result(Config(**data["config"]), data["error"], data["batches"], data["wall_seconds"])


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
    axes[1].set_yscale("log")
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
        f"Reproduce: `{cmd}` (writes this file and `streaming_state_store.png`). 2-core VM shared "
        "with other jobs; each variant in its own process, one after the other.",
        "",
        f"Setup: PySpark's rate source at {c.rate:,} rows/s (2 partitions), key = value mod "
        f"{c.keys:,}, RocksDB state store provider, local[2], 2 shuffle partitions, `noop` sink in "
        f"update mode, {c.duration:g} s per variant, default trigger (next micro-batch as soon as "
        "the previous ends). A `ValueState` counter per key: read, add the batch's rows, write, emit "
        f"(key, count). The first {_WARMUP_BATCHES} micro-batches with input are warm-up (JVM code "
        "generation, Python workers, first RocksDB instances) and are left out of the steady-state "
        "columns; per key-update = steady batch time / keys updated per batch.",
        "",
        "| variant | batches | rows | warm-up batches s | steady rows/s | batch p50 s | batch max s "
        "| rows/batch p50 | ms per key-update | kept up |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        name = r.config.label
        if r.error:
            lines.append(f"| {name} | not run: `{r.error}` |||||||||")
            continue
        s = r.steady()
        warm = ", ".join(f"{b['ms'] / 1000:.1f}" for b in [b for b in r.batches if b["rows"]][:_WARMUP_BATCHES])
        keys_per_batch = [min(b["rows"], r.config.keys) for b in s]
        per_key = (sum(b["ms"] for b in s) / sum(keys_per_batch)) if s else math.nan
        rows_p50 = float(np.percentile([b["rows"] for b in s], 50)) if s else math.nan
        lines.append(
            f"| {name} | {len(r.batches)} | {r.rows:,} | {warm} | {_fmt(r.rows_per_s)} | "
            f"{_fmt(r.batch_ms(50) / 1000, '.2f')} | {_fmt(r.batch_ms(100) / 1000, '.2f')} | "
            f"{_fmt(rows_p50)} | {_fmt(per_key, '.3f')} | {'yes' if r.kept_up else 'no'} |")
    lines += ["", "![batches](streaming_state_store.png)", "", "## Ratios", ""]
    ok = [r for r in results if not r.error and r.steady()]
    native = next((r for r in ok if r.config.variant == "native-count"), None)
    for r in ok:
        same = native and native.config.keys == r.config.keys
        if r is not native and same:
            extra = (r.batch_ms(50) - native.batch_ms(50)) / r.config.keys
            lines.append(f"- {r.config.label} / native count: steady rows/s "
                         f"{r.rows_per_s / native.rows_per_s:.2f}x, batch p50 "
                         f"{r.batch_ms(50) / native.batch_ms(50):.2f}x: the Python state API adds "
                         f"~{extra:.2f} ms per key and micro-batch (batch p50 difference / keys).")
    pandas_runs = sorted((r for r in ok if r.config.variant == "tws-pandas"), key=lambda r: r.config.keys)
    if len(pandas_runs) > 1:
        lo, hi = pandas_runs[0], pandas_runs[-1]
        slope = (hi.batch_ms(50) - lo.batch_ms(50)) / (hi.config.keys - lo.config.keys)
        lines.append(f"- transformWithStateInPandas, {lo.config.keys:,} vs {hi.config.keys:,} keys: batch p50 "
                     f"{lo.batch_ms(50) / 1000:.2f} s vs {hi.batch_ms(50) / 1000:.2f} s, i.e. "
                     f"~{slope:.2f} ms per extra key and micro-batch (rows per batch differ too: "
                     f"see the table).")
    errors = [r for r in results if r.error]
    if errors:
        lines += ["", "## Errors", ""]
        lines += [f"- {r.config.label}: `{r.error}`" for r in errors]
    with open(os.path.join(out_dir, "streaming_state_store.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 2,000 rows/s, 100 keys, 15 s")
    parser.add_argument("--rate", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--duration", type=float, default=40.0)
    parser.add_argument("--variants", default=DEFAULT_RUNS,
                        help=f"comma-separated variant[:keys], variants {','.join(VARIANTS)}")
    parser.add_argument("--out", default=os.path.join(_ROOT, "docs", "benchmarks"))
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        result = run_variant(Config(**json.loads(args.one)))
        print(json.dumps(asdict(result)))
        return
    cmd = "python benchmarks/streaming_state_store.py"
    if args.quick:
        args.rate, args.keys, args.duration = 2_000, 100, 30.0
        cmd += " --quick"
    else:
        for name, default in (("rate", 20_000), ("keys", 1_000), ("duration", 40.0)):
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
            print(f"{run:16s} batches={len(r.batches)} rows={r.rows:,} steady {_fmt(r.rows_per_s)} rows/s "
                  f"batch p50={_fmt(r.batch_ms(50) / 1000, '.2f')} s max={_fmt(r.batch_ms(100) / 1000, '.2f')} s "
                  f"first={[round(b['ms'] / 1000, 1) for b in r.batches[:5]]} kept_up={r.kept_up}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    _write_report(results, cmd, args.out)
    print(f"wrote {os.path.join(args.out, 'streaming_state_store.md')}")


if __name__ == "__main__":
    main()
