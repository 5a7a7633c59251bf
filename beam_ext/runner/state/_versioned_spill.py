"""Streaming bag state on a SpillStore under the checkpoint, versioned by micro-batch.

Each (stage owner, partition) keeps one LMDB :class:`~beam_ext.state.SpillStore`
in ``<state root>/<owner>/<partition>/spill``. The store never holds a bag as
"the" current value; it holds immutable *segments*: the values one task
attempt appended to one bag. A segment is a store window: key = the Fn API
state key, window = ``(batch, attempt)``, the attempt a random 52-bit number
(exact in a float) drawn by each task.

A bag's value at a batch is its *chain*, the list of segments to concatenate
(a clear empties the chain). The chains of every bag of the partition are
the *manifest*; it is saved in the partition's pickled version file
(:mod:`._versioned`) with the timers, so the commit that makes a version of
that file current makes its manifest current too. Hence:

* a task of batch N reads the chains of the committed version R and only
  adds segments ``(N, attempt)``: R's segments are never changed, so a retry,
  or a batch run again after a crash, starts from exactly R;
* the store is flushed and synced before the version file is renamed into
  place, so a manifest never names a segment that is not on disk;
* a task starts by deleting every segment no version file on disk names
  (those a restart can need): superseded segments once a later version is
  committed, and those of failed or abandoned attempts;
* one process at a time opens a partition's store: LMDB allows a single
  writer and each process keeps its own index of the store. A task takes an
  exclusive ``flock`` on ``spill.lock`` first and waits for it (a retry
  while the failed attempt's process is still alive); the operating system
  drops the lock of a killed process.

Example::

    state = open_partition_state({}, "/ckpt/state", "stage2", 0, batch=5, memory_bytes=64 << 20,
                                 chains=saved_chains_of_version_4)
    ...  # the task's bundles append, read and clear bags through it
    chains = state.seal()        # flushed, synced, closed: save chains with version 5
    state.close()                # releases the partition
"""
from __future__ import annotations

import errno
import fcntl
import itertools
import os
import re
import secrets
import time
from typing import Any, Iterable, Mapping

from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.portability.fn_api_runner import worker_handlers

from beam_ext.errors import BeamExtError
from beam_ext.runner.state._memory import SideInputsFirst
from beam_ext.state import SpillStore

__all__ = ["PartitionSpillState", "SpillPartitionBusy", "open_partition_state"]

Segment = tuple[float, float]  # (batch, attempt): a store window
Chains = dict[bytes, list[Segment]]  # serialized state key -> its segments, oldest first

_LOCK_WAIT_SECONDS = 600.0
_BLOCK_BYTES = 256 << 10  # the store's default, for budgets of 4 MiB and more
_MAX_CHAIN = 8  # a longer chain is rewritten as one segment when read
_VERSION_FILE = re.compile(r"^(\d+)\.bin$")


class SpillPartitionBusy(BeamExtError, RuntimeError):
    """Another process held a partition's spill store for longer than the wait allowed."""


class PartitionSpillState(SideInputsFirst, worker_handlers.StateServicer):
    """The Fn API state servicer of one streaming task on the spill backend.

    Bag user state lives in the partition's store as segments (module
    docstring); other user state types are kept in memory, as by Beam's
    servicer, and saved with the version file by the task.
    """

    def __init__(self, side_inputs: Mapping[bytes, bytes], store: SpillStore, lock_fd: int,
                 batch: int, chains: Chains) -> None:
        super().__init__()
        self._side_inputs = side_inputs
        self.store = store
        self._lock_fd: int | None = lock_fd
        self._segment: Segment = (float(batch), float(secrets.randbits(52)))
        self.chains: Chains = {key: list(chain) for key, chain in chains.items()}
        self._sealed = False

    @staticmethod
    def _is_bag(state_key: beam_fn_api_pb2.StateKey) -> bool:
        return state_key.WhichOneof("type") == "bag_user_state"

    def get_raw(self, state_key: beam_fn_api_pb2.StateKey,
                continuation_token: bytes | None = None) -> tuple[bytes, bytes | None]:
        if not self._is_bag(state_key):
            return super().get_raw(state_key, continuation_token)
        key = state_key.SerializeToString()
        chain = self.chains.get(key)
        if not chain:
            return b"", None
        store = self.store
        # Each appended chunk is already an encoded run of elements.
        data = b"".join(itertools.chain.from_iterable(store.window(key, seg).iter() for seg in chain))
        if len(chain) > _MAX_CHAIN:
            # A bag appended to in many batches: one segment of this attempt
            # instead, so reads stop paying one window per batch.
            self._drop_own(key, chain)
            if data:
                store.window(key, self._segment).add([data])
                self.chains[key] = [self._segment]
            else:
                del self.chains[key]
        return data, None

    def append_raw(self, state_key: beam_fn_api_pb2.StateKey, data: bytes) -> Any:
        if not self._is_bag(state_key):
            return super().append_raw(state_key, data)
        key = state_key.SerializeToString()
        chain = self.chains.setdefault(key, [])
        if not chain or chain[-1] != self._segment:
            chain.append(self._segment)
        self.store.window(key, self._segment).add([bytes(data)])
        return worker_handlers._Future.done()

    def clear(self, state_key: beam_fn_api_pb2.StateKey) -> Any:
        if not self._is_bag(state_key):
            return super().clear(state_key)
        key = state_key.SerializeToString()
        chain = self.chains.pop(key, None)
        if chain:
            self._drop_own(key, chain)
        return worker_handlers._Future.done()

    def _drop_own(self, key: bytes, chain: list[Segment]) -> None:
        # Only this attempt's segment can go now: older ones belong to the
        # committed version, which a retry of this batch reads again.
        if chain[-1] == self._segment:
            w = self.store.window(key, self._segment)
            if len(w):
                w.purge()

    def seal(self) -> Chains:
        """Flushes, syncs and closes the store; returns the chains to save with this batch's version.

        Called before the version file is written, so that file never names
        a segment that is not on disk.
        """
        self.store.close()
        self._sealed = True
        return self.chains

    def close(self) -> None:
        """Closes the store (if :meth:`seal` did not) and releases the partition."""
        try:
            if not self._sealed:
                self.store.close()  # what an unfinished attempt wrote is garbage for the next task
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)  # drops the flock
                self._lock_fd = None


def _lock(path: str, wait_seconds: float) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + wait_seconds
    delay = 0.01
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                os.close(fd)
                raise
        if time.monotonic() >= deadline:
            os.close(fd)
            raise SpillPartitionBusy(
                f"the spill store beside {path!r} stayed locked by another process for "
                f"{wait_seconds:.0f}s (a task of the same partition that is still running)")
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


def _referenced(chains: Chains) -> set[tuple[bytes, Segment]]:
    # Per state key: one attempt's segment window is shared by every bag it appended to.
    return {(key, seg) for key, chain in chains.items() for seg in chain}


def open_partition_state(side_inputs: Mapping[bytes, bytes], root: str, owner: str, partition: int,
                         batch: int, memory_bytes: int, chains: Chains,
                         other_manifests: Iterable[Chains] = (),
                         lock_wait_seconds: float = _LOCK_WAIT_SECONDS) -> PartitionSpillState:
    """Opens the spill state of ``(owner, partition)`` for a task of ``batch``.

    ``chains``: the manifest of the committed version the task reads;
    ``other_manifests``: those of the other version files on disk (a newer,
    uncommitted one that a restart may still commit). Every segment none of
    them names is deleted. Blocks while another process holds the partition.
    """
    directory = os.path.join(root, owner, str(partition))
    os.makedirs(directory, exist_ok=True)
    fd = _lock(os.path.join(directory, "spill.lock"), lock_wait_seconds)
    try:
        # The policy re-plans as memory grows by a block: blocks a fraction
        # of the budget keep a small budget bounded.
        store = SpillStore(os.path.join(directory, "spill"), memory_budget_bytes=memory_bytes,
                           block_bytes=max(64, min(_BLOCK_BYTES, memory_bytes // 16)))
        try:
            keep = _referenced(chains)
            for manifest in other_manifests:
                keep |= _referenced(manifest)
            for key, window in store.windows():
                if (key, window) not in keep:
                    store.window(key, window).purge()
        except BaseException:
            store.close()
            raise
    except BaseException:
        os.close(fd)
        raise
    return PartitionSpillState(side_inputs, store, fd, batch, chains)


def version_files(root: str, owner: str, partition: int) -> list[int]:
    """The batches of the version files of ``(owner, partition)`` on disk."""
    try:
        names = os.listdir(os.path.join(root, owner, str(partition)))
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(_VERSION_FILE.match, names) if m)
