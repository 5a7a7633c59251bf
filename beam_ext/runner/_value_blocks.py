"""Blocks of many values among a trivial grouping's length-prefixed value encodings.

A task gathering a key's values before the shuffle
(:class:`~beam_ext.runner._shuffle.KeyedValues`) may write several of them as
one *block*: a zero byte, the payload's length (4 bytes, big-endian) and the
payload. What the payload holds is the grouping's value format's
(:mod:`._row_columns`: schema rows as columns; :mod:`._pickled_values`:
objects Beam would pickle one by one). Blocks and single values mix in one
key's data: a grouping's values are length-prefixed encodings of at least
one byte, whose first byte is never zero, so a zero byte starts a block.
"""
from __future__ import annotations

import struct
from typing import Iterator

from apache_beam.coders.coder_impl import create_InputStream

_HEAD = struct.Struct(">BI")  # 0, then the payload's length


def block(payload: bytes) -> bytes:
    """``payload`` as a block."""
    return _HEAD.pack(0, len(payload)) + payload


def only_block(data: bytes) -> memoryview | None:
    """The payload of ``data`` if ``data`` is one block and nothing else."""
    if data and data[0] == 0 and _HEAD.unpack_from(data)[1] + _HEAD.size == len(data):
        return memoryview(data)[_HEAD.size:]
    return None


def parts(data: bytes) -> Iterator[tuple[bool, bytes]]:
    """``(True, a value's encoding without its length)`` or ``(False, a block's payload)``, in order."""
    stream = create_InputStream(data)
    while stream.size() > 0:
        first = stream.read_byte()
        if first == 0:
            yield False, stream.read(struct.unpack(">I", stream.read(4))[0])
            continue
        # The rest of the length's varint, then the value's encoding.
        length = first if first < 0x80 else (first & 0x7F) | (stream.read_var_int64() << 7)
        yield True, stream.read(length)
