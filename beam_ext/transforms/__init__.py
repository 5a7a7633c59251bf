"""Beam transforms that run on any runner and fastest on SparkRunner."""
# Lateness spill: GroupByKey whose past windows stay open for late data (Aion).
from beam_ext.transforms.late_triggers import (
    AfterLateDelay,
    CleanupPolicy,
    EveryNLateEvents,
    FixedLateness,
)
from beam_ext.transforms.late_windowed_gbk import LateWindowedGroupByKey

__all__ = ["AfterLateDelay", "CleanupPolicy", "EveryNLateEvents", "FixedLateness",
           "LateWindowedGroupByKey"]
