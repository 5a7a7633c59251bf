"""The p-bucket: the LMDB environment directory that holds sealed blocks.

Knows files, transactions and keys, nothing of windows or memory. Every
failure is a :class:`SpillStoreError` naming the path.

Durability: a write of blocks is one LMDB transaction (a flush of the whole
store included), so a crash leaves every window with a prefix of its
committed blocks and never half a block. Environments open with ``sync=False``: a killed process loses nothing
committed, an operating-system crash may lose the latest blocks.

Damage: opening checks data.mdb against its meta pages first
(``beam_ext.state._lmdb_file``), since LMDB maps the file and a truncated one
kills the process with SIGBUS. A marker file, written before the first block
is committed, tells a store whose data.mdb went missing or empty from a new
one.
"""
from __future__ import annotations

import logging
import os
import struct
import threading
from collections.abc import Callable, Iterator

import lmdb

from beam_ext.state import _lmdb_file
from beam_ext.state.spill_store._errors import SpillStoreError
from beam_ext.state.spill_store._keys import _parse

_LOG = logging.getLogger(__name__)

_INITIAL_MAP_SIZE = 64 << 20
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


class _PBucket:
    """One LMDB environment; transactions are serialised by one lock.

    Opening creates the directory and checks its data file (see the module
    docstring); ``on_lost_data`` is one of ``_LOST_DATA_POLICIES``, checked
    by the caller. :meth:`read_index` then lists what the directory holds.
    """

    def __init__(self, path: str, on_lost_data: str) -> None:
        self._path = path
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:  # a file on the way, no permission, read-only file system
            raise SpillStoreError(f"cannot open spill store at {path!r}: cannot create "
                                  f"it as a directory ({e.strerror or e})") from e
        self._committed = _check_data_file(path, on_lost_data)
        try:
            self._env = lmdb.open(path, map_size=_INITIAL_MAP_SIZE, subdir=True,
                                  sync=False, metasync=False, max_dbs=0, lock=True)
        except lmdb.Error as e:
            raise SpillStoreError(f"cannot open spill store at {path!r}: {e}") from e
        self._lock = threading.Lock()

    def read_index(self) -> Iterator[tuple[bytes, tuple[float, float], int]]:
        """``(key, window, seq)`` of every stored block, windows contiguous, in order.

        Read once, at open (errors say the store cannot open). A directory
        holding blocks but no marker, written before markers existed, gets
        its marker.
        """
        found = False
        try:
            with self._env.begin() as txn:
                for db_key in txn.cursor().iternext(keys=True, values=False):
                    try:
                        parsed = _parse(db_key)
                    except struct.error as e:
                        raise SpillStoreError(
                            f"spill store at {self._path!r} holds a malformed key {db_key!r}"
                        ) from e
                    found = True
                    yield parsed
        except lmdb.Error as e:
            raise SpillStoreError(f"cannot open spill store at {self._path!r}: {e}") from e
        if found and not self._committed:
            self._mark_committed()

    def get_many(self, keys: list[bytes]) -> list[bytes]:
        """The values of ``keys``, in one read call; every key must exist."""
        with self._lock:
            try:
                with self._env.begin(buffers=False) as txn:
                    # One C call (one GIL release) for the whole batch.
                    found = dict(txn.cursor().getmulti(keys))
                out = [found.get(k) for k in keys]
            except lmdb.Error as e:
                raise SpillStoreError(f"spill store at {self._path!r}: read failed: {e}") from e
        for k, v in zip(keys, out):
            if v is None:
                key, window, seq = _parse(k)
                raise SpillStoreError(
                    f"spill store at {self._path!r} lost block {seq} of window {window} of key "
                    f"{key!r} (corrupt environment?)")
        return out  # type: ignore[return-value]

    def put_many(self, items: list[tuple[bytes, bytes]], *,
                 skip: Callable[[], list[bool]]) -> list[bool]:
        """Commit ``items`` in one transaction, but those ``skip()`` flags; returns which were put.

        ``skip`` runs under the transaction lock, so no other transaction
        (a purge's delete) can run between it and the puts.
        """
        with self._lock:
            put = [not s for s in skip()]
            todo = [item for item, p in zip(items, put) if p]
            if not todo:
                return put
            if not self._committed:
                self._mark_committed()
            # One C call for every item; one commit (one page flush) for the batch.
            self._write(lambda txn: txn.cursor().putmulti(todo))
        return put

    def delete_prefix(self, prefix: bytes) -> None:
        """Delete every key that starts with ``prefix``, in one transaction."""
        with self._lock:
            self._write(lambda txn: self._delete_prefix(txn, prefix))

    def close(self) -> None:
        """Sync to disk and close the environment."""
        try:
            self._env.sync(True)
        finally:
            self._env.close()

    @staticmethod
    def _delete_prefix(txn: lmdb.Transaction, prefix: bytes) -> None:
        cur = txn.cursor()
        if cur.set_range(prefix):
            while cur.key().startswith(prefix):
                if not cur.delete():
                    break

    def _write(self, body: Callable[[lmdb.Transaction], object]) -> None:
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
                raise SpillStoreError(
                    f"spill store at {self._path!r}: disk full or failing: {e}") from e
            except OSError as e:
                raise SpillStoreError(f"spill store at {self._path!r}: write failed: {e}") from e
            except lmdb.Error as e:
                raise SpillStoreError(f"spill store at {self._path!r}: write failed: {e}") from e

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
