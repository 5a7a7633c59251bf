"""State kept between micro-batches: one file per (owner, partition, batch) under the checkpoint.

The layout follows Spark's own HDFS-backed state store: each micro-batch
writes a new version of every partition it touched, next to the previous
one, and the driver's commit log says which version is current. A task that
fails, or a batch that is replayed after a crash, reads the committed
version and writes its own again (rename makes the write atomic), so a
replay cannot see half of a batch. The driver prunes versions no commit
refers to.

A Python worker keeps the versions it wrote in memory: Spark reuses
workers, so the next batch of the same partition usually reads no file.
The cached object is handed out once (popped), so a task that fails midway
cannot leave a half-updated copy behind for its retry. A cached copy is
used only while the file is still the one this worker wrote (same inode,
size and modification time): when a batch runs again after a failure,
another worker may write the same version anew, from other input, and the
file is what was committed.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import re
from typing import Any

from beam_ext.runner._errors import checkpoint_unwritable

_CACHE: dict[tuple[str, str, int, int], tuple[bytes, tuple[int, int, int]]] = {}  # -> (blob, file identity)
_CACHE_LIMIT = 64
_VERSION_FILE = re.compile(r"^(\d+)\.bin$")


def _path(root: str, owner: str, partition: int, version: int) -> str:
    return os.path.join(root, owner, str(partition), f"{version}.bin")


def read(root: str, owner: str, partition: int, version: int) -> Any | None:
    """The state ``owner`` saved for ``partition`` in batch ``version``, or None."""
    path = _path(root, owner, partition, version)
    cached = _CACHE.pop((root, owner, partition, version), None)
    if cached is not None and _identity(path) == cached[1]:
        return pickle.loads(cached[0])
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except FileNotFoundError:
        return None
    return pickle.loads(blob)


def _identity(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def write(root: str, owner: str, partition: int, version: int, state: Any) -> None:
    """Saves ``state`` as batch ``version`` of ``(owner, partition)``, atomically."""
    blob = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    path = _path(root, owner, partition, version)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.remove(tmp)  # a full disk keeps no half-written file
        raise checkpoint_unwritable(os.path.dirname(root), f"state of {owner}, partition {partition}, "
                                    f"batch {version}", exc) from None  # the task's traceback: one clear cause
    identity = _identity(path)
    if len(_CACHE) >= _CACHE_LIMIT:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[(root, owner, partition, version)] = (blob, identity)


def prune(root: str, owner: str, keep: set[int]) -> None:
    """Deletes the versions of ``owner`` (every partition) not in ``keep``."""
    base = os.path.join(root, owner)
    if not os.path.isdir(base):
        return
    for partition in os.listdir(base):
        directory = os.path.join(base, partition)
        for name in os.listdir(directory):
            match = _VERSION_FILE.match(name)
            if (match and int(match.group(1)) not in keep) or name.endswith(".tmp"):
                try:
                    os.remove(os.path.join(directory, name))
                except FileNotFoundError:
                    pass
