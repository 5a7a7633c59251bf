"""Beam transforms that run on any runner and fastest on SparkRunner.

One subpackage per capability (docs/architecture.md): ``sliding`` (exact
per-event sliding windows, Railgun), ``lateness`` (window state that spills
so lateness can be unbounded, Aion), ``staleness`` (staleness-driven late
firings, Aion section 3.4), ``sampling`` (approximate windows that do not
wait for stragglers). Their public names are re-exported here.
"""
from beam_ext.transforms.lateness import (
    AfterLateDelay,
    CleanupPolicy,
    EveryNLateEvents,
    FixedLateness,
    LateWindowedGroupByKey,
)
from beam_ext.transforms.sampling import (
    ApproximateResult,
    ApproximateWindowAggregate,
    OnlineSampler,
    SamplerConfig,
)
from beam_ext.transforms.sliding import SlidingAggregate, SlidingWindow, agg
from beam_ext.transforms.staleness import (
    StalenessPlanner,
    StalenessRefire,
    StalenessTrigger,
    max_staleness,
)

__all__ = [
    "AfterLateDelay", "ApproximateResult", "ApproximateWindowAggregate", "CleanupPolicy",
    "EveryNLateEvents", "FixedLateness", "LateWindowedGroupByKey", "OnlineSampler",
    "SamplerConfig", "SlidingAggregate", "SlidingWindow", "StalenessPlanner", "StalenessRefire",
    "StalenessTrigger", "agg", "max_staleness",
]
