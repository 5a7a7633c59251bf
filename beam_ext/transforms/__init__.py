"""Beam transforms that run on any runner and fastest on SparkRunner."""

# Exact per-event sliding-window aggregations (Railgun).
from beam_ext.transforms import agg
from beam_ext.transforms.sliding import SlidingAggregate, SlidingWindow

__all__ = ["SlidingAggregate", "SlidingWindow", "agg"]
