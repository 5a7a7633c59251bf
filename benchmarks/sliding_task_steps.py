"""Where one task of the Beam sliding pipeline spends its time, step by step, in one process.

SparkRunner runs ``ReadFromParquet -> SlidingAggregate -> Map -> WriteToParquet``
(``sliding.py``'s headline pipeline) as a read-and-cut task, a shuffle, and
one task per key partition. This script takes one such partition of the
benchmark's data and runs that task's code path by hand, timing each step:
the window computation, the feature and event dicts, the batches of elements,
the user's ``Map`` as an element-object stage, the rows made into Arrow
columns, and the Parquet encoding. No Spark: the figures are the task's own
work, per event, best of ``--repeat``. The Python worker's collector
threshold is applied as SparkRunner's workers apply it (``--default-gc`` to
keep CPython's).

    python benchmarks/sliding_task_steps.py                 # 1M events, 100 keys, 1 minute, partition 1 of 4
    python benchmarks/sliding_task_steps.py --window 86400 --default-gc
"""
from __future__ import annotations

import argparse
import gc
import io
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import apache_beam as beam  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from apache_beam.internal import pickler  # noqa: E402
from sliding import make_data, plan_for  # noqa: E402

from beam_ext.runner._element_batches import bounded_batches, values_per_window  # noqa: E402
from beam_ext.runner.native import _sliding  # noqa: E402
from beam_ext.runner.native._arrow_rows import row_dicts  # noqa: E402
from beam_ext.runner.native._parquetio import _row_tables  # noqa: E402
from beam_ext.runner.worker._direct import DirectChain, DirectStep, run_direct_chain  # noqa: E402
from beam_ext.runner.worker._gc import WORKER_GC_THRESHOLD  # noqa: E402
from beam_ext.transforms.sliding._vectorised import compute_columns, feature_dicts  # noqa: E402

SCHEMA = pa.schema([("id", pa.int64()), ("n_w", pa.int64()), ("s_w", pa.float64()), ("mu_w", pa.float64())])


def _to_row(ef):
    return {"id": ef[0]["id"], **ef[1]}


def _task(plan, parts, chain) -> dict[str, float]:
    """One run of the task's steps over ``parts``; seconds per step."""
    times: dict[str, float] = {}
    start = time.perf_counter()

    def step(name: str) -> None:
        nonlocal start
        now = time.perf_counter()
        times[name] = now - start
        start = now

    codes: dict[bytes, int] = {}
    key_codes = np.concatenate([np.asarray([codes.setdefault(e, len(codes)) for e in encoded], dtype=np.int64)[index]
                                for _, encoded, index, _, _ in parts])
    event_times = np.concatenate([p[3] for p in parts])
    columns = [np.concatenate([p[4][0] for p in parts])]
    feats = compute_columns(plan, key_codes, event_times, columns)
    step("windows computed (compute_columns)")
    features = feature_dicts(feats, len(key_codes))
    step("feature dicts")
    events = [event for table, *_ in parts for event in row_dicts(table)]
    step("event dicts (Arrow to_pylist)")
    batches = list(bounded_batches(list(zip(events, features))))
    step("batches of elements")
    outputs = list(run_direct_chain(chain, None, iter(batches), [], batches_out=True))
    step("the user's Map, as an element-object stage")
    tables = list(_row_tables(SCHEMA, 64 << 20, 1000, values_per_window(outputs)))
    step("rows to Arrow columns (WriteToParquet)")
    writer = pq.ParquetWriter(io.BytesIO(), SCHEMA)
    for table in tables:
        writer.write_table(table)
    writer.close()
    step("Parquet encoding")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--window", type=float, default=60.0, help="window size in seconds")
    parser.add_argument("--partitions", type=int, default=4, help="key partitions; the first is timed")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--default-gc", action="store_true", help="keep CPython's collector thresholds")
    args = parser.parse_args()
    if not args.default_gc:
        gc.set_threshold(WORKER_GC_THRESHOLD, *gc.get_threshold()[1:])
    data = make_data(args.events, args.keys)
    table = pa.table({"id": np.arange(args.events), "key": data["key"], "ts": data["ts"], "amount": data["amount"]})
    plan = plan_for(args.window)
    parts = [part for target, part in _sliding._table_parts(plan, args.partitions, table) if target == 0]
    chain = DirectChain((DirectStep("Map", pickler.dumps((beam.Map(_to_row).fn, (), {}, [], None)), None),),
                        None, None)
    runs = [_task(plan, parts, chain) for _ in range(args.repeat)]
    events = sum(p[0].num_rows for p in parts)
    best = {name: min(run[name] for run in runs) for name in runs[0]}
    total = sum(best.values())
    print("A profile of one task's own work, run by hand without Spark; not an end-to-end figure "
          "(the headline is benchmarks/sliding.py: the Beam pipeline on SparkRunner against Spark SQL).")
    print(f"{events:,} events (key partition 1 of {args.partitions}), window {args.window:g} s, "
          f"collector threshold {gc.get_threshold()[0]:,}; best of {args.repeat}")
    print("| step | s | share | us/event |\n|---|---:|---:|---:|")
    for name, seconds in best.items():
        print(f"| {name} | {seconds:.3f} | {100 * seconds / total:.1f}% | {1e6 * seconds / events:.2f} |")
    print(f"| all | {total:.3f} | 100% | {1e6 * total / events:.2f} |")


if __name__ == "__main__":
    main()
