"""Writing a PCollection as files with a Beam ``FileBasedSink``, one shard per Spark partition.

Each partition is one shard, written by a Spark task with the sink's own
``open``/``close`` into Beam's temporary directory; the driver then runs
Beam's own ``pre_finalize`` and ``finalize_write`` (delete old shards of
the same pattern, rename, remove the temporary directory). A task writes
its shard under a per-attempt name and renames it to the partition's name,
so a retried task leaves one file. The output is the final file names, as
Beam's ``WriteImpl`` gives them. The native text and Parquet writes differ
only in how a shard's values become records (``write_values``).
"""
from __future__ import annotations

import functools
import os
import uuid
from typing import Any, Callable, Iterator

from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MAX_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from beam_ext.runner._element_batches import ROW, Columns, ElementBatches, Same, batched, values_per_window
from beam_ext.runner._object_shuffle import shuffled
from beam_ext.runner.native._reshuffle import deal

#: ``write_values(sink, handle, values)``: writes a shard's values through ``handle``, from ``sink.open``.
WriteValues = Callable[[Any, Any, Iterator[Any]], None]
#: ``write_columns(sink, batches)``: how a shard's batches held as row
#: columns are written through a handle, or None where they must be made
#: into elements first.
WriteColumns = Callable[[Any, list], Callable[[Any], None] | None]


def _write_shard(sink: Any, temp_dir: str, write_values: WriteValues, write_columns: WriteColumns | None,
                 index: int, batches: Iterator[Same | list | Columns]) -> Iterator[str]:
    """Writes one partition (batches of elements) as one shard; yields its temporary path (none if empty)."""
    from pyspark import TaskContext

    batches = iter(batches)
    write = None
    first_batch = next(batches, _NONE)
    if first_batch is _NONE:
        return
    batches = _prepend(first_batch, batches)
    if write_columns is not None and type(first_batch) is Columns:
        held = list(batches)
        if all(type(batch) is Columns and batch.shape == ROW for batch in held):
            write = write_columns(sink, held)
            if write is not None and not any(batch.size for batch in held):
                return
        batches = iter(held)
    if write is None:
        # Beam's WriteImpl rewindows into the global window first: an element
        # in several windows is written once per window.
        values = values_per_window(batches)
        first = next(values, _NONE)
        if first is _NONE:
            return
        rest = _prepend(first, values)

        def write(handle: Any) -> None:
            write_values(sink, handle, rest)
    # Beam's temporary names end as the final ones, so compression AUTO
    # picks the same codec from the suffix.
    suffix = "." + os.path.basename(sink.file_path_prefix.get()) + sink.file_name_suffix.get()
    path = FileSystems.join(temp_dir, f"shard-{index:05d}") + suffix
    attempt = FileSystems.join(
        temp_dir, f"shard-{index:05d}-attempt-{TaskContext.get().attemptNumber()}-{uuid.uuid4().hex}") + suffix
    handle = sink.open(attempt)
    try:
        write(handle)
    finally:
        sink.close(handle)
    FileSystems.rename([attempt], [path])
    yield path


_NONE = object()  # no value: a partition's values may be None


def _prepend(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def write_shards(sink: Any, elements: Any, ctx: Any, write_values: WriteValues,
                 write_columns: WriteColumns | None = None) -> Any:
    """Writes ``elements`` (:class:`ElementBatches`, or an RDD of ``WindowedValue``)
    with ``sink``; returns an RDD of the final file names. ``write_columns``:
    how batches held as row columns are written without an element each,
    where they can be."""
    sc = ctx.sc
    if not isinstance(elements, ElementBatches):
        elements = ElementBatches(elements.mapPartitions(batched))
    rdd = elements.rdd
    # num_shards 0: one shard per non-empty partition (Beam writes one per bundle).
    num_shards = sink.num_shards
    if num_shards:
        partitions = rdd.getNumPartitions()
        if partitions > num_shards:
            rdd = rdd.coalesce(num_shards)
        elif partitions < num_shards:
            # Elements, not batches, dealt over the shards (a few batches
            # would leave shards empty), in batches as Reshuffle deals them:
            # a WindowedValue each would cost more to pickle through Spark's
            # shuffle than to write. Beam's WriteImpl picks each element's
            # shard at random: which shard holds a value is no part of the output.
            rdd = shuffled(rdd.mapPartitionsWithIndex(functools.partial(deal, num_shards, False)), num_shards)
    temp_dir = sink.initialize_write()
    shards = rdd.mapPartitionsWithIndex(functools.partial(_write_shard, sink, temp_dir, write_values, write_columns))
    return ctx.run_job(shards, functools.partial(_finalize, sc, sink, temp_dir))


def _finalize(sc: Any, sink: Any, temp_dir: str, written: list[str]) -> Any:
    """The written shards renamed to their final names, as Beam's WriteImpl
    does after its writes; an RDD of those names."""
    written = sorted(written)
    num_shards = sink.num_shards
    min_shards = max(num_shards, 1)
    if len(written) < min_shards and (written or not sink.skip_if_empty):
        # As Beam's WriteImpl: empty shards up to the shard count.
        written += [sink.open_writer(temp_dir, str(uuid.uuid4())).close()
                    for _ in range(min_shards - len(written))]
    if not written:
        FileSystems.delete([temp_dir])
        return sc.parallelize([], 1)
    sink.pre_finalize(temp_dir, written)
    names = list(sink.finalize_write(temp_dir, written, None))
    windows = (GlobalWindow(),)
    return sc.parallelize([WindowedValue(name, MAX_TIMESTAMP, windows) for name in names], 1)
