"""ReadFromText and WriteToText on Spark, with Beam's results, file for file.

Reading: the pattern is matched on the driver with Beam's ``FileSystems``
(same files, same order, empty files skipped). Plain local files go through
Spark's text reader with ``lineSep='\\n'``; Beam ends a record at ``\\n`` and
drops a ``\\r`` just before it, never at a lone ``\\r``, so each line keeps
its bytes (the column is cast to binary) and loses one trailing ``\\r`` in
Python, and the source's coder decodes it as Beam's would (invalid UTF-8
raises, as it does on Beam). Spark's reader cannot tell whether a file's
last line ended with a newline, which matters only when that line ends with
``\\r``; such files, compressed files, files a Hadoop codec would
decompress, files with ``skip_header_lines`` and non-local files are read
whole by one Spark task each, through Beam's ``FileSystems.open`` with the
source's compression, split on ``\\n`` in chunks.

Writing: each partition is one shard, written by a Spark task with the
sink's own ``open``/``close`` (header, footer, compression by suffix) into
Beam's temporary directory; the driver then runs Beam's own
``pre_finalize`` and ``finalize_write`` (delete old shards of the same
pattern, rename, remove the temporary directory). A task writes its shard
under a per-attempt name and renames it to the partition's name, so a
retried task leaves one file. The output is the final file names, as Beam's.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import uuid
from typing import Any, Iterable, Iterator

from apache_beam.coders import coders
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

READ_TEXT_URN = "beam_ext:textio:read_from_text:v1"
WRITE_TEXT_URN = "beam_ext:textio:write_to_text:v1"

_CHUNK = 1 << 20
_HADOOP_GLOB_CHARS = frozenset("*?[]{}\\")


@dataclasses.dataclass(frozen=True)
class ReadConfig:
    """What the native read needs of a ReadFromText (see ``_io_overrides``)."""

    pattern: str
    compression_type: str
    coder: Any
    skip_header_lines: int


# -- reading ---------------------------------------------------------------
def _records(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Beam's records of a byte stream: ends at ``\\n`` or ``\\r\\n``; a final
    unterminated record keeps its bytes, an empty one is no record."""
    tail = b""
    for chunk in chunks:
        lines = (tail + chunk).split(b"\n")
        tail = lines.pop()
        for line in lines:
            yield line[:-1] if line.endswith(b"\r") else line
    if tail:
        yield tail


def _file_records(path: str, compression_type: str, skip: int) -> Iterator[bytes]:
    with FileSystems.open(path, "application/octet-stream", compression_type=compression_type) as f:
        records = _records(iter(functools.partial(f.read, _CHUNK), b""))
        for _ in range(skip):
            if next(records, None) is None:
                return
        yield from records


def _decoder(coder: Any):
    if type(coder) is coders.StrUtf8Coder:
        return lambda b: b.decode("utf-8")
    return lambda b: coder.decode(bytes(b))


def _decoded(pattern: str, coder: Any, records: Iterable[bytes]) -> Iterator[WindowedValue]:
    decode = _decoder(coder)
    windows = (GlobalWindow(),)
    for record in records:
        try:
            value = decode(record)
        except UnicodeDecodeError as e:
            raise ValueError(f"ReadFromText({pattern!r}): a line is not valid UTF-8 ({e}); "
                             f"its first bytes: {bytes(record[:80])!r}") from e
        yield WindowedValue(value, MIN_TIMESTAMP, windows)


def _spark_lines(rows: Iterable[Any]) -> Iterator[bytes]:
    for (line,) in rows:
        yield line[:-1] if line.endswith(b"\r") else line


def _local_path(path: str) -> str | None:
    """``path`` as an absolute local path, or None when it is not a local file."""
    if "://" in path and not path.startswith("file://"):
        return None
    return os.path.abspath(path.removeprefix("file://"))


def _spark_readable(sc: Any, path: str, local: str | None, compression_type: str, skip: int) -> bool:
    """Whether Spark's text reader gives exactly Beam's records of this file."""
    if local is None or skip or _HADOOP_GLOB_CHARS & set(local) or os.path.basename(local)[:1] in "._":
        return False
    if compression_type == CompressionTypes.AUTO:
        compression_type = CompressionTypes.detect_compression_type(path)
    if compression_type != CompressionTypes.UNCOMPRESSED:
        return False
    jvm = sc._jvm
    codecs = jvm.org.apache.hadoop.io.compress.CompressionCodecFactory(sc._jsc.hadoopConfiguration())
    if codecs.getCodec(jvm.org.apache.hadoop.fs.Path("file://" + local)) is not None:
        return False
    with open(local, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) != b"\r"


def read_text_on_spark(payload: bytes, rdd: Any, ctx: Any) -> Any:
    """SparkRunner's ReadFromText: an RDD of the lines, global window, MIN timestamp."""
    from apache_beam.internal import pickler
    from pyspark.sql import functions as F

    config: ReadConfig = pickler.loads(payload)
    sc = ctx.spark.sparkContext
    [match] = FileSystems.match([config.pattern])
    spark_files, task_files = [], []
    for metadata in match.metadata_list:
        if metadata.size_in_bytes == 0:
            continue  # as Beam: an empty file has no records, compressed or not
        local = _local_path(metadata.path)
        if _spark_readable(sc, metadata.path, local, config.compression_type, config.skip_header_lines):
            spark_files.append("file://" + local)
        else:
            task_files.append(metadata.path)
    parts = []
    if spark_files:
        rows = (ctx.spark.read.option("lineSep", "\n").text(spark_files)
                .select(F.col("value").cast("binary")).rdd)
        parts.append(rows.mapPartitions(_spark_lines))
    if task_files:
        read = functools.partial(_file_records, compression_type=config.compression_type,
                                 skip=config.skip_header_lines)
        parts.append(sc.parallelize(task_files, len(task_files)).flatMap(read))
    if not parts:
        return sc.parallelize([], 1)
    lines = parts[0] if len(parts) == 1 else sc.union(parts)
    return lines.mapPartitions(functools.partial(_decoded, config.pattern, config.coder))


# -- writing ---------------------------------------------------------------
def _encoded_records(sink: Any, values: Iterable[Any]) -> Iterator[bytes]:
    """What ``_TextSink.write_record`` writes for each value, joined in chunks."""
    encode = sink.coder.encode
    newline = b"\n" if sink._append_trailing_newlines else b""
    batch, size = [], 0
    for value in values:
        record = encode(value) + newline
        batch.append(record)
        size += len(record)
        if size >= _CHUNK:
            yield b"".join(batch)
            batch, size = [], 0
    if batch:
        yield b"".join(batch)


def _write_shard(sink: Any, temp_dir: str, index: int, wvs: Iterator[WindowedValue]) -> Iterator[str]:
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
        values = (wv.value for wv in _prepend(first, wvs) for _ in wv.windows)
        for chunk in _encoded_records(sink, values):
            handle.write(chunk)
    finally:
        sink.close(handle)
    FileSystems.rename([attempt], [path])
    yield path


def _prepend(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def write_text_on_spark(payload: bytes, rdd: Any, ctx: Any) -> Any:
    """SparkRunner's WriteToText: writes the shards, returns an RDD of their final names."""
    from apache_beam.internal import pickler

    sink = pickler.loads(payload)
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
        functools.partial(_write_shard, sink, temp_dir)).collect())
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
