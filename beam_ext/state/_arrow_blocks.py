"""Compressed Arrow IPC blocks: the on-disk format of spilled state and the reservoir.

A block is ``magic | u64 uncompressed size | lz4(Arrow IPC stream of one batch)``.
The stream is compressed whole rather than with IPC's per-buffer compression
because Arrow's IPC writer takes its compression buffers from the process's
default memory pool (captured when the options are made), while
``pa.compress`` / ``pa.decompress`` take the caller's pool: the spill store
needs every temporary buffer in its own pool to keep its memory bounded.
"""
from __future__ import annotations

import struct

import pyarrow as pa

_CODEC = "lz4"  # lz4 decompresses ~3x faster than zstd at a small size cost
_HEADER = struct.Struct(">4sQ")
_MAGIC = b"BXB1"
_VALUES_SCHEMA = pa.schema([("v", pa.binary())])


def encode_batch(batch: pa.RecordBatch, memory_pool: pa.MemoryPool | None = None) -> bytes:
    """Serialise one record batch as a compressed IPC stream."""
    sink = pa.BufferOutputStream(memory_pool)
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    raw = sink.getvalue()
    packed = pa.compress(raw, codec=_CODEC, asbytes=False, memory_pool=memory_pool)
    return _HEADER.pack(_MAGIC, raw.size) + packed.to_pybytes()


def decode_batch(data: bytes, memory_pool: pa.MemoryPool | None = None) -> pa.RecordBatch:
    """Inverse of :func:`encode_batch`; the batch's buffers live in ``memory_pool``."""
    if len(data) < _HEADER.size:
        raise ValueError(f"corrupt block: {len(data)} bytes, shorter than its header")
    magic, size = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise ValueError(f"corrupt block: bad magic {magic!r}")
    raw = pa.decompress(memoryview(data)[_HEADER.size:], decompressed_size=size, codec=_CODEC,
                        asbytes=False, memory_pool=memory_pool)
    batches = list(pa.ipc.open_stream(raw, memory_pool=memory_pool))
    if len(batches) != 1:
        raise ValueError(f"corrupt block: expected 1 record batch, found {len(batches)}")
    return batches[0]


def encode_values(values: list[bytes], memory_pool: pa.MemoryPool | None = None) -> bytes:
    """A block of opaque byte strings, in order; temporaries come from ``memory_pool``."""
    array = pa.array(values, pa.binary(), memory_pool=memory_pool)
    return encode_batch(pa.record_batch([array], schema=_VALUES_SCHEMA), memory_pool)


def decode_values(data: bytes) -> list[bytes]:
    """Inverse of :func:`encode_values`."""
    return decode_batch(data).column(0).to_pylist()
