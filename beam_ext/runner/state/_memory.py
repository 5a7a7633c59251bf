"""Fn API state held in the task's memory, with side inputs served from the broadcast."""
from __future__ import annotations

from typing import Mapping

from apache_beam.runners.portability.fn_api_runner import worker_handlers

_SIDE_INPUT_TYPES = frozenset(
    ["iterable_side_input", "multimap_side_input", "multimap_keys_side_input",
     "multimap_keys_values_side_input"])


class SideInputsFirst:
    """Serves side inputs from the broadcast dictionary, user state from the base."""

    _side_inputs: Mapping[bytes, bytes]

    def get_raw(self, state_key, continuation_token=None):
        if state_key.WhichOneof("type") in _SIDE_INPUT_TYPES:
            return self._side_inputs.get(state_key.SerializeToString(), b""), None
        return super().get_raw(state_key, continuation_token)


class MemoryState(SideInputsFirst, worker_handlers.StateServicer):
    """Beam's in-memory state servicer: user state lives as long as the task."""

    def __init__(self, side_inputs: Mapping[bytes, bytes]) -> None:
        super().__init__()
        self._side_inputs = side_inputs

    def close(self) -> None:
        pass
