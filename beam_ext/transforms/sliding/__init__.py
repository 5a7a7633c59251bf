"""Exact per-event sliding-window aggregates (Railgun): docs/sliding.md.

>>> from beam_ext.transforms.sliding import SlidingWindow, agg
>>> SlidingWindow(300).size, agg.sum("amount").kind
(300, 'sum')
"""
from beam_ext.transforms.sliding import agg
from beam_ext.transforms.sliding._plan import NATIVE_URN, SlidingWindow  # noqa: F401 - the URN it declares
from beam_ext.transforms.sliding._transform import SlidingAggregate

__all__ = ["SlidingAggregate", "SlidingWindow", "agg"]
