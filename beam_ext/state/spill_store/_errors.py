"""The spill store's exception, raised by every part of it."""
from __future__ import annotations

from beam_ext.errors import BeamExtError


class SpillStoreError(BeamExtError, RuntimeError):
    """The spill store cannot continue (full disk, corrupt environment, closed)."""
