"""What every executor process does once per job before it unpickles user
code, as Beam's SDK worker does at start: the pickler the job was built
with, the saved main session, ``--beam_plugin`` imports; and the classes of
the driver's ``__main__``.

Beam's coders pickle a value of a type they have no encoding for by
reference (``PickleCoder``): an instance of a class defined in the user's
script or notebook names ``__main__.<class>``, which a Python worker, whose
``__main__`` is PySpark's, cannot find. DirectRunner runs in the script's
process and never meets this; Dataflow's workers fail. Each worker here gets
those classes on its ``__main__``, unpickled by the job's pickler, which
makes them the very classes the job's DoFns, pickled by value, refer to
(cloudpickle keeps one class per class pickled)."""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import logging
import os
import sys
import tempfile

_APPLIED: set[bytes] = set()
# Names this process's __main__ got from a job: a later job may replace them,
# never a name of the worker's own.
_MAIN_NAMES: set[str] = set()
_LOG = logging.getLogger("beam_ext.runner")


@dataclasses.dataclass(frozen=True)
class WorkerSetup:
    pickle_library: str = "default"
    main_session: bytes | None = None  # apache_beam.internal.pickler.dump_session's file
    plugins: tuple[str, ...] = ()
    main_classes: tuple[tuple[str, bytes], ...] = ()  # (name, the job pickler's dumps of the class)

    def key(self) -> bytes:
        digest = hashlib.sha256(self.pickle_library.encode())
        digest.update(self.main_session or b"")
        digest.update("\0".join(self.plugins).encode())
        for name, pickled in self.main_classes:
            digest.update(name.encode() + b"\0" + pickled)
        return digest.digest()

    def apply(self) -> None:
        """Idempotent per process; the pickler is set on every call because
        another job's tasks may share this Python worker."""
        from apache_beam.internal import pickler

        pickler.set_library(self.pickle_library)
        key = self.key()
        if key in _APPLIED:
            return
        for plugin in self.plugins:
            importlib.import_module(plugin)
        if self.main_session is not None:
            fd, path = tempfile.mkstemp(suffix=".main_session")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(self.main_session)
                pickler.load_session(path)
            finally:
                os.unlink(path)
        _install_main_classes(self.main_classes, pickler.loads)
        _APPLIED.add(key)


def _install_main_classes(classes: tuple[tuple[str, bytes], ...], loads) -> None:
    main = sys.modules["__main__"]
    for name, pickled in classes:
        if name not in _MAIN_NAMES and hasattr(main, name):
            _LOG.warning("%s of the driver's __main__ is not set on the worker's, which has its own %s: "
                         "its instances cannot cross a grouping; define it in a module", name, name)
            continue
        try:
            setattr(main, name, loads(pickled))
        except Exception as e:  # noqa: BLE001 - a job whose values never cross a grouping still runs
            _LOG.warning("%s of the driver's __main__ could not be loaded on a worker: %s", name, e)
            continue
        _MAIN_NAMES.add(name)
