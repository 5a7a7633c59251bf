"""Staleness-driven late firings (Aion section 3.4).

``max_staleness`` evaluates a schedule of late re-executions on a window's
late arrivals; ``StalenessPlanner`` places them from a history of arrivals;
``StalenessTrigger`` is what a windowed aggregation carries, and
``StalenessRefire`` applies it to a keyed, windowed PCollection on any runner.

>>> import numpy as np
>>> history = np.random.default_rng(0).uniform(0, 10, 1000)
>>> len(StalenessPlanner(history, allowed_lateness=10.0).plan_for_budget(3))
3
"""
from beam_ext.transforms.staleness._planner import StalenessPlanner, max_staleness
from beam_ext.transforms.staleness._refire import StalenessRefire
from beam_ext.transforms.staleness._trigger import StalenessTrigger

__all__ = ["StalenessPlanner", "StalenessRefire", "StalenessTrigger", "max_staleness"]
