"""SlidingAggregate on Spark: the vectorised batch path per key partition.

Events are partitioned by the stable hash of their key's encoding; each task
sorts its partition and computes every window of every event at once with
:func:`beam_ext.transforms.sliding._vectorised.compute_batch`.

Input read natively from columnar files arrives as Arrow tables
(:class:`~beam_ext.runner.native._arrow_rows.ArrowRows`). When every field
of the transform is a name, the key, time and aggregated values are taken
from the tables' columns, and tables cut by key partition are what the
shuffle moves: no Python object per event until the output. A column of a
type whose values would not read as they do from a row dict (a float or
struct key, a timestamp-typed time, a decimal amount) is read row by row
with the transform's own accessors, so both routes give the same features,
and the same errors.
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Iterator

import numpy as np
from apache_beam.utils.timestamp import MIN_TIMESTAMP

from beam_ext._key_hash import key_hash, untyped_key_coder
from beam_ext.runner._element_batches import BATCH, PAIR, Columns, ElementBatches, Marker, Same, as_batch
from beam_ext.runner._object_shuffle import shuffled
from beam_ext.runner.native._arrow_rows import ArrowRows, row_dicts
from beam_ext.transforms.sliding._plan import _Plan
from beam_ext.transforms.sliding._vectorised import _codes, compute_batch, compute_columns

_LOG = logging.getLogger("beam_ext.runner")


def _keyed_chunks(plan: _Plan, parallelism: int,
                  batches: Iterator[Same | list | Columns | Marker]) -> Iterator[tuple[int, tuple]]:
    """``(target task, chunk)`` of a task's events: what the shuffle moves,
    with no ``WindowedValue`` per event to pickle where events share their
    windowing. A chunk is ``(template, encoded keys, event times, events)``
    of events in ``template``'s windows and at its timestamp, or ``(None,
    encoded keys, event times, WindowedValues)``."""
    # Keys are grouped and partitioned by their encoding, as GroupByKey does
    # on the Beam path: Python's hash() differs between workers, and Python
    # equality would split NaN keys and merge 1 with 1.0.
    encode = untyped_key_coder("SlidingAggregate key").get_impl().encode
    key, event_time = plan.key, plan.event_time
    pending: list[tuple | None] = [None] * parallelism
    for batch in batches:
        if type(batch) is Marker:
            continue
        for piece in (batch.batches() if type(batch) is Columns else (as_batch(batch),)):
            if type(piece) is Same:
                template, items = piece.template, piece.values
                events, seconds = items, template.timestamp_micros / 1e6
                times = [event_time(event, seconds) for event in events]
            else:
                template, items = None, piece
                events = [wv.value for wv in items]
                times = [event_time(wv.value, wv.timestamp_micros / 1e6) for wv in items]
            keys = [encode(key(event)) for event in events]
            for target, k, t, item in zip([key_hash(k) % parallelism for k in keys], keys, times, items):
                chunk = pending[target]
                if chunk is None or chunk[0] is not template:
                    if chunk is not None:
                        yield target, chunk
                    chunk = pending[target] = (template, [], [], [])
                chunk[1].append(k)
                chunk[2].append(t)
                chunk[3].append(item)
                if len(chunk[3]) >= BATCH:
                    yield target, chunk
                    pending[target] = None
    for target, chunk in enumerate(pending):
        if chunk is not None:
            yield target, chunk


def _chunks_partition(plan: _Plan, chunks: Iterator[tuple]) -> Iterator[Same | list]:
    """Features of one task's events, computed at once, each chunk's handed on as a batch."""
    groups, times, events, spans = [], [], [], []
    for template, keys, chunk_times, items in chunks:
        # An event is grouped with its key's events in its window.
        if template is not None:
            windows = tuple(template.windows)
            groups += [(k, windows) for k in keys]
            events += items
        else:
            groups += [(k, tuple(wv.windows)) for k, wv in zip(keys, items)]
            events += [wv.value for wv in items]
        times += chunk_times
        spans.append((template, items))
    feats = compute_batch(plan, groups, np.asarray(times, dtype=np.float64), events)
    start = 0
    for template, items in spans:
        stop = start + len(items)
        if template is not None:
            yield Same(template, list(zip(items, feats[start:stop])))
        else:
            yield [wv.with_value((wv.value, f)) for wv, f in zip(items, feats[start:stop])]
        start = stop


def sliding_on_rdd(plan: _Plan, values: Any, parallelism: int) -> ElementBatches:
    """Each event (of :class:`ElementBatches`, or an RDD of ``WindowedValue``)
    with its features: ``(event, features)``, in the event's windows and at its timestamp."""
    batches = values if isinstance(values, ElementBatches) else ElementBatches.of(values)
    return ElementBatches(shuffled(batches.rdd.mapPartitions(functools.partial(_keyed_chunks, plan, parallelism)),
                                   parallelism).mapPartitions(functools.partial(_chunks_partition, plan)))


# -- Arrow tables in -------------------------------------------------------
def _is_numeric(column: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(column.type) or pa.types.is_floating(column.type)


def _keys_by_column(column: Any) -> tuple[list[bytes], np.ndarray] | None:
    """(encoded distinct keys, each row's index into them) of a key column, or
    None if its values may not group by Arrow equality as they do by encoding."""
    import pyarrow as pa

    t = column.type
    if not (pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_boolean(t)):
        return None  # floats: NaN and -0.0 group by their bits
    encoded = column.combine_chunks().dictionary_encode(null_encoding="encode")
    encode = untyped_key_coder("SlidingAggregate key").encode
    return ([encode(k) for k in encoded.dictionary.to_pylist()],
            encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64))


def _by_rows(plan: _Plan, table: Any) -> tuple[list[bytes], np.ndarray, np.ndarray, list]:
    """Encoded distinct keys, each row's index into them, times and aggregated
    values, read row by row with the transform's accessors."""
    encode = untyped_key_coder("SlidingAggregate key").encode
    distinct: dict[bytes, int] = {}
    index, times, values = [], [], []
    no_timestamp = MIN_TIMESTAMP.micros / 1e6  # a bounded read's elements carry the minimum timestamp
    for event in row_dicts(table):
        index.append(distinct.setdefault(encode(plan.key(event)), len(distinct)))
        times.append(plan.event_time(event, no_timestamp))
        values.append(plan.row(event))
    columns = []
    for ci, (_, numeric, _) in enumerate(plan.columns):
        column = [v[ci] for v in values]
        columns.append(np.asarray(column, dtype=np.float64) if numeric else column)
    return list(distinct), np.asarray(index, dtype=np.int64), np.asarray(times, dtype=np.float64), columns


def _by_columns(plan: _Plan, table: Any) -> tuple[list, np.ndarray, np.ndarray, list] | None:
    """As :func:`_by_rows`, from whole columns; None where a column cannot be read so."""
    names = set(table.column_names)
    wanted = [plan.key_field, plan.timestamp_field, *plan.column_fields]
    if any(name is not None and name not in names for name in wanted):
        return None  # the row route raises the transform's missing-field error
    keys = _keys_by_column(table.column(plan.key_field))
    if keys is None:
        return None
    if plan.timestamp_field is None:
        times = np.full(table.num_rows, MIN_TIMESTAMP.micros / 1e6)
    else:
        column = table.column(plan.timestamp_field)
        if not _is_numeric(column):
            return None
        times = np.asarray(column.to_numpy(), dtype=np.float64)
        if not np.isfinite(times).all():
            return None  # the row route names the event
    columns: list[Any] = []
    for field, (_, numeric, _) in zip(plan.column_fields, plan.columns):
        column = table.column(field)
        if numeric:
            if not _is_numeric(column):
                return None
            columns.append(np.asarray(column.to_numpy(), dtype=np.float64))  # nulls are NaN, as row() makes them
        else:
            columns.append([None if isinstance(v, float) and v != v else v for v in column.to_pylist()])
    return keys[0], keys[1], times, columns


def _table_parts(plan: _Plan, partitions: int, table: Any) -> Iterator[tuple[int, tuple]]:
    """``table`` cut by key partition: ``(partition, (rows, encoded keys, key index, times, columns))``."""
    if table.num_rows == 0:
        return
    encoded, index, times, columns = _by_columns(plan, table) or _by_rows(plan, table)
    target = np.asarray([key_hash(e) % partitions for e in encoded], dtype=np.int64)[index]
    order = np.argsort(target, kind="stable")
    cuts = np.flatnonzero(np.diff(target[order])) + 1
    for rows in np.split(order, cuts):
        part = (table.take(rows), encoded, index[rows], times[rows],
                [c[rows] if isinstance(c, np.ndarray) else [c[i] for i in rows.tolist()] for c in columns])
        yield int(target[rows[0]]), part


def _arrow_partition(plan: _Plan, parts: Iterator[tuple]) -> Iterator[Any]:
    """The ``(event, features)`` elements of one key partition's tables, in batches."""
    parts = list(parts)
    if not parts:
        return iter(())
    codes: dict[bytes, int] = {}
    key_codes = np.concatenate([
        np.asarray([codes.setdefault(e, len(codes)) for e in encoded], dtype=np.int64)[index]
        for _, encoded, index, _, _ in parts])
    times = np.concatenate([p[3] for p in parts])
    columns: list[Any] = []
    for ci, (_, numeric, _) in enumerate(plan.columns):
        if numeric:
            columns.append(np.concatenate([p[4][ci] for p in parts]))
        else:
            columns.append(_codes(v for p in parts for v in p[4][ci]))
    feats = compute_columns(plan, key_codes, times, columns)
    # Handed on as columns, a batch per table: the (event, features) pairs
    # are made only for a step that needs them.
    batches, start = [], 0
    for table, *_ in parts:
        stop = start + table.num_rows
        batches.append(Columns((tuple(zip(table.column_names, table.columns)),
                                tuple((name, values[start:stop]) for name, values in feats.items())),
                               PAIR, table.num_rows))
        start = stop
    return iter(batches)


def sliding_on_arrow_rows(plan: _Plan, rows: ArrowRows, parallelism: int) -> ElementBatches:
    """As :func:`sliding_on_rdd`, for row dicts held as Arrow tables (``plan.reads_named_fields``)."""
    return ElementBatches(rows.tables.flatMap(functools.partial(_table_parts, plan, parallelism))
                          .partitionBy(parallelism, _identity)
                          .values()
                          .mapPartitions(functools.partial(_arrow_partition, plan)))


def _identity(partition: int) -> int:
    return partition


def sliding_on_spark(payload: bytes, rdd: Any, ctx: Any) -> Any:
    """SparkRunner's implementation of ``SlidingAggregate``'s native URN."""
    from apache_beam.internal import pickler

    plan = pickler.loads(payload)
    if isinstance(rdd, ArrowRows):
        if plan.reads_named_fields:
            _LOG.info("step %r reads its input's Arrow tables by column", ctx.step_name)
            return sliding_on_arrow_rows(plan, rdd, ctx.parallelism)
        _LOG.info("step %r reads its input row by row: a field or `where` is a callable", ctx.step_name)
        rdd = rdd.values()
    return sliding_on_rdd(plan, rdd, ctx.parallelism)
