"""In-memory structures of the spill store: windows, their blocks, their sizes.

Each (key, window) keeps its values in *blocks*. A block lives in memory
(m-bucket), in LMDB (p-bucket), or in both (persisted and staged back).
Values not yet in a block are the window's open *tail*. The structures are
plain records: the store's lock guards every field.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

_VALUE_OVERHEAD = 8  # rough per-value cost of the list slot, so tiny values still count


def _block_pool() -> pa.MemoryPool:
    """Where staged and encoded blocks live: jemalloc that purges freed pages at once.

    Blocks come and go all the time; Arrow's default pool (mimalloc) and glibc
    (whose per-thread arenas keep their high-water mark) both hold on to
    freed pages, which puts RSS far above the budget. Decay 0 only affects
    Arrow's jemalloc pool, which Arrow does not use by default (if the
    process made it Arrow's default, its decay is left alone).
    """
    try:
        pool = pa.jemalloc_memory_pool()
    except (NotImplementedError, pa.ArrowNotImplementedError):  # built without jemalloc
        return pa.system_memory_pool()
    if pa.default_memory_pool().backend_name != "jemalloc":
        # Only ours then: a process that chose jemalloc for Arrow keeps its decay.
        pa.jemalloc_set_decay_ms(0)
    return pool


_POOL = _block_pool()


def _size(values: list[bytes] | bytes) -> int:
    """Bytes a block's values count against the budget."""
    if type(values) is bytes:  # a staged block, still compressed
        return len(values)
    return sum(map(len, values)) + _VALUE_OVERHEAD * len(values)


@dataclass(eq=False)
class _Block:
    seq: int
    # A list in the m-bucket; None when only in LMDB; the compressed block
    # once staged back (decoded by the reader, a slice at a time).
    values: list[bytes] | bytes | None
    nbytes: int
    persisted: bool = False
    evict: bool = False  # drop from memory once persisted
    staging: bool = False


@dataclass(eq=False)
class _Window:
    key: bytes
    window: tuple[float, float]
    prefix: bytes  # of its blocks' LMDB keys (_keys)
    blocks: list[_Block] = field(default_factory=list)
    tail: list[bytes] = field(default_factory=list)
    tail_bytes: int = 0
    mem: int = 0  # bytes of sealed blocks held in memory
    destaged: bool = False
    expired: bool = False  # the watermark passed its end
    epoch: int = 0
    next_seq: int = 0
    readers: int = 0
    live: bool = True  # False once purged
    wanted: bool = False  # pre-staged for an upcoming re-execution
    held: int = 0  # bytes this window's admitted pre-staging holds of the allowance
    written: bool = False  # some block was sent to LMDB (a purge must delete there)


def _unstaged(win: _Window) -> list[_Block]:
    """The window's blocks only in LMDB and not yet requested from the I/O thread."""
    return [b for b in win.blocks if b.values is None and not b.staging]
