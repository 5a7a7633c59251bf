"""The spill store's API: :class:`SpillStore` and its per-window handle.

Window state split between a bounded memory bucket and an LMDB bucket (Aion
3-4). :class:`SpillStore` puts together the memory policy (``_policy``) and
the I/O thread (``_io``) over the in-memory structures (``_blocks``) and the
LMDB directory (``_pbucket``, keys laid out by ``_keys``); it owns the lock,
the windows and the failure state they share, and reads windows back.
Values are opaque ``bytes``; a staged block stays compressed in memory until
read, and the reader decodes it a slice at a time.
"""
from __future__ import annotations

import itertools
import os
import threading
from collections.abc import Iterator

import pyarrow as pa

from beam_ext.state._arrow_blocks import CorruptBlockError, decode_values_array
from beam_ext.state.spill_store._blocks import _POOL, _Block, _size, _Window
from beam_ext.state.spill_store._errors import SpillStoreError
from beam_ext.state.spill_store._io import _IoThread
from beam_ext.state.spill_store._keys import _MAX_KEY_BYTES, _prefix
from beam_ext.state.spill_store._pbucket import _LOST_DATA_POLICIES, _PBucket
from beam_ext.state.spill_store._policy import _MemoryPolicy

__all__ = ["SpillStore", "SpillStoreError", "SpillWindow"]

_READ_SLICE = 64  # values a reader converts from a staged block at a time


class SpillWindow:
    """Handle on one (key, window) of a :class:`SpillStore`.

    Example::

        w = store.window(b"user-1", (0.0, 20.0))
        w.add([b"a", b"b"])
        list(w.iter())      # [b"a", b"b"]
    """

    def __init__(self, store: SpillStore, win: _Window) -> None:
        self._store = store
        self._win = win

    @property
    def key(self) -> bytes:
        return self._win.key

    @property
    def window(self) -> tuple[float, float]:
        return self._win.window

    def add(self, values: list[bytes]) -> None:
        """Append encoded values (m-bucket while it has room, else p-bucket). O(len(values))."""
        if not isinstance(values, list):
            raise TypeError(f"values must be a list of bytes, got {type(values).__name__}")
        if set(map(type, values)) - {bytes}:
            i = next(i for i, v in enumerate(values) if type(v) is not bytes)
            raise TypeError(f"values[{i}] must be bytes, got {type(values[i]).__name__}")
        self._store._add(self._win, values)

    def _extend(self, values: list[bytes]) -> None:
        """:meth:`add` without the type checks, for callers that hold coder output."""
        self._store._add(self._win, values)

    def iter(self) -> Iterator[bytes]:
        """Lazy iterator over every value in insertion order.

        Blocks already in memory are yielded at once; blocks only in LMDB are
        requested from the I/O thread at pre-stage priority when iteration
        starts and yielded as they arrive.
        """
        return self._store._iter(self._win)

    def expire(self) -> None:
        """The watermark passed the window's end: destage it if memory is getting full.

        Above ``destage_at_expiry_above`` of the budget the window is destaged
        at once (Aion's standard policy when that fraction is 0); below, it
        stays in memory until the global policy needs the room, past windows
        first.
        """
        self._store._expire(self._win)

    def destage(self, keep_fraction: float = 0.0) -> None:
        """Move the window to the p-bucket, keeping its first ``keep_fraction`` of blocks."""
        self._store._destage(self._win, keep_fraction)

    def prestage(self, deadline: float | None = None) -> None:
        """Ask the I/O thread to bring the p-bucket back into memory (asynchronous).

        ``deadline`` is when the window will be read, on any clock shared by
        the caller's requests (e.g. event time); pre-staging is admitted in
        deadline order within ``prestage_bytes``, the rest waits until reads
        free room. None stages at once.
        """
        self._store._prestage(self._win, deadline)

    def release(self) -> None:
        """Free pre-staged blocks of a past window whose planned re-execution did not happen."""
        self._store._release(self._win)

    def purge(self) -> None:
        """Delete the window from memory and LMDB; blocks until deleted."""
        self._store._purge(self._win)

    def staging_seconds(self) -> float:
        """Estimated seconds until this window's p-bucket would be staged if requested now.

        Measured staging time per block times the blocks already queued for
        staging plus this window's own blocks in LMDB.
        """
        return self._store._staging_estimate(self._win)

    def __len__(self) -> int:
        """Number of blocks plus open values; 0 means the window holds nothing."""
        return len(self._win.blocks) + len(self._win.tail)


class SpillStore(_MemoryPolicy, _IoThread):
    """Per-(key, window) value lists that spill to LMDB under a memory budget.

    Example::

        store = SpillStore("/tmp/state", memory_budget_bytes=64 << 20)
        w = store.window(b"k", (0.0, 20.0))
        w.add([b"x"]); w.destage()          # past window: values go to LMDB
        w.add([b"late"])                    # late write, straight to the p-bucket
        w.prestage(); list(w.iter())        # [b"x", b"late"]
        store.close()                       # reopening the path gives both back

    ``m_bucket_bytes`` bounds one window's memory bucket (default: an eighth of
    the budget); ``block_bytes`` is the block size; ``bootstrap_fraction`` is
    what the global policy keeps in memory of a window it destages.
    ``destage_at_expiry_above`` is the fraction of the budget in use above
    which :meth:`SpillWindow.expire` destages at once (0: always, Aion's
    standard policy). ``prestage_bytes`` (default: half the budget) bounds
    what pre-staged windows hold before they are read.
    ``serialization_threads`` and ``sequential_io`` exist for the ablations
    of Aion figure 8.

    A damaged directory raises :class:`SpillStoreError` naming the path:
    data.mdb truncated or not LMDB, a corrupt block (when read), a path that
    cannot be a directory. A store that committed blocks and comes back with
    data.mdb missing or empty raises too, unless ``on_lost_data="warn"``,
    which logs an error and starts empty.
    """

    def __init__(
        self,
        path: str,
        memory_budget_bytes: int = 64 << 20,
        *,
        m_bucket_bytes: int | None = None,
        block_bytes: int = 256 << 10,
        bootstrap_fraction: float = 0.1,
        serialization_threads: int = 2,
        sequential_io: bool = True,
        destage_at_expiry_above: float = 0.5,
        prestage_bytes: int | None = None,
        on_lost_data: str = "raise",
    ) -> None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or PathLike, got {type(path).__name__}")
        if memory_budget_bytes <= 0:
            raise ValueError(f"memory_budget_bytes must be > 0, got {memory_budget_bytes}")
        if block_bytes <= 0:
            raise ValueError(f"block_bytes must be > 0, got {block_bytes}")
        if not 0.0 <= bootstrap_fraction <= 1.0:
            raise ValueError(f"bootstrap_fraction must be in [0, 1], got {bootstrap_fraction}")
        if serialization_threads < 1:
            raise ValueError(f"serialization_threads must be >= 1, got {serialization_threads}")
        if not 0.0 <= destage_at_expiry_above <= 1.0:
            raise ValueError(
                f"destage_at_expiry_above must be in [0, 1], got {destage_at_expiry_above}")
        if prestage_bytes is not None and prestage_bytes < 0:
            raise ValueError(f"prestage_bytes must be >= 0, got {prestage_bytes}")
        if m_bucket_bytes is not None and m_bucket_bytes < 0:
            raise ValueError(f"m_bucket_bytes must be >= 0, got {m_bucket_bytes}")
        if on_lost_data not in _LOST_DATA_POLICIES:
            raise ValueError(
                f"on_lost_data must be one of {_LOST_DATA_POLICIES}, got {on_lost_data!r}")
        self._path = os.fspath(path)
        self._init_policy(memory_budget_bytes, m_bucket_bytes, block_bytes, bootstrap_fraction,
                          destage_at_expiry_above, prestage_bytes)
        self._lock = threading.Condition(threading.RLock())
        self._windows: dict[tuple[bytes, float, float], _Window] = {}
        self._error: BaseException | None = None
        self._closed = False
        # A re-execution is an iteration of a destaged (past) window; Aion's
        # proactive caching aims to serve those from memory.
        self.stats = {"iterations": 0, "iterations_from_memory": 0,
                      "reexecutions": 0, "reexecutions_from_memory": 0,
                      "blocks_written": 0, "blocks_staged": 0, "serialize_seconds": 0.0}
        disk = _PBucket(self._path, on_lost_data)
        self._load_index(disk)
        self._start_io(disk, serialization_threads, sequential_io)

    # ---------------------------------------------------------------- public

    def window(self, key: bytes, window: tuple[float, float]) -> SpillWindow:
        """The handle for ``(key, window)``, created empty on first use."""
        if not isinstance(key, bytes):
            raise TypeError(f"key must be bytes, got {type(key).__name__}")
        try:
            start, end = (float(window[0]), float(window[1]))
        except (TypeError, IndexError, ValueError) as e:
            raise TypeError(f"window must be a (start, end) pair of numbers, got {window!r}") from e
        if len(key) > _MAX_KEY_BYTES:
            raise ValueError(f"key is {len(key)} bytes; at most {_MAX_KEY_BYTES} are supported")
        self._raise_if_failed()
        with self._lock:
            win = self._windows.get((key, start, end))
            if win is None:
                win = _Window(key, (start, end), _prefix(key, (start, end)))
                self._windows[(key, start, end)] = win
            return SpillWindow(self, win)

    def windows(self) -> list[tuple[bytes, tuple[float, float]]]:
        """Every (key, window) holding values, in no particular order."""
        with self._lock:
            return [(w.key, w.window) for w in self._windows.values() if w.blocks or w.tail]

    def memory_bytes(self) -> int:
        """Bytes of values held in memory (m-buckets, open blocks, staged blocks)."""
        with self._lock:
            return self._mem

    def flush(self) -> None:
        """Write every value held only in memory to LMDB and wait until committed."""
        self._raise_if_failed()
        with self._lock:
            dirty = []
            for win in self._windows.values():
                if win.tail:
                    self._seal_tail(win)
                dirty.extend((win, b) for b in win.blocks if not b.persisted and b.values is not None)
            if dirty:
                # One transaction for all: a commit per block made a flush of
                # many small windows cost milliseconds per window.
                self._submit_flush(dirty)
        self._drain()

    def close(self) -> None:
        """Flush, stop the I/O thread and close LMDB. Idempotent."""
        if self._closed:
            return
        try:
            if self._error is None:
                self.flush()
        finally:
            self._closed = True
            self._stop_io()
        self._raise_if_failed()

    def __enter__(self) -> SpillStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --------------------------------------------------------------- opening

    def _load_index(self, disk: _PBucket) -> None:
        """Every window with blocks in LMDB, destaged: nothing of it is in memory."""
        for key, window, seq in disk.read_index():
            win = self._windows.get((key, *window))
            if win is None:
                win = _Window(key, window, _prefix(key, window), destaged=True, written=True)
                self._windows[(key, *window)] = win
            win.blocks.append(_Block(seq, None, 0, persisted=True))
            win.next_seq = seq + 1

    # ------------------------------------------------------------- iteration

    def _iter(self, win: _Window) -> Iterator[bytes]:
        self._raise_if_failed()
        with self._lock:
            self._check_live(win)
            blocks = list(win.blocks)
            tail = list(win.tail)
            from_memory = all(b.values is not None for b in blocks)
            self.stats["iterations"] += 1
            self.stats["iterations_from_memory"] += from_memory
            if win.destaged:
                self.stats["reexecutions"] += 1
                self.stats["reexecutions_from_memory"] += from_memory
            if not from_memory:
                self._request_staging(win)
            win.readers += 1
        # Chunks are whole blocks; chaining them in C keeps per-value cost low.
        return itertools.chain.from_iterable(self._chunks(win, blocks, tail))

    def _chunks(self, win: _Window, blocks: list[_Block],
                tail: list[bytes]) -> Iterator[list[bytes]]:
        epoch = win.epoch
        try:
            for b in blocks:
                values = b.values
                if values is None:
                    with self._lock:
                        # B023: the lambda is only called inside this iteration.
                        self._lock.wait_for(lambda: b.values is not None  # noqa: B023
                                            or self._error is not None
                                            or win.epoch != epoch)
                        values = b.values
                    self._raise_if_failed()
                    if values is None:
                        raise SpillStoreError("window was purged while being iterated")
                if type(values) is bytes:
                    # Converted a slice at a time: a whole staged window as
                    # Python bytes would double its memory during the read.
                    array = self._decode(win, b, values)
                    for i in range(0, len(array), _READ_SLICE):
                        yield array.slice(i, _READ_SLICE).to_pylist()
                else:
                    yield values
            yield tail
        finally:
            with self._lock:
                win.readers -= 1
                self._read_done(win, epoch)

    def _decode(self, win: _Window, b: _Block, data: bytes) -> pa.BinaryArray:
        try:
            return decode_values_array(data, _POOL)
        except CorruptBlockError as e:
            raise SpillStoreError(
                f"spill store at {self._path!r}: block {b.seq} of window {win.window} of key "
                f"{win.key!r}: {e}") from e

    # ---------------------------------------------------------------- checks

    def _check_live(self, win: _Window) -> None:
        if self._closed:
            raise SpillStoreError(f"spill store at {self._path!r} is closed")
        if not win.live:
            raise SpillStoreError(
                f"window {win.window} of key {win.key!r} was purged; get a new handle "
                "with store.window()")

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            if isinstance(self._error, SpillStoreError):
                raise self._error
            raise SpillStoreError(
                f"spill store at {self._path!r} failed: {self._error!r}") from self._error

    def _check(self) -> None:
        """Assert every invariant (for tests; O(state))."""
        with self._lock:
            total = held = 0
            for (k, s, e), win in self._windows.items():
                assert (win.key, win.window) == (k, (s, e))
                seqs = [b.seq for b in win.blocks]
                assert seqs == sorted(set(seqs)), f"block order broken: {seqs}"
                assert not seqs or win.next_seq > seqs[-1]
                mem = 0
                for b in win.blocks:
                    assert b.values is not None or b.persisted, "block lost: neither memory nor LMDB"
                    if b.values is not None:
                        assert b.nbytes == _size(b.values)
                        mem += b.nbytes
                assert win.mem == mem, (win.mem, mem)
                assert win.tail_bytes == _size(win.tail)
                assert win.readers >= 0
                held += win.held
                total += mem + win.tail_bytes
            assert total == self._mem, (total, self._mem)
            assert held == self._prestaged, (held, self._prestaged)
