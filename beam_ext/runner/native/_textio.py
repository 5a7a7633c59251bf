"""ReadFromText and WriteToText on Spark, with Beam's results, file for file.

Reading: the pattern is matched on the driver with Beam's ``FileSystems``
(same files, empty files skipped). Uncompressed files are cut into byte
ranges; a task reads the records that start in its range, as Beam's splits
do: a record ends at ``\n`` and loses a ``\r`` just before it, never ends
at a lone ``\r``, and a last line without newline keeps its bytes.
Compressed files (and every file when ``skip_header_lines`` is set) are
read whole, through ``FileSystems.open`` with the source's compression.
Neighbouring ranges and files share a task (:mod:`._file_tasks`). The source's
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
from beam_ext.runner.native._file_tasks import parts_rdd

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
# A task reads its bytes a chunk at a time and cuts each chunk's complete
# records out as one region (records joined by their \n, as in the file):
# a UTF-8 region is decoded and split as a whole, so no Python call is made
# per line. Regions are ``(bytes, terminated)``; only the last record of a
# file can be unterminated, and it keeps a final \r.
def _regions(chunks: Iterable[bytes]) -> Iterator[tuple[bytes, bool]]:
    """The records of a byte stream as regions: a record ends at ``\\n``; a
    final unterminated one keeps its bytes, an empty one is no record."""
    # A record longer than a chunk is held in pieces and joined once: adding
    # each chunk to it would copy it again per chunk.
    pending: list[bytes] = []
    for chunk in chunks:
        cut = chunk.rfind(b"\n")
        if cut < 0:
            pending.append(chunk)
            continue
        region = chunk[:cut]
        if pending:
            pending.append(region)
            region = b"".join(pending)
            pending = []
        yield region, True
        if cut + 1 < len(chunk):
            pending.append(chunk[cut + 1:])
    if pending:
        yield b"".join(pending), False


def _skipped(regions: Iterable[tuple[bytes, bool]], skip: int) -> Iterator[tuple[bytes, bool]]:
    """``regions`` without their first ``skip`` records."""
    for region, terminated in regions:
        while skip:
            skip -= 1
            cut = region.find(b"\n")
            if cut < 0:
                break
            region = region[cut + 1:]
        else:
            yield region, terminated


def _file_regions(path: str, compression_type: str, skip: int, chunk: int) -> Iterator[tuple[bytes, bool]]:
    with FileSystems.open(path, "application/octet-stream", compression_type=compression_type) as f:
        yield from _skipped(_regions(iter(functools.partial(f.read, chunk), b"")), skip)


def _range_chunks(f: Any, start: int, end: int, chunk: int) -> Iterator[bytes]:
    """The bytes of the records of ``f`` that start in ``[start, end)``."""
    position = 0
    if start > 0:
        # A record starts at 0 or just after a \n: skip the one under way.
        f.seek(start - 1)
        position = start - 1 + len(f.readline())
    while position < end:
        data = f.read(min(chunk, end - position))
        if not data:
            return
        position += len(data)
        if position >= end and not data.endswith(b"\n"):
            data += f.readline()  # the record under way at ``end`` started in the range: all of it
        yield data


def _range_regions(path: str, start: int, end: int, chunk: int) -> Iterator[tuple[bytes, bool]]:
    with FileSystems.open(path, "application/octet-stream",
                          compression_type=CompressionTypes.UNCOMPRESSED) as f:
        yield from _regions(_range_chunks(f, start, end, chunk))


def _read_part(part: tuple, compression_type: str, skip: int, chunk: int) -> Iterator[tuple[bytes, bool]]:
    path, start, end = part
    if end is None:
        return _file_regions(path, compression_type, skip, chunk)
    return _range_regions(path, start, end, chunk)


def _split(region: bytes | str, terminated: bool, newline: Any, cr: Any) -> list:
    records = region.split(newline)
    if terminated and cr in region:
        return [r[:-1] if r.endswith(cr) else r for r in records]
    return records


def _region_values(pattern: str, coder: Any, region: bytes, terminated: bool) -> list:
    if type(coder) is coders.StrUtf8Coder:
        try:
            # No \n byte is part of a multi-byte character: the region decodes
            # exactly when each of its records does.
            return _split(region.decode("utf-8"), terminated, "\n", "\r")
        except UnicodeDecodeError:
            pass  # the record at fault is named below
    values = []
    for record in _split(region, terminated, b"\n", b"\r"):
        try:
            values.append(coder.decode(record))
        except UnicodeDecodeError as e:
            raise ValueError(f"ReadFromText({pattern!r}): a line is not valid UTF-8 ({e}); "
                             f"its first bytes: {record[:80]!r}") from e
    return values


def _decoded(pattern: str, coder: Any, regions: Iterable[tuple[bytes, bool]]) -> Iterator[Same]:
    for region, terminated in regions:
        yield from bounded_batches(_region_values(pattern, coder, region, terminated))


def read_text_on_spark(payload: bytes, rdd: Any, ctx: Any) -> ElementBatches:
    """SparkRunner's ReadFromText: the lines, global window, MIN timestamp."""
    from apache_beam.internal import pickler

    return read_lines(pickler.loads(payload), ctx)


def read_lines(config: ReadConfig, ctx: Any, min_split: int = _MIN_SPLIT, chunk: int = _CHUNK) -> ElementBatches:
    """The records of ``config``'s files, ranges of at least ``min_split``
    bytes, read ``chunk`` bytes at a time; neighbouring parts share a task."""
    [match] = FileSystems.match([config.pattern])
    files = [(m.path, m.size_in_bytes) for m in match.metadata_list
             if m.size_in_bytes > 0]  # as Beam: an empty file has no records, compressed or not
    total = sum(size for _, size in files)
    split = max(min_split, -(-total // max(ctx.parallelism, 1)))
    parts: list[tuple[tuple, int]] = []
    for path, size in files:
        compression = config.compression_type
        if compression == CompressionTypes.AUTO:
            compression = CompressionTypes.detect_compression_type(path)
        if compression != CompressionTypes.UNCOMPRESSED or config.skip_header_lines:
            parts.append(((path, 0, None), size))  # read whole, in one task
        else:
            parts += [((path, start, min(start + split, size)), min(split, size - start))
                      for start in range(0, size, split)]
    read = functools.partial(_read_part, compression_type=config.compression_type,
                             skip=config.skip_header_lines, chunk=chunk)
    return ElementBatches(parts_rdd(ctx.sc, parts, ctx.parallelism, read).mapPartitions(
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
