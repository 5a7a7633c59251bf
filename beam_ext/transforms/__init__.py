"""Beam transforms that run on any runner and fastest on SparkRunner."""

# Staleness-driven late firings (Aion section 3.4).
from beam_ext.transforms.staleness import (
    StalenessPlanner,
    StalenessRefire,
    StalenessTrigger,
    max_staleness,
)

__all__ = ["StalenessPlanner", "StalenessRefire", "StalenessTrigger", "max_staleness"]
