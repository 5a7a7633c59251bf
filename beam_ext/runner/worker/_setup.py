"""What every executor process does once per job before it unpickles user
code, as Beam's SDK worker does at start: the pickler the job was built
with, the saved main session, ``--beam_plugin`` imports."""
from __future__ import annotations

import dataclasses
import hashlib
import importlib
import os
import tempfile

_APPLIED: set[bytes] = set()


@dataclasses.dataclass(frozen=True)
class WorkerSetup:
    pickle_library: str = "default"
    main_session: bytes | None = None  # apache_beam.internal.pickler.dump_session's file
    plugins: tuple[str, ...] = ()

    def key(self) -> bytes:
        digest = hashlib.sha256(self.pickle_library.encode())
        digest.update(self.main_session or b"")
        digest.update("\0".join(self.plugins).encode())
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
        _APPLIED.add(key)
