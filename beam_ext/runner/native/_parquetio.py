"""ReadFromParquet(Batched) and WriteToParquet(Batched) on Spark, with Beam's results.

Reading: the pattern is matched on the driver with Beam's ``FileSystems``
(empty files skipped, as Beam's file-based source does). A file no larger
than its share of the input (total bytes / parallelism) is one Spark task;
a larger one is cut into runs of whole row groups of about that size, from
its footer. For ReadFromParquet a row group larger than that share is read
by several tasks, each keeping a range of its rows (a file of one row group
is as many tasks as it has shares, up to the parallelism). A task reads its
row groups with ``pyarrow.parquet`` exactly as Beam's ``_ParquetSource``
does (``read_row_group(i, columns)``, the file opened through
``FileSystems`` with the source's compression), so
``ReadFromParquetBatched`` yields Beam's tables, one per row group.
``ReadFromParquet`` returns those tables as
:class:`~beam_ext.runner.native._arrow_rows.ArrowRows`: a native reader of
columns takes them as they are, any other reader gets Beam's row dicts.

Writing: one shard per partition with Beam's own ``_ParquetSink``
(:func:`~beam_ext.runner.native._file_sink.write_shards`). WriteToParquet's
row dicts become the tables Beam's ``_RowDictionariesToArrowTable`` makes
(same record batches, same tables, same handling of missing fields), built
a column at a time; WriteToParquetBatched writes its tables as they come.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import operator
from typing import Any, Iterator

from apache_beam.io.filesystems import FileSystems

from beam_ext.runner._element_batches import ElementBatches, bounded_batches, column_values
from beam_ext.runner.native._arrow_rows import ArrowRows
from beam_ext.runner.native._file_sink import write_shards
from beam_ext.runner.native._file_tasks import parts_rdd

_LOG = logging.getLogger("beam_ext.runner")

READ_PARQUET_URN = "beam_ext:parquetio:read_from_parquet:v1"
READ_PARQUET_BATCHED_URN = "beam_ext:parquetio:read_from_parquet_batched:v1"
WRITE_PARQUET_URN = "beam_ext:parquetio:write_to_parquet:v1"
WRITE_PARQUET_BATCHED_URN = "beam_ext:parquetio:write_to_parquet_batched:v1"


@dataclasses.dataclass(frozen=True)
class ParquetReadConfig:
    """What the native read needs of a ReadFromParquet(Batched) (see ``_io_overrides``)."""

    pattern: str
    columns: tuple[str, ...] | None
    compression_type: str


@dataclasses.dataclass(frozen=True)
class ParquetWriteConfig:
    """A WriteToParquet(Batched): its sink, and for row dicts how Beam batches them (else None)."""

    sink: Any
    row_group_buffer_size: int | None = None
    record_batch_size: int | None = None


# -- reading ---------------------------------------------------------------
def _open(path: str, compression_type: str):
    return FileSystems.open(path, "application/octet-stream", compression_type=compression_type)


_Part = tuple[str, "tuple[int, ...] | None", "tuple[int, int] | None"]


def _parts(config: ParquetReadConfig, parallelism: int, split_row_groups: bool = False) -> list[tuple[_Part, int]]:
    """Each part's (file, row groups to read or None for all, rows of the one
    row group to keep or None for all), with its bytes. ``split_row_groups``: a row
    group worth several tasks is read by several, each keeping a range of
    its rows (the row dicts do not show where a table ended)."""
    import pyarrow.parquet as pq

    [match] = FileSystems.match([config.pattern])
    files = [(m.path, m.size_in_bytes) for m in match.metadata_list if m.size_in_bytes > 0]
    if not match.metadata_list:
        # As Beam's read with validate=False: no files, no rows (validate=True fails at construction).
        _LOG.warning("ReadFromParquet: the pattern %r matches no file; reading nothing", config.pattern)
    share = max(1, -(-sum(size for _, size in files) // max(parallelism, 1)))
    parts: list[tuple[_Part, int]] = []
    for path, size in files:
        if size <= share:
            parts.append(((path, None, None), size))
            continue
        with _open(path, config.compression_type) as f:
            metadata = pq.ParquetFile(f).metadata
        run: list[int] = []
        run_bytes = 0
        for i in range(metadata.num_row_groups):
            group = metadata.row_group(i)
            pieces = min(-(-group.total_byte_size // share), parallelism, group.num_rows)
            if split_row_groups and pieces > 1:
                if run:
                    parts.append(((path, tuple(run), None), run_bytes))
                    run, run_bytes = [], 0
                bounds = [group.num_rows * k // pieces for k in range(pieces + 1)]
                parts += [((path, (i,), (bounds[k], bounds[k + 1])), group.total_byte_size // pieces)
                          for k in range(pieces)]
                continue
            run.append(i)
            run_bytes += group.total_byte_size
            if run_bytes >= share:
                parts.append(((path, tuple(run), None), run_bytes))
                run, run_bytes = [], 0
        if run:
            parts.append(((path, tuple(run), None), run_bytes))
    return parts


def _read_part(config: ParquetReadConfig, part: _Part) -> Iterator[Any]:
    import pyarrow.parquet as pq

    path, row_groups, rows = part
    columns = None if config.columns is None else list(config.columns)
    with _open(path, config.compression_type) as f:
        pf = pq.ParquetFile(f)
        for i in range(pf.metadata.num_row_groups) if row_groups is None else row_groups:
            table = pf.read_row_group(i, columns)
            yield table if rows is None else table.slice(rows[0], rows[1] - rows[0])


def read_tables(config: ParquetReadConfig, ctx: Any, split_row_groups: bool = False) -> Any:
    """An RDD of the files' row groups as ``pyarrow.Table``, as Beam's source
    reads them; ``split_row_groups``: large ones cut into ranges of rows
    read by different tasks. Neighbouring small parts share a task."""
    parts = _parts(config, ctx.parallelism, split_row_groups)
    return parts_rdd(ctx.sc, parts, ctx.parallelism, functools.partial(_read_part, config))


def read_parquet_on_spark(payload: bytes, rdd: Any, ctx: Any) -> ArrowRows:
    """SparkRunner's ReadFromParquet: the row dicts, held as Arrow tables."""
    from apache_beam.internal import pickler

    return ArrowRows(read_tables(pickler.loads(payload), ctx, split_row_groups=True))


def read_parquet_batched_on_spark(payload: bytes, rdd: Any, ctx: Any) -> ElementBatches:
    """SparkRunner's ReadFromParquetBatched: one ``pyarrow.Table`` per row group."""
    from apache_beam.internal import pickler

    return ElementBatches(read_tables(pickler.loads(payload), ctx).mapPartitions(bounded_batches))


# -- writing ---------------------------------------------------------------
def _write_tables(sink: Any, writer: Any, tables: Iterator[Any]) -> None:
    for table in tables:
        sink.write_record(writer, table)


def _batch(schema: Any, rows: list) -> Any:
    """A record batch of ``rows``, column by column, as Beam's ``_flush_buffer`` makes it."""
    import pyarrow as pa

    plain = set(map(type, rows)) == {dict}
    arrays = []
    for field in schema:
        name = field.name
        # Beam: a nullable field missing from a row is null; a required one raises KeyError.
        if not field.nullable:
            values = list(map(operator.itemgetter(name), rows))
        elif plain:
            values = list(map(dict.get, rows, itertools.repeat(name)))  # faster than testing each row
        else:
            values = [row[name] if name in row else None for row in rows]
        arrays.append(pa.array(values, type=field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _row_tables(schema: Any, row_group_buffer_size: int, record_batch_size: int,
                rows: Iterator[Any]) -> Iterator[Any]:
    """The tables Beam's ``_RowDictionariesToArrowTable`` makes of one bundle of ``rows``.

    Beam buffers ``record_batch_size`` rows per record batch and emits the
    batches as one table once they hold ``row_group_buffer_size`` bytes,
    checked when the next row arrives; the end of the bundle emits the rest.
    This builds the same batches a column at a time instead of a value at a
    time (Beam's per-row loop costs several microseconds per row).
    """
    def record_batches() -> Iterator[Any]:
        while chunk := list(itertools.islice(rows, record_batch_size)):
            yield _batch(schema, chunk)
    return _record_tables(schema, row_group_buffer_size, record_batches())


def _record_tables(schema: Any, row_group_buffer_size: int, record_batches: Iterator[Any]) -> Iterator[Any]:
    """Record batches gathered into tables as Beam's ``_RowDictionariesToArrowTable`` does:
    a table once they hold ``row_group_buffer_size`` bytes and another follows; the rest at the end."""
    import pyarrow as pa

    batches: list = []
    held = 0
    batch = next(record_batches, None)
    while batch is not None:
        following = next(record_batches, None)
        batches.append(batch)
        held += sum(b.size for column in batch.columns for b in column.buffers() if b is not None)
        if following is not None and held >= row_group_buffer_size:
            yield pa.Table.from_batches(batches, schema=schema)
            batches, held = [], 0
        batch = following
    if batches:
        yield pa.Table.from_batches(batches, schema=schema)


# Arrow types whose values a column hands over as they are: the same ones
# (and the same buffers) as an array built from their Python values. Not
# half floats, which pyarrow does not build from Python floats.
def _as_is(arrow_type: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(arrow_type) or pa.types.is_float32(arrow_type) or pa.types.is_float64(arrow_type)


def _column_array(field: Any, column: Any, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of a row column as the array Beam's ``_flush_buffer`` would make of them."""
    import pyarrow as pa

    if isinstance(column, list):
        return pa.array(column[start:stop], type=field.type)
    part = column.slice(start, stop - start)
    if part.type == field.type and _as_is(field.type) and part.null_count == 0:
        return pa.array(part.to_numpy(), type=field.type)
    return pa.array(part.to_pylist(), type=field.type)


def _columns_writer(config: ParquetWriteConfig, sink: Any, batches: list) -> Any:
    """How a shard's batches held as row columns are written (see :func:`_column_tables`), or None."""
    tables = _column_tables(sink._schema, config.row_group_buffer_size, config.record_batch_size, batches)
    if tables is None:
        return None

    def write(writer: Any) -> None:
        for table in tables:
            sink.write_record(writer, table)
    return write


def _column_tables(schema: Any, row_group_buffer_size: int, record_batch_size: int,
                   batches: list) -> Iterator[Any] | None:
    """The tables :func:`_row_tables` would make of the row dicts of
    ``batches`` (:class:`Columns` of row dicts), built from their columns;
    None if a required field is missing (Beam fails on the rows) or the
    batches' columns differ."""
    import pyarrow as pa

    names = batches[0].names()[0]
    if any(batch.names()[0] != names for batch in batches):
        return None
    present = set(names)
    if any(not field.nullable and field.name not in present for field in schema):
        return None
    columns: dict[str, Any] = {}
    for index, name in enumerate(names):  # a repeated name: the last column, as in a row dict
        parts = [batch.groups[0][index][1] for batch in batches]
        if all(isinstance(part, list) for part in parts):
            columns[name] = list(itertools.chain.from_iterable(parts))
        elif all(not isinstance(part, list) and part.type == parts[0].type for part in parts):
            columns[name] = pa.chunked_array([chunk for part in parts for chunk in (
                part.chunks if isinstance(part, pa.ChunkedArray) else [part])], type=parts[0].type)
        else:
            columns[name] = list(itertools.chain.from_iterable(map(column_values, parts)))
    size = sum(batch.size for batch in batches)

    def record_batches() -> Iterator[Any]:
        for start in range(0, size, record_batch_size):
            stop = min(start + record_batch_size, size)
            yield pa.RecordBatch.from_arrays([
                _column_array(field, columns[field.name], start, stop) if field.name in columns
                else pa.array([None] * (stop - start), type=field.type) for field in schema], schema=schema)
    return _record_tables(schema, row_group_buffer_size, record_batches())


def _write_rows(config: ParquetWriteConfig, sink: Any, writer: Any, rows: Iterator[Any]) -> None:
    tables = _row_tables(sink._schema, config.row_group_buffer_size, config.record_batch_size, iter(rows))
    for table in tables:
        sink.write_record(writer, table)


def write_parquet_on_spark(payload: bytes, rdd: Any, ctx: Any) -> Any:
    """SparkRunner's WriteToParquet(Batched): writes the shards, returns an RDD of their final names."""
    from apache_beam.internal import pickler

    config: ParquetWriteConfig = pickler.loads(payload)
    if config.record_batch_size is None:
        return write_shards(config.sink, rdd, ctx, _write_tables)
    return write_shards(config.sink, rdd, ctx, functools.partial(_write_rows, config),
                        functools.partial(_columns_writer, config))
