"""Beam transforms that run on any runner and fastest on SparkRunner."""

# Exact per-event sliding-window aggregations (Railgun).
from beam_ext.transforms import agg
from beam_ext.transforms.sliding import SlidingAggregate, SlidingWindow

__all__ = ["SlidingAggregate", "SlidingWindow", "agg"]

# Staleness-driven late firings (Aion section 3.4).
from beam_ext.transforms.staleness import (
    StalenessPlanner,
    StalenessRefire,
    StalenessTrigger,
    max_staleness,
)

__all__ += ["StalenessPlanner", "StalenessRefire", "StalenessTrigger", "max_staleness"]
