"""ReadFromText and WriteToText on Spark, with Beam's results, file for file.

Reading: the pattern is matched on the driver with Beam's ``FileSystems``
(same files, empty files skipped). Uncompressed files are cut into byte
ranges, one Spark task each; a task reads the records that start in its
range, as Beam's splits do, with buffered ``readline``: a record ends at
``\n`` and loses a ``\r`` just before it, never ends at a lone ``\r``, and
a last line without newline keeps its bytes. Compressed files (and every
file when ``skip_header_lines`` is set) are read whole by one task each,
through ``FileSystems.open`` with the source's compression. The source's
coder decodes each record as Beam's does (invalid UTF-8 raises). Spark's
own text reader is not used: it cannot tell whether a file's last line
ended with a newline, and its rows cost more to hand to Python than these
reads (measured in docs/runner.md).

Writing: each partition is one shard, written by a Spark task with the
sink's own ``open``/``close`` (header, footer, compression by suffix), the
records encoded as ``_TextSink.write_record`` encodes them; shards and
finalization are :func:`~beam_ext.runner.native._file_sink.write_shards`'.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Iterable, Iterator

from apache_beam.coders import coders
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from beam_ext.runner._element_batches import ElementBatches, Same, bounded_batches
from beam_ext.runner.native._file_sink import write_shards

READ_TEXT_URN = "beam_ext:textio:read_from_text:v1"
WRITE_TEXT_URN = "beam_ext:textio:write_to_text:v1"

_CHUNK = 1 << 20
_MIN_SPLIT = 1 << 20


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


def _decoded(pattern: str, coder: Any, records: Iterable[bytes]) -> Iterator[Same]:
    return bounded_batches(_decoded_values(pattern, coder, records))


def _decoded_values(pattern: str, coder: Any, records: Iterable[bytes]) -> Iterator[Any]:
    decode = _decoder(coder)
    for record in records:
        try:
            yield decode(record)
        except UnicodeDecodeError as e:
            raise ValueError(f"ReadFromText({pattern!r}): a line is not valid UTF-8 ({e}); "
                             f"its first bytes: {bytes(record[:80])!r}") from e


def _range_records(path: str, start: int, end: int) -> Iterator[bytes]:
    """Beam's records of an uncompressed file that start in ``[start, end)``."""
    with FileSystems.open(path, "application/octet-stream",
                          compression_type=CompressionTypes.UNCOMPRESSED) as f:
        position = 0
        if start > 0:
            # A record starts at 0 or just after a \n: skip the one under way.
            f.seek(start - 1)
            position = start - 1 + len(f.readline())
        while position < end:
            line = f.readline()
            if not line:
                return
            position += len(line)
            if line.endswith(b"\n"):
                line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
            yield line


def _read_part(part: tuple, compression_type: str, skip: int) -> Iterator[bytes]:
    path, start, end = part
    if end is None:
        return _file_records(path, compression_type, skip)
    return _range_records(path, start, end)


def read_text_on_spark(payload: bytes, rdd: Any, ctx: Any) -> ElementBatches:
    """SparkRunner's ReadFromText: the lines, global window, MIN timestamp."""
    from apache_beam.internal import pickler

    return read_lines(pickler.loads(payload), ctx)


def read_lines(config: ReadConfig, ctx: Any, min_split: int = _MIN_SPLIT) -> ElementBatches:
    """The records of ``config``'s files, ranges of at least ``min_split`` bytes per task."""
    sc = ctx.sc
    [match] = FileSystems.match([config.pattern])
    files = [(m.path, m.size_in_bytes) for m in match.metadata_list
             if m.size_in_bytes > 0]  # as Beam: an empty file has no records, compressed or not
    total = sum(size for _, size in files)
    split = max(min_split, -(-total // max(ctx.parallelism, 1)))
    parts = []
    for path, size in files:
        compression = config.compression_type
        if compression == CompressionTypes.AUTO:
            compression = CompressionTypes.detect_compression_type(path)
        if compression != CompressionTypes.UNCOMPRESSED or config.skip_header_lines:
            parts.append((path, 0, None))  # read whole, in one task
        else:
            parts += [(path, start, min(start + split, size)) for start in range(0, size, split)]
    if not parts:
        return ElementBatches(sc.parallelize([], 1))
    read = functools.partial(_read_part, compression_type=config.compression_type,
                             skip=config.skip_header_lines)
    return ElementBatches(sc.parallelize(parts, len(parts)).flatMap(read).mapPartitions(
        functools.partial(_decoded, config.pattern, config.coder)))


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


def _write_text(sink: Any, handle: Any, values: Iterator[Any]) -> None:
    for chunk in _encoded_records(sink, values):
        handle.write(chunk)


def write_text_on_spark(payload: bytes, rdd: Any, ctx: Any) -> Any:
    """SparkRunner's WriteToText: writes the shards, returns an RDD of their final names."""
    from apache_beam.internal import pickler

    return write_shards(pickler.loads(payload), rdd, ctx, _write_text)
