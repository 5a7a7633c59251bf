"""beam_ext: Apache Beam Python pipelines on Apache Spark, with exact windowing.

The public API is re-exported here; everything else is private.
"""

__version__ = "0.1.0"

__all__: list[str] = []

# Lateness spill: past windows kept open for late data, state spilled to LMDB (Aion).
from beam_ext.state import SpillStore, SpillStoreError, SpillWindow  # noqa: E402
from beam_ext.transforms import (  # noqa: E402
    AfterLateDelay,
    CleanupPolicy,
    EveryNLateEvents,
    FixedLateness,
    LateWindowedGroupByKey,
)

__all__ += ["SpillStore", "SpillStoreError", "SpillWindow", "AfterLateDelay", "CleanupPolicy",
            "EveryNLateEvents", "FixedLateness", "LateWindowedGroupByKey"]
