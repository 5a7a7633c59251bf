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

#: ``write_values(sink, handle, values)``: writes a shard's values through ``handle``, from ``sink.open``.
WriteValues = Callable[[Any, Any, Iterator[Any]], None]


def _write_shard(sink: Any, temp_dir: str, write_values: WriteValues, index: int,
                 wvs: Iterator[WindowedValue]) -> Iterator[str]:
    """Writes one partition as one shard; yields its temporary path (none if empty)."""
    from pyspark import TaskContext

    first = next(wvs, None)
    if first is None:
        return
    # Beam's temporary names end as the final ones, so compression AUTO
    # picks the same codec from the suffix.
    suffix = "." + os.path.basename(sink.file_path_prefix.get()) + sink.file_name_suffix.get()
    path = FileSystems.join(temp_dir, f"shard-{index:05d}") + suffix
    attempt = FileSystems.join(
        temp_dir, f"shard-{index:05d}-attempt-{TaskContext.get().attemptNumber()}-{uuid.uuid4().hex}") + suffix
    handle = sink.open(attempt)
    try:
        # Beam's WriteImpl rewindows into the global window first: an
        # element in several windows is written once per window.
        write_values(sink, handle, (wv.value for wv in _prepend(first, wvs) for _ in wv.windows))
    finally:
        sink.close(handle)
    FileSystems.rename([attempt], [path])
    yield path


def _prepend(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def write_shards(sink: Any, rdd: Any, ctx: Any, write_values: WriteValues) -> Any:
    """Writes ``rdd`` (of ``WindowedValue``) with ``sink``; returns an RDD of the final file names."""
    sc = ctx.spark.sparkContext
    # num_shards 0: one shard per non-empty partition (Beam writes one per bundle).
    num_shards = sink.num_shards
    if num_shards:
        partitions = rdd.getNumPartitions()
        if partitions > num_shards:
            rdd = rdd.coalesce(num_shards)
        elif partitions < num_shards:
            rdd = rdd.repartition(num_shards)
    temp_dir = sink.initialize_write()
    written = sorted(rdd.mapPartitionsWithIndex(
        functools.partial(_write_shard, sink, temp_dir, write_values)).collect())
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
