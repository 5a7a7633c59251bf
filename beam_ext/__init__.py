"""beam_ext: Apache Beam Python pipelines on Apache Spark, with exact windowing.

The public API is re-exported here; everything else is private.
"""

__version__ = "0.1.0"

__all__: list[str] = []

# Exact per-event sliding-window aggregations (Railgun).
from beam_ext.transforms import SlidingAggregate, SlidingWindow, agg  # noqa: E402

__all__ += ["SlidingAggregate", "SlidingWindow", "agg"]

# Staleness-driven late firings and predictive cleanup (Aion section 3.4).
from beam_ext.transforms.lateness import PredictiveCleanup  # noqa: E402
from beam_ext.transforms.staleness import (  # noqa: E402
    StalenessPlanner,
    StalenessRefire,
    StalenessTrigger,
    max_staleness,
)

__all__ += ["PredictiveCleanup", "StalenessPlanner", "StalenessRefire", "StalenessTrigger",
            "max_staleness"]

# Approximate sampled windows that do not wait for stragglers.
from beam_ext.transforms.sampling import (  # noqa: E402
    ApproximateResult,
    ApproximateWindowAggregate,
    OnlineSampler,
    SamplerConfig,
)

__all__ += ["ApproximateResult", "ApproximateWindowAggregate", "OnlineSampler", "SamplerConfig"]

# Watermark service: trAcker tracking agent, local agents (beam_ext.watermark).
from beam_ext.watermark import (  # noqa: E402
    FirmBound,
    LocalAgent,
    PunctuationTracker,
    TrackerAuthError,
    TrackerService,
    new_token,
)

__all__ += ["FirmBound", "LocalAgent", "PunctuationTracker", "TrackerAuthError", "TrackerService", "new_token"]

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
