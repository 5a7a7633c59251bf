"""State servicers for the task worker: Fn API state in memory or on a spill store.

``--spark_state_backend`` picks one per stateful stage: ``memory`` (Beam's
in-memory servicer) or ``spill`` (bag state in an LMDB
:class:`~beam_ext.state.SpillStore` bounded by ``--spark_state_memory``).
Either serves side inputs from the stage's broadcast first.
"""
from __future__ import annotations

from typing import Mapping

from beam_ext.runner.state._memory import MemoryState

__all__ = ["MemoryState", "SpillBagStateServicer", "task_state"]


def __getattr__(name: str):
    # The spill servicer loads LMDB: only stages that ask for it pay for that.
    if name == "SpillBagStateServicer":
        from beam_ext.runner.state._spill import SpillBagStateServicer

        return SpillBagStateServicer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def task_state(backend: str, side_inputs: Mapping[bytes, bytes], memory_bytes: int):
    """The state servicer of one task: ``backend`` is ``"memory"`` or ``"spill"``."""
    if backend == "memory":
        return MemoryState(side_inputs)
    if backend == "spill":
        from beam_ext.runner.state._spill import spill_task_state

        return spill_task_state(side_inputs, memory_bytes)
    raise ValueError(f"unknown state backend {backend!r}: expected 'memory' or 'spill'")
