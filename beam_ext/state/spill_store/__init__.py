"""Window state split between a bounded memory bucket and an LMDB bucket (Aion 3-4).

Each (key, window) keeps its values in blocks, in memory (m-bucket), in LMDB
(p-bucket) or in both. The parts, each in its own module:

- ``_store``: :class:`SpillStore` and :class:`SpillWindow`, the API; reads.
- ``_policy``: the memory policy (standard, global, pre-staging admission).
- ``_io``: the I/O thread and its priority queue of LMDB reads and writes.
- ``_pbucket``: the LMDB directory (opening and damage checks, transactions).
- ``_keys``: the LMDB key layout; ``_blocks``: the in-memory structures.

``_SEQ`` and ``_prefix`` of the key layout are importable from here for
tests that write blocks into an LMDB directory themselves.
"""
from beam_ext.state.spill_store._errors import SpillStoreError
from beam_ext.state.spill_store._keys import _SEQ, _prefix  # noqa: F401
from beam_ext.state.spill_store._store import SpillStore, SpillWindow

__all__ = ["SpillStore", "SpillStoreError", "SpillWindow"]
