"""Window state that outgrows memory: spill store, event reservoir."""
from typing import Any

# Lateness spill: window state in a bounded memory bucket plus LMDB (Aion).
from beam_ext.state.spill_store import SpillStore, SpillStoreError, SpillWindow

__all__ = ["SpillStore", "SpillStoreError", "SpillWindow"]

# Names that moved out of this package in 0.1; they resolve here for one more
# release, on first use, so that importing the state package imports neither
# the transforms nor the runner.
_MOVED = {
    "PredictiveCleanup": "beam_ext.transforms.lateness.cleanup",
    "SpillBagStateServicer": "beam_ext.runner.state",
}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        import importlib

        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
