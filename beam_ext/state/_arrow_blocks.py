"""Compressed Arrow IPC blocks: the on-disk format of spilled state and the reservoir."""
from __future__ import annotations

import pyarrow as pa

_CODEC = "lz4"  # lz4 decompresses ~3x faster than zstd at a small size cost
_OPTIONS = pa.ipc.IpcWriteOptions(compression=_CODEC)
_VALUES_SCHEMA = pa.schema([("v", pa.binary())])


def encode_batch(batch: pa.RecordBatch, memory_pool: pa.MemoryPool | None = None) -> bytes:
    """Serialise one record batch as a compressed IPC stream."""
    sink = pa.BufferOutputStream(memory_pool)
    with pa.ipc.new_stream(sink, batch.schema, options=_OPTIONS) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def decode_batch(data: bytes, memory_pool: pa.MemoryPool | None = None) -> pa.RecordBatch:
    """Inverse of :func:`encode_batch`."""
    reader = pa.ipc.open_stream(pa.py_buffer(data), memory_pool=memory_pool)
    batches = list(reader)
    if len(batches) != 1:
        raise ValueError(f"corrupt block: expected 1 record batch, found {len(batches)}")
    return batches[0]


def encode_values(values: list[bytes], memory_pool: pa.MemoryPool | None = None) -> bytes:
    """A block of opaque byte strings, in order.

    ``memory_pool`` (default: Arrow's) holds the temporary buffers; the spill
    store passes the system allocator, which returns freed memory to the OS.
    """
    array = pa.array(values, pa.binary(), memory_pool=memory_pool)
    return encode_batch(pa.record_batch([array], schema=_VALUES_SCHEMA), memory_pool)


def decode_values(data: bytes) -> list[bytes]:
    """Inverse of :func:`encode_values`."""
    return decode_batch(data).column(0).to_pylist()
