"""The base class of every error beam_ext raises on purpose.

Catch :class:`BeamExtError` to handle any of them; each subclass also derives
from the built-in exception it refines (``ValueError``, ``RuntimeError``, ...),
so code written against the built-in keeps working.

>>> from beam_ext.errors import BeamExtError
>>> from beam_ext.state import SpillStoreError
>>> issubclass(SpillStoreError, BeamExtError)
True
"""
from __future__ import annotations

__all__ = ["BeamExtError"]


class BeamExtError(Exception):
    """An error raised by beam_ext, naming its culprit (a step, option or path)."""
