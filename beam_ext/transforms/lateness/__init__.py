"""Late data into past windows (Aion, sections 3-4).

``LateWindowedGroupByKey`` groups per window and re-fires past windows on
late data; ``EveryNLateEvents``, ``AfterLateDelay`` or any object with
``late_firing_offsets`` (such as ``StalenessTrigger``) decide when; a
``CleanupPolicy`` (``FixedLateness``, ``PredictiveCleanup``) decides how long
a past window stays open. See docs/lateness.md.

>>> PredictiveCleanup(initial_lateness=600.0).allowed_lateness()
600.0
"""
from beam_ext.transforms.lateness._gbk import LateWindowedGroupByKey
from beam_ext.transforms.lateness.cleanup import PredictiveCleanup
from beam_ext.transforms.lateness.triggers import (
    AfterLateDelay,
    CleanupPolicy,
    EveryNLateEvents,
    FixedLateness,
)

__all__ = ["AfterLateDelay", "CleanupPolicy", "EveryNLateEvents", "FixedLateness",
           "LateWindowedGroupByKey", "PredictiveCleanup"]
