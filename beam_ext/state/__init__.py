"""Window state that outgrows memory: spill store, event reservoir, cleanup."""

# Predictive cleanup of late window state (Aion section 3.4).
from beam_ext.state.cleanup import PredictiveCleanup

__all__ = ["PredictiveCleanup"]

# Lateness spill: window state in a bounded memory bucket plus LMDB (Aion).
from beam_ext.state.spill_store import SpillStore, SpillStoreError, SpillWindow

__all__ += ["SpillStore", "SpillStoreError", "SpillWindow"]
