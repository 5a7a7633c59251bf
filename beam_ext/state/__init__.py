"""Window state that outgrows memory: spill store, event reservoir."""
from typing import Any

# Lateness spill: window state in a bounded memory bucket plus LMDB (Aion).
from beam_ext.state.spill_bag_state import SpillBagStateServicer
from beam_ext.state.spill_store import SpillStore, SpillStoreError, SpillWindow

__all__ = ["PredictiveCleanup", "SpillBagStateServicer", "SpillStore", "SpillStoreError",
           "SpillWindow"]


def __getattr__(name: str) -> Any:
    # PredictiveCleanup moved to beam_ext.transforms.lateness; this alias
    # remains for one release. Resolved on first use so that importing the
    # state package does not import the transforms.
    if name == "PredictiveCleanup":
        from beam_ext.transforms.lateness.cleanup import PredictiveCleanup

        return PredictiveCleanup
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
