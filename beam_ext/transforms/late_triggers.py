"""Alias of :mod:`beam_ext.transforms.lateness.triggers`, where the late triggers now live.

This module remains for one release; import these names from
``beam_ext.transforms.lateness`` (or ``beam_ext.transforms``) instead.
"""
from beam_ext.transforms.lateness.triggers import (
    AfterLateDelay,
    CleanupPolicy,
    EveryNLateEvents,
    FixedLateness,
)

__all__ = ["AfterLateDelay", "CleanupPolicy", "EveryNLateEvents", "FixedLateness"]
