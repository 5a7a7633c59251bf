"""Row dicts carried as Arrow tables between native steps.

A native read of columnar files (``ReadFromParquet``) yields a PCollection
of row dicts, one per row. Made into Python objects per row, encoded, and
decoded again by the next step, those rows cost more than the computation
that follows them. So the read returns :class:`ArrowRows` instead: the
tables themselves. A native consumer that can compute on columns (see
:data:`beam_ext.runner.native.READS_ARROW_ROWS`) takes them as they are;
for any other consumer the executor makes exactly the row dicts Beam's own
read makes: :meth:`ArrowRows.batches` for steps on element objects (as
batches of columns, which a ``Map`` that only picks fields and the Parquet
write take as they are), :meth:`ArrowRows.values` to be encoded.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Iterator

from apache_beam.utils.windowed_value import WindowedValue

from beam_ext.runner._element_batches import BOUNDED, ROW, Columns, ElementBatches


def row_dicts(table: Any) -> list[dict]:
    """The rows of ``table`` as Beam's ReadFromParquet yields them (``_ArrowTableToRowDictionaries``;
    of repeated names, the last column wins): its batch of columns' elements."""
    return table_columns(table).values()


def bounded_values(values: Iterable[Any]) -> Iterator[WindowedValue]:
    """``values`` as a bounded read's elements: global window, the minimum timestamp."""
    # with_value copies the template's fields; building a WindowedValue
    # converts the Timestamp again for every element, twice the cost.
    return map(BOUNDED.with_value, values)


def table_values(table: Any) -> Iterator[WindowedValue]:
    """The elements standing for ``table``'s rows."""
    return bounded_values(row_dicts(table))


def table_columns(table: Any) -> Columns:
    """The elements standing for ``table``'s rows, as a batch of its columns."""
    return Columns((tuple(zip(table.column_names, table.columns)),), ROW, table.num_rows)


@dataclasses.dataclass(frozen=True)
class ArrowRows:
    """A PCollection of row dicts, held as an RDD of ``pyarrow.Table``.

    Every element is in the global window at the minimum timestamp, as the
    output of a bounded read.
    """

    tables: Any  # RDD of pyarrow.Table

    def values(self) -> Any:
        """The RDD of ``WindowedValue`` row dicts these tables stand for."""
        return self.tables.flatMap(table_values)

    def batches(self) -> ElementBatches:
        """The row dicts these tables stand for, a batch of columns per table
        (a step that needs them gets the row dicts :func:`row_dicts` makes)."""
        return ElementBatches(self.tables.map(table_columns))
