"""Beam transforms that run on any runner and fastest on SparkRunner."""

# Exact per-event sliding-window aggregations (Railgun).
from beam_ext.transforms.sliding import SlidingAggregate, SlidingWindow, agg

__all__ = ["SlidingAggregate", "SlidingWindow", "agg"]

# Staleness-driven late firings (Aion section 3.4).
from beam_ext.transforms.staleness import (
    StalenessPlanner,
    StalenessRefire,
    StalenessTrigger,
    max_staleness,
)

__all__ += ["StalenessPlanner", "StalenessRefire", "StalenessTrigger", "max_staleness"]

# Approximate sampled windows that do not wait for stragglers (issue 4).
from beam_ext.transforms.sampling import (
    ApproximateResult,
    ApproximateWindowAggregate,
    OnlineSampler,
    SamplerConfig,
)

__all__ += ["ApproximateResult", "ApproximateWindowAggregate", "OnlineSampler", "SamplerConfig"]

# Lateness spill: GroupByKey whose past windows stay open for late data (Aion).
from beam_ext.transforms.lateness import (
    AfterLateDelay,
    CleanupPolicy,
    EveryNLateEvents,
    FixedLateness,
    LateWindowedGroupByKey,
)

__all__ += ["AfterLateDelay", "CleanupPolicy", "EveryNLateEvents", "FixedLateness",
           "LateWindowedGroupByKey"]
