"""Window state split between a bounded memory bucket and an LMDB bucket (Aion 3-4).

Each (key, window) keeps its values in *blocks*. A block lives in memory
(m-bucket), in LMDB (p-bucket), or in both (persisted and staged back). One
I/O thread does every LMDB read and write, taking requests by priority:
pre-stage > late write > destage. Values are opaque ``bytes``; blocks are
stored as compressed Arrow IPC (``_arrow_blocks``). A staged block stays
compressed in memory until read; the reader decodes it a slice at a time.

Memory: the budget bounds the m-buckets, staged blocks and blocks waiting to
be written (adding values waits for the I/O thread once memory is a quarter
over budget). Pre-staging is admitted in order of planned re-execution while
the blocks it holds fit in ``prestage_bytes``.

LMDB key layout keeps a window's blocks contiguous and in insertion order::

    u16 len(key) | key | f64 start | f64 end | u64 block seq      (big-endian)

Durability: each block is written in its own LMDB transaction, so a crash
leaves every window with a prefix of its committed blocks and never half a
block. Environments open with ``sync=False``: a killed process loses nothing
committed, an operating-system crash may lose the latest blocks.

Damage: opening checks data.mdb against its meta pages first (``_lmdb_file``),
since LMDB maps the file and a truncated one kills the process with SIGBUS.
A marker file, written before the first block is committed, tells a store
whose data.mdb went missing or empty from a new one.
"""
from __future__ import annotations

from beam_ext.errors import BeamExtError
import concurrent.futures
import heapq
import itertools
import logging
import os
import queue
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

import lmdb
import pyarrow as pa

from beam_ext.state import _lmdb_file
from beam_ext.state._arrow_blocks import CorruptBlockError, decode_values_array, encode_values

__all__ = ["SpillStore", "SpillWindow", "SpillStoreError"]

_LOG = logging.getLogger(__name__)

_PRESTAGE, _PURGE, _LATE_WRITE, _DESTAGE, _STOP = 0, 0, 1, 2, 9
_VALUE_OVERHEAD = 8  # rough per-value cost of the list slot, so tiny values still count
_INITIAL_MAP_SIZE = 64 << 20
# Below this many bytes per write, the I/O thread encodes blocks itself: a
# hand-over to the serialisation pool and back waits twice for the GIL.
_PARALLEL_CODEC_BYTES = 1 << 20
_READ_SLICE = 64  # values a reader converts from a staged block at a time


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
_WINDOW = struct.Struct(">dd")
_SEQ = struct.Struct(">Q")
_KEYLEN = struct.Struct(">H")


class SpillStoreError(BeamExtError, RuntimeError):
    """The spill store cannot continue (full disk, corrupt environment, closed)."""


# ------------------------------------------------------- opening a directory

_LOST_DATA_POLICIES = ("raise", "warn")
_COMMITTED = "committed"  # beside data.mdb from the first committed block on
_COMMITTED_TEXT = ("data.mdb in this directory held committed spill store blocks; the store "
                   "refuses to open if data.mdb goes missing or empty.\n")


def _check_data_file(path: str, on_lost_data: str) -> bool:
    """Refuse a data.mdb that would crash LMDB or silently drop committed blocks.

    Returns whether the store committed blocks before (its marker exists).
    """
    data = os.path.join(path, "data.mdb")
    committed = os.path.exists(os.path.join(path, _COMMITTED))
    try:
        size = os.path.getsize(data)
    except FileNotFoundError:
        size = -1
    if committed and size <= 0:
        # LMDB would start a new, empty environment without a word.
        lost = (f"spill store at {path!r} lost every committed block: its data.mdb is "
                f"{'missing' if size < 0 else 'empty'}")
        if on_lost_data == "raise":
            raise SpillStoreError(lost + "; pass on_lost_data='warn' to start empty")
        _LOG.error("%s; starting empty (on_lost_data='warn')", lost)
    try:
        _lmdb_file.check_data_file(data)
    except (ValueError, OSError) as e:
        raise SpillStoreError(f"cannot open spill store at {path!r}: {e}") from e
    return committed


def _prefix(key: bytes, window: tuple[float, float]) -> bytes:
    return _KEYLEN.pack(len(key)) + key + _WINDOW.pack(*window)


def _parse(db_key: bytes) -> tuple[bytes, tuple[float, float], int]:
    (n,) = _KEYLEN.unpack_from(db_key, 0)
    key = db_key[2:2 + n]
    start, end = _WINDOW.unpack_from(db_key, 2 + n)
    (seq,) = _SEQ.unpack_from(db_key, 2 + n + _WINDOW.size)
    return key, (start, end), seq


def _size(values: "list[bytes] | bytes") -> int:
    if type(values) is bytes:  # a staged block, still compressed
        return len(values)
    return sum(map(len, values)) + _VALUE_OVERHEAD * len(values)


@dataclass(eq=False)
class _Block:
    seq: int
    # A list in the m-bucket; None when only in LMDB; the compressed block
    # once staged back (decoded by the reader: see _do_stage).
    values: "list[bytes] | bytes | None"
    nbytes: int
    persisted: bool = False
    evict: bool = False  # drop from memory once persisted
    staging: bool = False


@dataclass(eq=False)
class _Window:
    key: bytes
    window: tuple[float, float]
    prefix: bytes
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


@dataclass(order=True)
class _Op:
    priority: int
    order: int
    kind: str = field(compare=False)
    win: _Window | None = field(compare=False, default=None)
    epoch: int = field(compare=False, default=0)
    blocks: list[_Block] = field(compare=False, default_factory=list)
    done: threading.Event | None = field(compare=False, default=None)


class SpillWindow:
    """Handle on one (key, window) of a :class:`SpillStore`.

    Example::

        w = store.window(b"user-1", (0.0, 20.0))
        w.add([b"a", b"b"])
        list(w.iter())      # [b"a", b"b"]
    """

    def __init__(self, store: "SpillStore", win: _Window) -> None:
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


class SpillStore:
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
        self._budget = int(memory_budget_bytes)
        self._m_bucket = int(m_bucket_bytes if m_bucket_bytes is not None else self._budget // 8)
        self._block_bytes = int(block_bytes)
        self._bootstrap = float(bootstrap_fraction)
        self._expiry_threshold = float(destage_at_expiry_above) * self._budget
        self._prestage_bytes = int(prestage_bytes if prestage_bytes is not None
                                   else self._budget // 2)
        self._prestaged = 0  # bytes held by admitted pre-staging, not yet read
        self._prestage_queue: list[tuple[float, int, _Window, int]] = []
        self._lock = threading.Condition(threading.RLock())
        self._txn_lock = threading.Lock()
        self._windows: dict[tuple[bytes, float, float], _Window] = {}
        self._mem = 0
        self._error: BaseException | None = None
        self._closed = False
        self._order = itertools.count()
        self._pending_ops = 0
        self._last_policy_mem = 0
        self._stage_per_block = 0.0  # EWMA of seconds to stage one block
        self._queued_stage_blocks = 0  # requested, not yet staged: the I/O thread's backlog
        # A re-execution is an iteration of a destaged (past) window; Aion's
        # proactive caching aims to serve those from memory.
        self.stats = {"iterations": 0, "iterations_from_memory": 0,
                      "reexecutions": 0, "reexecutions_from_memory": 0,
                      "blocks_written": 0, "blocks_staged": 0, "serialize_seconds": 0.0}
        try:
            os.makedirs(self._path, exist_ok=True)
        except OSError as e:  # a file on the way, no permission, read-only file system
            raise SpillStoreError(f"cannot open spill store at {self._path!r}: cannot create "
                                  f"it as a directory ({e.strerror or e})") from e
        self._committed = _check_data_file(self._path, on_lost_data)
        try:
            self._env = lmdb.open(self._path, map_size=_INITIAL_MAP_SIZE, subdir=True,
                                  sync=False, metasync=False, max_dbs=0, lock=True)
            self._load_index()
        except lmdb.Error as e:
            raise SpillStoreError(f"cannot open spill store at {self._path!r}: {e}") from e
        if self._windows and not self._committed:
            self._mark_committed()  # written before markers existed
        self._serde_threads = serialization_threads
        self._codec_pool = concurrent.futures.ThreadPoolExecutor(
            serialization_threads, thread_name_prefix="spill-serde")
        self._queue: queue.PriorityQueue[_Op] = queue.PriorityQueue()
        n_io = 1 if sequential_io else 4
        self._sequential = sequential_io
        self._io_threads = [threading.Thread(target=self._io_loop, name=f"spill-io-{i}",
                                             daemon=True) for i in range(n_io)]
        for t in self._io_threads:
            t.start()

    # ---------------------------------------------------------------- public

    def window(self, key: bytes, window: tuple[float, float]) -> SpillWindow:
        """The handle for ``(key, window)``, created empty on first use."""
        if not isinstance(key, bytes):
            raise TypeError(f"key must be bytes, got {type(key).__name__}")
        try:
            start, end = (float(window[0]), float(window[1]))
        except (TypeError, IndexError, ValueError) as e:
            raise TypeError(f"window must be a (start, end) pair of numbers, got {window!r}") from e
        if len(key) > 0xFFFF:
            raise ValueError(f"key is {len(key)} bytes; at most 65535 are supported")
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
            for win in self._windows.values():
                if win.tail:
                    self._seal_tail(win)
                dirty = [b for b in win.blocks if not b.persisted and b.values is not None]
                if dirty:
                    self._submit(_LATE_WRITE, "write", win, dirty)
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
            for _ in self._io_threads:
                self._queue.put(_Op(_STOP, next(self._order), "stop"))
            for t in self._io_threads:
                t.join()
            self._codec_pool.shutdown()
            try:
                self._env.sync(True)
            finally:
                self._env.close()
        self._raise_if_failed()

    def __enter__(self) -> "SpillStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -------------------------------------------------------------- policies

    def _add(self, win: _Window, values: list[bytes]) -> None:
        # Values are checked by SpillWindow.add; in-package callers pass
        # coder output, which is bytes by construction.
        if self._error is not None:
            self._raise_if_failed()
        with self._lock:
            self._check_live(win)
            n = _size(values)
            win.tail.extend(values)
            win.tail_bytes += n
            self._mem += n
            if win.tail_bytes >= self._block_bytes:
                block = self._seal_tail(win)
                # Standard policy: past windows and full m-buckets write to the p-bucket.
                if win.destaged or win.mem > self._m_bucket:
                    # A pre-staged window keeps its new blocks: it is about to be read.
                    block.evict = not win.wanted
                    self._submit(_LATE_WRITE, "write", win, [block])
            # Re-plan only when memory grew by another block since the last
            # plan or the I/O thread is idle: the previous plan's destages
            # are still being written otherwise.
            over = self._mem > self._budget and (
                self._pending_ops == 0 or self._mem > self._last_policy_mem + self._block_bytes)
        if over:
            self._global_policy()

    def _seal_tail(self, win: _Window) -> _Block:
        block = _Block(win.next_seq, win.tail, win.tail_bytes)
        win.next_seq += 1
        win.blocks.append(block)
        win.mem += block.nbytes
        win.tail, win.tail_bytes = [], 0
        return block

    def _expire(self, win: _Window) -> None:
        self._raise_if_failed()
        with self._lock:
            self._check_live(win)
            win.expired = True
            if self._mem >= self._expiry_threshold:
                self._destage(win, 0.0)

    def _destage(self, win: _Window, keep_fraction: float) -> None:
        if not 0.0 <= keep_fraction <= 1.0:
            raise ValueError(f"keep_fraction must be in [0, 1], got {keep_fraction}")
        self._raise_if_failed()
        with self._lock:
            self._check_live(win)
            win.destaged = True
            if win.tail:
                self._seal_tail(win)
            keep = int(len(win.blocks) * keep_fraction + 0.999999) if keep_fraction else 0
            dirty = []
            for i, b in enumerate(win.blocks):
                if b.values is None:
                    continue
                b.evict = b.evict or i >= keep  # never un-evict: a later destage may keep less
                if not b.persisted:
                    dirty.append(b)
                elif b.evict and not win.readers:
                    self._drop(win, b)
            if dirty:
                self._submit(_DESTAGE, "write", win, dirty)

    def _prestage(self, win: _Window, deadline: float | None) -> None:
        self._raise_if_failed()
        with self._lock:
            self._check_live(win)
            win.wanted = True
            for b in win.blocks:
                b.evict = False  # including blocks still being written by a destage
            if deadline is None:
                self._admit(win)
            else:
                heapq.heappush(self._prestage_queue,
                               (deadline, next(self._order), win, win.epoch))
                self._admit_prestages()

    def _admit(self, win: _Window) -> None:
        need = self._request_staging(win)
        win.held += need
        self._prestaged += need

    def _admit_prestages(self) -> None:
        """Start queued pre-staging, earliest deadline first, while the allowance has room.

        Staging everything planned at once would hold every window of the
        coming watermark step in memory together; in deadline order, reads
        free room for the next windows while the I/O thread stays ahead.
        """
        queue_ = self._prestage_queue
        while queue_:
            _, _, win, epoch = queue_[0]
            if win.epoch != epoch or not win.wanted or win.held:
                heapq.heappop(queue_)  # read, released, purged or already admitted
                continue
            need = sum(b.nbytes for b in _unstaged(win))
            if self._prestaged and self._prestaged + need > self._prestage_bytes:
                return
            heapq.heappop(queue_)
            self._admit(win)

    def _unhold(self, win: _Window) -> None:
        if win.held:
            self._prestaged -= win.held
            win.held = 0
            self._admit_prestages()

    def _release(self, win: _Window) -> None:
        with self._lock:
            self._check_live(win)
            win.wanted = False
            self._unhold(win)
            if win.destaged and not win.readers:
                for b in win.blocks:
                    b.evict = True
                    if b.persisted:
                        self._drop(win, b)

    def _request_staging(self, win: _Window) -> int:
        """Queue the window's blocks that are only in LMDB; returns their bytes."""
        missing = _unstaged(win)
        for b in missing:
            b.staging = True
            b.evict = False
        if missing:
            self._queued_stage_blocks += len(missing)
            self._submit(_PRESTAGE, "stage", win, missing)
        return sum(b.nbytes for b in missing)

    def _purge(self, win: _Window) -> None:
        self._raise_if_failed()
        with self._lock:
            self._check_live(win)
            for b in win.blocks:
                if b.values is not None:
                    self._mem -= b.nbytes
            self._mem -= win.tail_bytes
            win.blocks, win.tail, win.tail_bytes, win.mem = [], [], 0, 0
            win.epoch += 1  # queued writes of the old epoch are skipped
            win.next_seq = 0
            win.destaged = win.expired = win.live = False
            self._unhold(win)
            del self._windows[(win.key, *win.window)]
            if not win.written:
                return  # never left memory: nothing to delete, no I/O round trip
            done = threading.Event()
            self._submit(_PURGE, "delete", win, [], done)
        done.wait()
        self._raise_if_failed()

    def _global_policy(self) -> None:
        """Destage windows largest-first down to their bootstrap fraction."""
        with self._lock:
            target = self._budget * 0.8
            in_flight = 0
            # Largest first (memory held is an upper bound of what a destage
            # releases; cheap to sort by); past windows before open ones,
            # which fire at their end and would have to be staged back.
            resident = sorted((w for w in self._windows.values() if w.mem + w.tail_bytes),
                              key=lambda w: w.mem + w.tail_bytes, reverse=True)
            for group in ([w for w in resident if w.expired],
                          [w for w in resident if not w.expired]):
                # Moderately scarce: keep a bootstrap fraction; if that is not
                # enough, destage everything (Aion's two global policies).
                for keep in (self._bootstrap, 0.0):
                    for win in group:
                        if self._mem - in_flight <= target:
                            break
                        before = self._releasable(win)
                        if before == 0 or win.readers or win.wanted:
                            continue  # pre-staged data is about to be read
                        self._destage(win, keep)
                        in_flight += before - self._releasable(win)
            # What memory will be once the planned destages are written.
            self._last_policy_mem = self._mem - in_flight
            # Back-pressure: values queued for writing stay in memory until
            # written; past a quarter over budget, wait until the I/O thread
            # has brought memory back under it (or has nothing left to do).
            if self._mem > 1.25 * self._budget and self._pending_ops > 0:
                self._lock.wait_for(lambda: self._mem <= self._budget or self._pending_ops == 0
                                    or self._error is not None)
        self._raise_if_failed()

    @staticmethod
    def _releasable(win: _Window) -> int:
        return win.tail_bytes + sum(b.nbytes for b in win.blocks
                                    if b.values is not None and not b.evict)

    def _staging_estimate(self, win: _Window) -> float:
        # Staging is FIFO among requests: this window waits for the backlog.
        with self._lock:
            own = len(_unstaged(win))
            return self._stage_per_block * (self._queued_stage_blocks + own)

    def _drop(self, win: _Window, b: _Block) -> None:
        if b.values is not None:
            b.values = None
            self._mem -= b.nbytes
            win.mem -= b.nbytes

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
                        self._lock.wait_for(lambda: b.values is not None or self._error is not None
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
                win.wanted = False
                self._unhold(win)
                if win.destaged and not win.readers and win.epoch == epoch:
                    # Aion frees a past window's m-bucket after its re-execution.
                    for b in win.blocks:
                        if b.persisted:
                            b.evict = True
                            self._drop(win, b)

    def _decode(self, win: _Window, b: _Block, data: bytes) -> pa.BinaryArray:
        try:
            return decode_values_array(data, _POOL)
        except CorruptBlockError as e:
            raise SpillStoreError(
                f"spill store at {self._path!r}: block {b.seq} of window {win.window} of key "
                f"{win.key!r}: {e}") from e

    # ------------------------------------------------------------ I/O thread

    def _submit(self, priority: int, kind: str, win: _Window, blocks: list[_Block],
                done: threading.Event | None = None) -> None:
        self._pending_ops += 1
        if kind == "write":
            win.written = True
        self._queue.put(_Op(priority, next(self._order), kind, win, win.epoch, blocks, done))

    def _drain(self) -> None:
        with self._lock:
            self._lock.wait_for(lambda: self._pending_ops == 0 or self._error is not None)
        self._raise_if_failed()

    def _io_loop(self) -> None:
        while True:
            op = self._queue.get()
            if op.kind == "stop":
                return
            ops = [op] + (self._take_queued_stages() if op.kind == "stage" else [])
            try:
                if self._error is None:
                    if op.kind == "write":
                        self._do_write(op)
                    elif op.kind == "stage":
                        self._do_stage(ops)
                    elif op.kind == "delete":
                        self._do_delete(op)
            except BaseException as e:  # surfaced to the caller on its next call
                with self._lock:
                    self._error = e
            finally:
                with self._lock:
                    self._pending_ops -= len(ops)
                    self._lock.notify_all()
                for o in ops:
                    if o.done is not None:
                        o.done.set()

    def _take_queued_stages(self) -> list[_Op]:
        """Every stage request at the head of the queue, to serve them in one pass.

        Each hand-over between the pipeline thread and this one waits for the
        GIL (up to the interpreter's switch interval while the pipeline thread
        runs Python), so one read call for all queued windows stages far more
        per unit of wall time than one per window.
        """
        out: list[_Op] = []
        with self._queue.mutex:  # PriorityQueue's own lock guards its heap
            heap = self._queue.queue
            while heap and heap[0].kind == "stage":
                out.append(heapq.heappop(heap))
        return out

    def _stale(self, op: _Op) -> bool:
        return op.win is None or op.win.epoch != op.epoch

    def _do_write(self, op: _Op) -> None:
        with self._lock:
            if self._stale(op):
                return
            todo = [(b, b.values) for b in op.blocks if not b.persisted and b.values is not None]
        step = self._serde_threads
        for i in range(0, len(todo), step):
            if i and self._more_urgent(op):
                # Aion: a destage is interrupted by staging requests.
                with self._lock:
                    self._pending_ops += 1
                self._queue.put(_Op(op.priority, next(self._order), "write", op.win, op.epoch,
                                    [b for b, _ in todo[i:]]))
                return
            if not self._write_blocks(op, todo[i:i + step]):
                return

    def _more_urgent(self, op: _Op) -> bool:
        with self._queue.mutex:
            heap = self._queue.queue
            return bool(heap) and heap[0].priority < op.priority

    def _write_blocks(self, op: _Op, todo: list) -> bool:
        t0 = time.perf_counter()
        if sum(b.nbytes for b, _ in todo) >= _PARALLEL_CODEC_BYTES:
            encoded = list(self._codec_pool.map(lambda bv: encode_values(bv[1], _POOL), todo))
        else:
            encoded = [encode_values(values, _POOL) for _, values in todo]
        self.stats["serialize_seconds"] += time.perf_counter() - t0
        for (b, _), data in zip(todo, encoded):
            # One transaction per block: a crash keeps whole blocks only. The
            # staleness check sits under the transaction lock so a purge's
            # delete can never run between it and the put.
            with self._txn_lock:
                with self._lock:
                    if self._stale(op):
                        return False
                if not self._committed:
                    self._mark_committed()
                self._with_resize(lambda txn: txn.put(op.win.prefix + _SEQ.pack(b.seq), data))
            with self._lock:
                if self._stale(op):
                    return False  # purged during the put: its memory is accounted for
                b.persisted = True
                self.stats["blocks_written"] += 1
                if b.evict and not op.win.readers:
                    self._drop(op.win, b)
        return True

    def _do_stage(self, ops: list[_Op]) -> None:
        t0 = time.perf_counter()
        with self._lock:
            self._queued_stage_blocks -= sum(len(op.blocks) for op in ops)
            todo = [(op, b) for op in ops if not self._stale(op) for b in op.blocks]
        if not todo:
            return
        # Staged blocks stay compressed until read, and the reader decodes
        # them: decoding here would make this thread take the GIL back after
        # every C call, each time waiting up to the switch interval while the
        # pipeline thread runs, so staging fell behind the watermark. Compressed
        # blocks are also several times smaller to hold.
        raw = self._get_many([op.win.prefix + _SEQ.pack(b.seq) for op, b in todo])
        elapsed = time.perf_counter() - t0
        with self._lock:
            for (op, b), values in zip(todo, raw):
                if self._stale(op):
                    continue
                b.staging = False
                if b.values is None:
                    b.values = values
                    b.nbytes = _size(values)
                    self._mem += b.nbytes
                    op.win.mem += b.nbytes
            self.stats["blocks_staged"] += len(todo)
            per_block = elapsed / len(todo)
            self._stage_per_block = (per_block if self._stage_per_block == 0.0
                                     else 0.8 * self._stage_per_block + 0.2 * per_block)
            self._lock.notify_all()

    def _do_delete(self, op: _Op) -> None:
        prefix = op.win.prefix
        with self._txn_lock:
            self._with_resize(lambda txn: self._delete_prefix(txn, prefix))

    @staticmethod
    def _delete_prefix(txn: lmdb.Transaction, prefix: bytes) -> None:
        cur = txn.cursor()
        if cur.set_range(prefix):
            while cur.key().startswith(prefix):
                if not cur.delete():
                    break

    # ------------------------------------------------------------------ LMDB

    def _get_many(self, keys: list[bytes]) -> list[bytes]:
        with self._txn_lock:
            try:
                with self._env.begin(buffers=False) as txn:
                    # One C call (one GIL release) for the whole batch.
                    found = dict(txn.cursor().getmulti(keys))
                out = [found.get(k) for k in keys]
            except lmdb.Error as e:
                raise SpillStoreError(f"spill store at {self._path!r}: read failed: {e}") from e
        for k, v in zip(keys, out):
            if v is None:
                raise SpillStoreError(
                    f"spill store at {self._path!r} lost block {_parse(k)[2]} of window "
                    f"{_parse(k)[1]} (corrupt environment?)")
        return out  # type: ignore[return-value]

    def _with_resize(self, body) -> None:
        """Run ``body(txn)`` in one write transaction, doubling the map when full."""
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    body(txn)
                return
            except lmdb.MapFullError:
                size = self._env.info()["map_size"]
                try:
                    self._env.set_mapsize(size * 2)
                except lmdb.Error as e:
                    raise SpillStoreError(
                        f"spill store at {self._path!r}: cannot grow map to {size * 2} bytes: {e}"
                    ) from e
            except lmdb.DiskError as e:
                raise SpillStoreError(f"spill store at {self._path!r}: disk full or failing: {e}") from e
            except OSError as e:
                raise SpillStoreError(f"spill store at {self._path!r}: write failed: {e}") from e
            except lmdb.Error as e:
                raise SpillStoreError(f"spill store at {self._path!r}: write failed: {e}") from e

    def _load_index(self) -> None:
        with self._env.begin() as txn:
            for db_key in txn.cursor().iternext(keys=True, values=False):
                try:
                    key, window, seq = _parse(db_key)
                except struct.error as e:
                    raise SpillStoreError(
                        f"spill store at {self._path!r} holds a malformed key {db_key!r}") from e
                win = self._windows.get((key, *window))
                if win is None:
                    win = _Window(key, window, _prefix(key, window), destaged=True, written=True)
                    self._windows[(key, *window)] = win
                win.blocks.append(_Block(seq, None, 0, persisted=True))
                win.next_seq = seq + 1

    def _mark_committed(self) -> None:
        """Leave the marker that blocks were committed (see ``_check_data_file``)."""
        marker = os.path.join(self._path, _COMMITTED)
        try:
            with open(marker, "w") as f:
                f.write(_COMMITTED_TEXT)
        except OSError as e:
            raise SpillStoreError(
                f"spill store at {self._path!r}: cannot write {marker!r}: {e}") from e
        self._committed = True

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
            raise SpillStoreError(f"spill store at {self._path!r} failed: {self._error!r}") from self._error

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
