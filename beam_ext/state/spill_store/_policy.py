"""The spill store's memory policy (Aion sections 3-4): what stays in memory.

Standard policy: a window's values fill its m-bucket; past windows and full
m-buckets write new blocks to the p-bucket. Global policy: past the budget,
destage windows largest first. Pre-staging brings destaged windows back
before their re-execution, admitted in order of planned re-execution while
the blocks it holds fit in ``prestage_bytes``.

Memory: the budget bounds the m-buckets, staged blocks and blocks waiting to
be written (adding values waits for the I/O thread once memory is a quarter
over budget).
"""
from __future__ import annotations

import heapq
import itertools
import threading
from typing import TYPE_CHECKING

from beam_ext.state.spill_store._blocks import _Block, _size, _unstaged, _Window
from beam_ext.state.spill_store._io import _DESTAGE, _LATE_WRITE, _PURGE


class _MemoryPolicy:
    """Mixin of :class:`SpillStore`: memory accounting and every decision on it.

    Owns the bytes held in memory (``_mem``), the budget and its knobs, and
    the pre-staging allowance with its deadline queue. Decides when a block
    is written, when a window is destaged, which pre-staging is admitted and
    when memory is freed.

    Expects from the store: ``_lock`` (a re-entrant condition that guards
    every window and counter; these methods take it themselves), ``_windows``
    (every live window by ``(key, start, end)``), ``_error``, ``_check_live``
    and ``_raise_if_failed``. Expects from the I/O thread: ``_submit``,
    ``_request_staging`` and ``_pending_ops`` (requests not yet served).
    """

    _lock: threading.Condition
    _windows: dict[tuple[bytes, float, float], _Window]
    _error: BaseException | None
    _pending_ops: int

    if TYPE_CHECKING:
        def _check_live(self, win: _Window) -> None: ...

        def _raise_if_failed(self) -> None: ...

        def _submit(self, priority: int, kind: str, win: _Window, blocks: list[_Block],
                    done: threading.Event | None = None) -> None: ...

        def _request_staging(self, win: _Window) -> int: ...

    def _init_policy(self, memory_budget_bytes: int, m_bucket_bytes: int | None,
                     block_bytes: int, bootstrap_fraction: float,
                     destage_at_expiry_above: float, prestage_bytes: int | None) -> None:
        """Set the knobs (checked by the store's constructor); nothing held yet."""
        self._budget = int(memory_budget_bytes)
        self._m_bucket = int(m_bucket_bytes if m_bucket_bytes is not None else self._budget // 8)
        self._block_bytes = int(block_bytes)
        self._bootstrap = float(bootstrap_fraction)
        self._expiry_threshold = float(destage_at_expiry_above) * self._budget
        self._prestage_bytes = int(prestage_bytes if prestage_bytes is not None
                                   else self._budget // 2)
        self._prestaged = 0  # bytes held by admitted pre-staging, not yet read
        self._prestage_queue: list[tuple[float, int, _Window, int]] = []
        self._prestage_order = itertools.count()  # ties in the queue: first come first
        self._mem = 0
        self._last_policy_mem = 0

    # ------------------------------------------------------ standard policy

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

    def _drop(self, win: _Window, b: _Block) -> None:
        """Free a block's memory (it must be persisted, or purged)."""
        if b.values is not None:
            b.values = None
            self._mem -= b.nbytes
            win.mem -= b.nbytes

    # ----------------------------------------------------------- pre-staging

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
                               (deadline, next(self._prestage_order), win, win.epoch))
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

    def _read_done(self, win: _Window, epoch: int) -> None:
        """A reader of ``win`` that started in ``epoch`` finished (caller holds ``_lock``)."""
        win.wanted = False
        self._unhold(win)
        if win.destaged and not win.readers and win.epoch == epoch:
            # Aion frees a past window's m-bucket after its re-execution.
            for b in win.blocks:
                if b.persisted:
                    b.evict = True
                    self._drop(win, b)

    # --------------------------------------------------------- global policy

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
