"""Alias of :mod:`beam_ext.transforms.lateness.cleanup`, where PredictiveCleanup now lives.

This module remains for one release; import ``PredictiveCleanup`` from
``beam_ext.transforms.lateness`` (or ``beam_ext``) instead.
"""
from beam_ext.transforms.lateness.cleanup import PredictiveCleanup

__all__ = ["PredictiveCleanup"]
