"""LMDB key layout: a window's blocks are contiguous and in insertion order.

::

    u16 len(key) | key | f64 start | f64 end | u64 block seq      (big-endian)

The window's part (everything before the sequence number) is its *prefix*:
one cursor range over it finds, or deletes, all of the window's blocks.
"""
from __future__ import annotations

import struct

_WINDOW = struct.Struct(">dd")
_SEQ = struct.Struct(">Q")
_KEYLEN = struct.Struct(">H")
_MAX_KEY_BYTES = 0xFFFF  # what the u16 length holds


def _prefix(key: bytes, window: tuple[float, float]) -> bytes:
    """The part of the LMDB key shared by every block of ``(key, window)``."""
    return _KEYLEN.pack(len(key)) + key + _WINDOW.pack(*window)


def _block_key(prefix: bytes, seq: int) -> bytes:
    """The LMDB key of block ``seq`` of the window with this prefix."""
    return prefix + _SEQ.pack(seq)


def _parse(db_key: bytes) -> tuple[bytes, tuple[float, float], int]:
    """``(key, window, seq)`` of an LMDB key; ``struct.error`` if malformed.

    The length must be exact: a key with bytes after its sequence number
    would parse as the block it extends, which would then be read twice.
    """
    (n,) = _KEYLEN.unpack_from(db_key, 0)
    if len(db_key) != _KEYLEN.size + n + _WINDOW.size + _SEQ.size:
        raise struct.error(f"{len(db_key)} bytes, not those of a {n}-byte key")
    key = db_key[2:2 + n]
    start, end = _WINDOW.unpack_from(db_key, 2 + n)
    (seq,) = _SEQ.unpack_from(db_key, 2 + n + _WINDOW.size)
    return key, (start, end), seq
