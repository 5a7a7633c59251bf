"""The spill store's exception, raised by every part of it."""
from __future__ import annotations


class SpillStoreError(RuntimeError):
    """The spill store cannot continue (full disk, corrupt environment, closed)."""
