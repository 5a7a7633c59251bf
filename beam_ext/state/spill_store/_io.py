"""The spill store's I/O thread: one priority queue of LMDB reads and writes.

One I/O thread does every LMDB read and write, taking requests by priority:
pre-stage (and purge) > late write > destage. Blocks are stored as compressed
Arrow IPC (``beam_ext.state._arrow_blocks``); a staged block stays compressed
in memory until read, and the reader decodes it.
"""
from __future__ import annotations

import concurrent.futures
import heapq
import itertools
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from beam_ext.state._arrow_blocks import encode_values
from beam_ext.state.spill_store._blocks import _POOL, _Block, _size, _unstaged, _Window
from beam_ext.state.spill_store._keys import _block_key
from beam_ext.state.spill_store._pbucket import _PBucket

_PRESTAGE, _PURGE, _LATE_WRITE, _DESTAGE, _STOP = 0, 0, 1, 2, 9
# Below this many bytes per write, the I/O thread encodes blocks itself: a
# hand-over to the serialisation pool and back waits twice for the GIL.
_PARALLEL_CODEC_BYTES = 1 << 20


@dataclass(order=True)
class _Op:
    priority: int
    order: int
    kind: str = field(compare=False)
    win: _Window | None = field(compare=False, default=None)
    epoch: int = field(compare=False, default=0)
    blocks: list[_Block] = field(compare=False, default_factory=list)
    done: threading.Event | None = field(compare=False, default=None)
    # A flush: (window, its epoch, block) of every window, written together.
    writes: list[tuple[_Window, int, _Block]] = field(compare=False, default_factory=list)


# A block to write: its window, the window's epoch when queued, the block, its values.
_Entry = tuple[_Window, int, _Block, list[bytes]]


class _IoThread:
    """Mixin of :class:`SpillStore`: the I/O thread, its queue and the p-bucket.

    Owns the request queue, the count of requests not yet served, the
    staging backlog and its measured cost per block, the serialisation pool
    and the :class:`_PBucket` (from :meth:`_start_io` on). A request is
    skipped once its window's epoch moved on (the window was purged).

    Expects from the store: ``_lock`` (a re-entrant condition that guards
    every window and counter, notified when a request is served), ``_error``
    (set here when a request fails; later requests are then skipped),
    ``_raise_if_failed`` and ``stats``. Expects from the memory policy:
    ``_mem`` (staged blocks count against it) and ``_drop`` (frees a block
    written while marked for eviction).
    """

    _lock: threading.Condition
    _error: BaseException | None
    stats: dict[str, float]
    _mem: int

    if TYPE_CHECKING:
        def _raise_if_failed(self) -> None: ...

        def _drop(self, win: _Window, b: _Block) -> None: ...

    def _start_io(self, disk: _PBucket, serialization_threads: int, sequential_io: bool) -> None:
        """Take over ``disk`` and start the I/O thread (four of them unless ``sequential_io``)."""
        self._disk = disk
        self._order = itertools.count()
        self._pending_ops = 0
        self._stage_per_block = 0.0  # EWMA of seconds to stage one block
        self._queued_stage_blocks = 0  # requested, not yet staged: the I/O thread's backlog
        self._serde_threads = serialization_threads
        self._codec_pool = concurrent.futures.ThreadPoolExecutor(
            serialization_threads, thread_name_prefix="spill-serde")
        self._queue: queue.PriorityQueue[_Op] = queue.PriorityQueue()
        n_io = 1 if sequential_io else 4
        self._io_threads = [threading.Thread(target=self._io_loop, name=f"spill-io-{i}",
                                             daemon=True) for i in range(n_io)]
        for t in self._io_threads:
            t.start()

    def _stop_io(self) -> None:
        """Stop the I/O threads once the queue is served, then close the p-bucket."""
        for _ in self._io_threads:
            self._queue.put(_Op(_STOP, next(self._order), "stop"))
        for t in self._io_threads:
            t.join()
        self._codec_pool.shutdown()
        self._disk.close()

    # -------------------------------------------------------------- requests

    def _submit(self, priority: int, kind: str, win: _Window, blocks: list[_Block],
                done: threading.Event | None = None) -> None:
        """Queue a ``write``, ``stage`` or ``delete`` of ``win`` (caller holds ``_lock``)."""
        self._pending_ops += 1
        if kind == "write":
            win.written = True
        self._queue.put(_Op(priority, next(self._order), kind, win, win.epoch, blocks, done))

    def _submit_flush(self, writes: list[tuple[_Window, _Block]]) -> None:
        """Queue one write of blocks of many windows, one transaction (caller holds ``_lock``)."""
        self._pending_ops += 1
        for win, _ in writes:
            win.written = True
        self._queue.put(_Op(_LATE_WRITE, next(self._order), "flush",
                            writes=[(win, win.epoch, b) for win, b in writes]))

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

    def _staging_estimate(self, win: _Window) -> float:
        # Staging is FIFO among requests: this window waits for the backlog.
        with self._lock:
            own = len(_unstaged(win))
            return self._stage_per_block * (self._queued_stage_blocks + own)

    def _drain(self) -> None:
        """Wait until every queued request is served."""
        with self._lock:
            self._lock.wait_for(lambda: self._pending_ops == 0 or self._error is not None)
        self._raise_if_failed()

    # ------------------------------------------------------------ the thread

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
                    elif op.kind == "flush":
                        self._do_flush(op)
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

    def _more_urgent(self, op: _Op) -> bool:
        with self._queue.mutex:
            heap = self._queue.queue
            return bool(heap) and heap[0].priority < op.priority

    def _do_write(self, op: _Op) -> None:
        with self._lock:
            if self._stale(op):
                return
            todo: list[_Entry] = [(op.win, op.epoch, b, b.values) for b in op.blocks
                                  if not b.persisted and b.values is not None]
        step = self._serde_threads
        for i in range(0, len(todo), step):
            if i and self._more_urgent(op):
                # Aion: a destage is interrupted by staging requests.
                with self._lock:
                    self._pending_ops += 1
                self._queue.put(_Op(op.priority, next(self._order), "write", op.win, op.epoch,
                                    [b for _, _, b, _ in todo[i:]]))
                return
            if not self._write_blocks(todo[i:i + step]):
                return

    def _do_flush(self, op: _Op) -> None:
        # Not interrupted: its caller waits for all of it, and each block in
        # a transaction of its own cost more than the encoding.
        with self._lock:
            todo: list[_Entry] = [(win, epoch, b, b.values) for win, epoch, b in op.writes
                                  if win.epoch == epoch and not b.persisted and b.values is not None]
        if todo:
            self._write_blocks(todo)

    def _encode(self, values: list[list[bytes]]) -> list[bytes]:
        if len(values) > 1 and sum(map(_size, values)) >= _PARALLEL_CODEC_BYTES:
            # A task per thread, not per block: many small blocks would each
            # pay a hand-over.
            n = self._serde_threads
            chunks = [values[i::n] for i in range(n)]
            done = list(self._codec_pool.map(
                lambda chunk: [encode_values(v, _POOL) for v in chunk], chunks))
            out: list[bytes] = [b""] * len(values)
            for i, chunk in enumerate(done):
                out[i::n] = chunk
            return out
        return [encode_values(v, _POOL) for v in values]

    def _write_blocks(self, todo: list[_Entry]) -> bool:
        """Encode and commit ``todo`` in one transaction; returns whether all were written."""
        # A duration for stats, not a deadline: nothing waits on the clock.
        t0 = time.perf_counter()
        encoded = self._encode([values for _, _, _, values in todo])
        self.stats["serialize_seconds"] += time.perf_counter() - t0

        def purged() -> list[bool]:
            with self._lock:
                return [win.epoch != epoch for win, epoch, _, _ in todo]

        # One transaction: a crash keeps all of these blocks or none, so every
        # window keeps a prefix of its blocks. The staleness check runs under
        # the transaction lock, so a purge's delete can never run between it
        # and the puts.
        put = self._disk.put_many(
            [(_block_key(win.prefix, b.seq), data) for (win, _, b, _), data in zip(todo, encoded)],
            skip=purged)
        complete = True
        with self._lock:
            for (win, epoch, b, _), was_put in zip(todo, put):
                if not was_put or win.epoch != epoch:
                    complete = False  # purged, before or during the put: memory is accounted for
                    continue
                b.persisted = True
                self.stats["blocks_written"] += 1
                if b.evict and not win.readers:
                    self._drop(win, b)
        return complete

    def _do_stage(self, ops: list[_Op]) -> None:
        # A duration, not a deadline: the cost per block behind staging_seconds().
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
        raw = self._disk.get_many([_block_key(op.win.prefix, b.seq) for op, b in todo])
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
        self._disk.delete_prefix(op.win.prefix)
