"""A key's schema rows through the shuffle, per row: RowCoder's encodings, a marshal block, an Arrow batch.

Times, for one key's rows of an int and a float (``beam.Row(key=...,
amount=...)``, as ``runner_throughput.py``'s ``rows_grouped`` makes them),
at several rows per key, in one process:

- write: from the rows to the bytes the shuffle carries: each row's
  ``RowCoder`` encoding (the path before 2026-11-28); what a stage on objects
  writes now, ``RowColumns.encode`` of the rows' field values: the columns
  in one ``marshal`` block (type checks included), or, for a key of fewer
  than ``_MIN_BLOCK_ROWS`` rows, each row encoded by ``RowCoder`` from its
  fields; the same columns as one Arrow IPC record batch;
- read: from those bytes to the named tuples a stage on objects gets:
  ``RowCoder``'s decode of each row; ``RowColumns.decode``; reading the Arrow
  batch and making the tuples from its columns' Python lists.

Arrow is here as the alternative the issue names for a columnar path; it is
not used. The paths run alternately, so the ratios hold however the
machine's speed drifts. Prints the minimum of 7 runs in nanoseconds per row:

    cd /tmp && PYTHONPATH=<checkout> python <checkout>/benchmarks/row_blocks.py
    cd /tmp && PYTHONPATH=<checkout> python <checkout>/benchmarks/row_blocks.py --held --sizes 1,2,3,4,8

``--held`` times the choice ``RowColumns`` makes at a flush, for rows already
held as their fields: one block, or each row encoded by ``RowCoder`` from its
fields (``_MIN_BLOCK_ROWS`` forced each way); it sets where blocks start.

This is a secondary, in-process figure: the pipeline users run is timed by
``runner_throughput.py`` and ``runner_ab.py`` (case ``rows_grouped``).
"""
from __future__ import annotations

import argparse
import gc
import time
from itertools import repeat
from typing import Callable

import apache_beam as beam
import pyarrow as pa
from apache_beam.coders import typecoders
from apache_beam.coders.coders import LengthPrefixCoder
from apache_beam.typehints.row_type import RowTypeConstraint

from beam_ext.runner import _row_columns
from beam_ext.runner._row_columns import RowColumns
from beam_ext.runner.worker._gc import WORKER_GC_THRESHOLD

_RUNS = 7
_ROWS = 200_000  # rows per measurement, in keys of --sizes rows each


def _timed(fn: Callable[[], object]) -> float:
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _paths(per_key: int):
    coder = LengthPrefixCoder(typecoders.registry.get_coder(
        RowTypeConstraint.from_fields([("key", int), ("amount", float)])))
    columns = RowColumns.of(coder)
    assert columns is not None
    impl = coder.get_impl()
    named = coder.value_coder().to_type_hint()
    keys = [[beam.Row(key=k, amount=float(i)) for i in range(per_key)] for k in range(_ROWS // per_key)]
    schema = pa.schema([("key", pa.int64()), ("amount", pa.float64())])

    def arrow_block(rows: list) -> bytes:
        cols = list(zip(*map(columns.fields, rows)))
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema) as writer:
            writer.write_batch(pa.record_batch([pa.array(cols[0], pa.int64()), pa.array(cols[1], pa.float64())],
                                               schema=schema))
        return sink.getvalue().to_pybytes()

    def arrow_rows(block: bytes) -> list:
        batch = pa.ipc.open_stream(block).read_next_batch()
        return list(map(tuple.__new__, repeat(named), zip(*(c.to_pylist() for c in batch.columns))))

    encoded = [b"".join(map(impl.encode_nested, rows)) for rows in keys]
    blocks = [columns.encode(list(map(columns.fields, rows))) for rows in keys]
    arrows = [arrow_block(rows) for rows in keys]
    expected = [[named(r.key, r.amount) for r in rows] for rows in keys]
    decode = impl.decode_all
    assert [list(decode(b)) for b in encoded] == expected
    assert [columns.decode(b) for b in blocks] == expected
    assert [arrow_rows(b) for b in arrows] == expected
    write = {
        "RowCoder, a row at a time": lambda: [b"".join(map(impl.encode_nested, rows)) for rows in keys],
        "RowColumns": lambda: [columns.encode(list(map(columns.fields, rows))) for rows in keys],
        "Arrow IPC batch": lambda: [arrow_block(rows) for rows in keys],
    }
    read = {
        "RowCoder, a row at a time": lambda: [list(decode(b)) for b in encoded],
        "RowColumns": lambda: [columns.decode(b) for b in blocks],
        "Arrow IPC batch": lambda: [arrow_rows(b) for b in arrows],
    }
    return write, read


def _held(per_key: int) -> dict[str, tuple[float, float]]:
    """Rows already held as their fields: a block against RowCoder encodings
    made from the fields (``_MIN_BLOCK_ROWS`` forced each way), ns per row
    written and read."""
    coder = LengthPrefixCoder(typecoders.registry.get_coder(
        RowTypeConstraint.from_fields([("key", int), ("amount", float)])))
    columns = RowColumns.of(coder)
    assert columns is not None
    keys = [[columns.fields(beam.Row(key=k, amount=float(i))) for i in range(per_key)]
            for k in range(_ROWS // per_key)]
    best = {"block": (float("inf"),) * 2, "encodings": (float("inf"),) * 2}
    threshold = _row_columns._MIN_BLOCK_ROWS
    try:
        for _ in range(_RUNS):
            for name, least in (("block", 1), ("encodings", 1 << 62)):
                _row_columns._MIN_BLOCK_ROWS = least
                data: list = []
                write = _timed(lambda: data.extend(columns.encode(rows) for rows in keys))
                read = _timed(lambda: [columns.decode(d) for d in data])
                best[name] = (min(best[name][0], write / _ROWS * 1e9), min(best[name][1], read / _ROWS * 1e9))
    finally:
        _row_columns._MIN_BLOCK_ROWS = threshold
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="4,10,100,2000", help="rows per key, comma-separated")
    parser.add_argument("--held", action="store_true",
                        help="rows held as fields: a block against RowCoder encodings made from them")
    args = parser.parse_args()
    # The collector as a Spark Python worker of the runner sets it (worker/_gc.py).
    first, *older = gc.get_threshold()
    gc.set_threshold(max(first, WORKER_GC_THRESHOLD), *older)
    print(f"ns per row over {_ROWS:,} rows of an int and a float; minimum of {_RUNS} runs")
    if args.held:
        for per_key in map(int, args.sizes.split(",")):
            cells = ", ".join(f"{name} {w:,.0f} + {r:,.0f} = {w + r:,.0f}" for name, (w, r) in _held(per_key).items())
            print(f"{per_key:>5} rows per key, held as fields, written + read: {cells}")
        return
    for per_key in map(int, args.sizes.split(",")):
        for end, paths in zip(("write", "read"), _paths(per_key)):
            times = {name: float("inf") for name in paths}
            for _ in range(_RUNS):  # the paths alternately, one run each
                for name, fn in paths.items():
                    times[name] = min(times[name], _timed(fn) / _ROWS * 1e9)
            base = times["RowCoder, a row at a time"]
            cells = ", ".join(f"{name} {ns:,.0f} ({base / ns:.2f}x)" for name, ns in times.items())
            print(f"{per_key:>5} rows per key, {end}: {cells}")


if __name__ == "__main__":
    main()
