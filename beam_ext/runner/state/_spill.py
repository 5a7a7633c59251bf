"""Fn API bag user state on a SpillStore: the hook for a runner-wide spill backend.

A runner that executes stages through Beam's bundle processor hands it a
``StateServicer``. :class:`SpillBagStateServicer` is one whose *bag* user
state (what ``BagStateSpec`` and Beam's own stateful transforms use) lives in
a :class:`~beam_ext.state.SpillStore`, so a stage's state is bounded by the
store's memory budget; every other state type is served as by Beam's
in-memory servicer. Each state key (transform, state id, user key, window,
all as the Fn API encodes them) is one store window: key = the serialised
state key, window = (0, 0).

Example::

    servicer = SpillBagStateServicer(SpillStore("/tmp/stage-3", 256 << 20))
    # pass to sdk_worker.GlobalCachingStateHandler(cache, servicer)
"""
from __future__ import annotations

import shutil
import tempfile
from typing import Any, Mapping

from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.portability.fn_api_runner import worker_handlers

from beam_ext.runner.state._memory import SideInputsFirst
from beam_ext.state import SpillStore

__all__ = ["SpillBagStateServicer", "spill_task_state"]

_NO_WINDOW = (0.0, 0.0)


class SpillBagStateServicer(worker_handlers.StateServicer):
    """A Fn API state servicer keeping bag user state in a :class:`SpillStore`."""

    def __init__(self, store: SpillStore) -> None:
        super().__init__()
        self.store = store

    @staticmethod
    def _is_bag(state_key: beam_fn_api_pb2.StateKey) -> bool:
        return state_key.WhichOneof("type") == "bag_user_state"

    def get_raw(self, state_key: beam_fn_api_pb2.StateKey,
                continuation_token: bytes | None = None) -> tuple[bytes, bytes | None]:
        if not self._is_bag(state_key):
            return super().get_raw(state_key, continuation_token)
        w = self.store.window(state_key.SerializeToString(), _NO_WINDOW)
        # Each appended chunk is already an encoded run of elements.
        return b"".join(w.iter()), None

    def append_raw(self, state_key: beam_fn_api_pb2.StateKey, data: bytes) -> Any:
        if not self._is_bag(state_key):
            return super().append_raw(state_key, data)
        self.store.window(state_key.SerializeToString(), _NO_WINDOW).add([bytes(data)])
        return worker_handlers._Future.done()

    def clear(self, state_key: beam_fn_api_pb2.StateKey) -> Any:
        if not self._is_bag(state_key):
            return super().clear(state_key)
        w = self.store.window(state_key.SerializeToString(), _NO_WINDOW)
        if len(w):
            w.purge()
        return worker_handlers._Future.done()


class _SpillTaskState(SideInputsFirst, SpillBagStateServicer):
    """A task's spill servicer: its store lives in a temporary directory removed on close."""

    def __init__(self, side_inputs: Mapping[bytes, bytes], memory_bytes: int) -> None:
        self._dir = tempfile.mkdtemp(prefix="beam_ext_state_")
        super().__init__(SpillStore(self._dir, memory_budget_bytes=memory_bytes))
        self._side_inputs = side_inputs

    def close(self) -> None:
        self.store.close()
        shutil.rmtree(self._dir, ignore_errors=True)


def spill_task_state(side_inputs: Mapping[bytes, bytes], memory_bytes: int) -> _SpillTaskState:
    """The spill-backed state servicer of one task."""
    return _SpillTaskState(side_inputs, memory_bytes)
