"""Beam's schema-aware ``GroupBy`` per element, in one process: its ``Map`` and its rows' encoding.

Times, over 100,000 ``beam.Row(key=int, j=int, amount=float)`` elements:

- the ``Map`` of a ``GroupBy`` without aggregation (one key field, then
  two), as Beam's expansion makes it (its key function built anew for
  every element) and as SparkRunner's object stages run it
  (``runner/worker/_schema_group_by.py: grouped_pairs``);
- the ``Map`` of ``GroupBy("key").aggregate_field("amount", sum, ...)``
  as Beam's expansion makes it, and as ``AggregatedFields.pairs`` reads
  the fields for the partial combine;
- Beam's ``RowCoder`` encoding and decoding of a ``(key, amount)`` row:
  what a shuffle of whole rows pays per element without blocks of columns;
- a Spark task's write of a ``GroupBy("key")``'s rows into its shuffle
  (rows held as fields, written as blocks): with the ``GroupBy``'s ``Map``
  (its key function built once) run as a step, as before 2026-11-28, and
  as the object stages run it now, the shuffle's writer pairing each row
  with its key
  (``runner/worker/_direct.py: _ChainRun.line``).

Both sides of each pair run alternately in the same process. Prints the
minimum of 7 runs in nanoseconds per element:

    cd /tmp && PYTHONPATH=<checkout> python <checkout>/benchmarks/schema_rows.py

This is a secondary, in-process figure: the pipelines users run are timed by
``runner_throughput.py`` and ``runner_ab.py`` (cases ``rows`` and ``rows_grouped``).
"""
from __future__ import annotations

import gc
import time
from typing import Callable

import apache_beam as beam
from apache_beam.coders import coders, row_coder
from apache_beam.internal import pickler
from apache_beam.transforms.window import GlobalWindows
from apache_beam.typehints.row_type import RowTypeConstraint

from beam_ext.runner._element_batches import batched
from beam_ext.runner._row_columns import RowColumns
from beam_ext.runner._shuffle import ShuffleWriter
from beam_ext.runner.worker import _direct
from beam_ext.runner.worker._schema_group_by import aggregated_fields, closure

_N = 100_000


def _map_dofn(grouping) -> beam.DoFn:
    """The DoFn of ``grouping``'s ``Map``, pickled and back as a worker gets it."""
    found: dict = {}

    class Visitor(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            found[node.full_label] = node.transform

    p = beam.Pipeline()
    _ = p | beam.Create([beam.Row(key=0, j=0, amount=0.0)]) | "G" >> grouping
    p.visit(Visitor())
    [pardo] = [t for label, t in found.items() if label.startswith("G/Map(")]
    return pickler.loads(pickler.dumps(pardo.fn))


def _maps(grouping) -> tuple[Callable, Callable]:
    """Beam's ``Map`` function of ``grouping`` as a worker gets it, and the object stages' one."""
    dofn = _map_dofn(grouping)
    return closure(dofn._fn)["fn"], _direct._map_fn(dofn)


def _into_shuffle(rows: list) -> tuple[Callable, Callable]:
    """Runs of a task's chain of ``GroupBy("key")``'s ``Map`` into its shuffle
    write: the ``Map`` as a user's step, and as the object stages run it."""
    schema = RowTypeConstraint.from_fields([("key", int), ("j", int), ("amount", float)])
    pairs = coders.TupleCoder([coders.FastPrimitivesCoder(),
                               coders.LengthPrefixCoder(row_coder.RowCoder.from_type_hint(schema, None))])
    writer = ShuffleWriter(coders.WindowedValueCoder(pairs, coders.GlobalWindowCoder()), trivial=True,
                           rows=RowColumns.of(pairs.value_coder()))
    dofn = _map_dofn(beam.GroupBy("key"))
    # The object stages' pairing function, which is not Beam's code: run as any Map.
    as_a_step = beam.Map(_direct._map_fn(dofn)).fn

    def chain(map_dofn: beam.DoFn) -> _direct.DirectChain:
        step = _direct.DirectStep("G/Map", pickler.dumps((map_dofn, (), {}, None, None)), GlobalWindows())
        return _direct.DirectChain((step,), None, None, shuffle=writer, partitions=2)

    values = [GlobalWindows.windowed_value(row) for row in rows]

    def run(chain: _direct.DirectChain) -> Callable[[], object]:
        return lambda: list(_direct.run_direct_chain(chain, None, batched(iter(values), 1000), []))
    return run(chain(as_a_step)), run(chain(dofn))


def _ns(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) / _N * 1e9


def main() -> None:
    # Python workers run with this young-generation threshold (runner/worker/_gc.py).
    gc.set_threshold(100_000)
    rows = [beam.Row(key=i % 1000, j=i % 3, amount=float(i)) for i in range(_N)]
    cases: list[tuple[str, Callable[[], object], Callable[[], object]]] = []
    for label, grouping in (("GroupBy('key') Map", beam.GroupBy("key")),
                            ("GroupBy('key', 'j') Map", beam.GroupBy("key", "j"))):
        beams, ours = _maps(grouping)
        cases.append((label, lambda f=beams: list(map(f, rows)), lambda f=ours: list(map(f, rows))))
    beams, _ = _maps(beam.GroupBy("key").aggregate_field("amount", sum, "total"))
    fields = aggregated_fields(beams)
    cases.append(("aggregate_field Map / fields' pairs", lambda: list(map(beams, rows)),
                  lambda: fields.pairs(rows)))
    impl = row_coder.RowCoder.from_type_hint(
        RowTypeConstraint.from_fields([("key", int), ("amount", float)]), None).get_impl()
    two = [beam.Row(key=r.key, amount=r.amount) for r in rows]
    encoded = [impl.encode_nested(r) for r in two]
    cases.append(("RowCoder encode / decode", lambda: list(map(impl.encode_nested, two)),
                  lambda: list(map(impl.decode_nested, encoded))))
    cases.append(("GroupBy('key') into its shuffle", *_into_shuffle(rows)))
    print(f"{'case':40} {'Beam / first':>14} {'ours / second':>14}  (ns an element, min of 7)")
    for label, first, second in cases:
        a, b = [], []
        for _ in range(7):
            a.append(_ns(first))
            b.append(_ns(second))
        print(f"{label:40} {min(a):14.0f} {min(b):14.0f}")


if __name__ == "__main__":
    main()
