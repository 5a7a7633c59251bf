"""beam_ext: Apache Beam Python pipelines on Apache Spark, with exact windowing.

Every public name is importable from here and loaded on first use (PEP 562),
so ``import beam_ext`` starts neither Spark, LMDB, SciPy nor gRPC::

    import apache_beam as beam
    import beam_ext

    with beam.Pipeline(runner=beam_ext.SparkRunner()) as p:
        (p | beam.Create([{"card": "a", "ts": 1.0, "amount": 5.0},
                          {"card": "a", "ts": 2.0, "amount": 7.0}])
           | beam_ext.SlidingAggregate(
                 key="card", timestamp="ts",
                 windows={"5m": beam_ext.SlidingWindow(300)},
                 aggregations={"total": beam_ext.agg.sum("amount")})
           | beam.Map(print))

Everything not listed in ``__all__`` is private.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Public name -> the module that defines it. One list, checked by
# tests/test_package.py; the capability docs (docs/*.md) show the same names.
_PUBLIC: dict[str, str] = {
    # SparkRunner (docs/runner.md)
    "SparkRunner": "beam_ext.runner",
    "SparkRunnerOptions": "beam_ext.runner",
    "SparkPipelineResult": "beam_ext.runner",
    "PipelineError": "beam_ext.runner",
    "SparkUnavailableError": "beam_ext.runner",
    "CheckpointMismatch": "beam_ext.runner",
    "CheckpointUnwritable": "beam_ext.runner",
    "recommended_spark_conf": "beam_ext.runner",
    # Moving pipelines to SparkRunner (docs/migrating.md)
    "DataflowOptionError": "beam_ext.runner",
    "check_script": "beam_ext.migrate",
    "SparkJobServicer": "beam_ext.job_server",
    # Exact per-event sliding windows, Railgun (docs/sliding.md)
    "SlidingAggregate": "beam_ext.transforms.sliding",
    "SlidingWindow": "beam_ext.transforms.sliding",
    "agg": "beam_ext.transforms.sliding",
    # Lateness-spill window state, Aion (docs/lateness.md)
    "LateWindowedGroupByKey": "beam_ext.transforms.lateness",
    "AfterLateDelay": "beam_ext.transforms.lateness",
    "CleanupPolicy": "beam_ext.transforms.lateness",
    "EveryNLateEvents": "beam_ext.transforms.lateness",
    "FixedLateness": "beam_ext.transforms.lateness",
    "PredictiveCleanup": "beam_ext.transforms.lateness",
    "SpillStore": "beam_ext.state",
    "SpillStoreError": "beam_ext.state",
    "SpillWindow": "beam_ext.state",
    # Staleness-driven late firings, Aion section 3.4 (docs/staleness.md)
    "StalenessPlanner": "beam_ext.transforms.staleness",
    "StalenessRefire": "beam_ext.transforms.staleness",
    "StalenessTrigger": "beam_ext.transforms.staleness",
    "max_staleness": "beam_ext.transforms.staleness",
    # Approximate sampled windows (docs/sampling.md)
    "ApproximateResult": "beam_ext.transforms.sampling",
    "ApproximateWindowAggregate": "beam_ext.transforms.sampling",
    "OnlineSampler": "beam_ext.transforms.sampling",
    "SamplerConfig": "beam_ext.transforms.sampling",
    # Watermarks from the tracking service (docs/watermark.md)
    "FirmBound": "beam_ext.watermark",
    "LocalAgent": "beam_ext.watermark",
    "TrackerAuthError": "beam_ext.watermark",
    "TrackerLimitError": "beam_ext.watermark",
    "TrackerService": "beam_ext.watermark",
    "new_token": "beam_ext.watermark",
    # Errors
    "BeamExtError": "beam_ext.errors",
}

# Names once re-exported here that belong to their subpackage. They resolve
# for one more release (0.2) and are not in __all__.
_ALIASES: dict[str, str] = {
    "PunctuationTracker": "beam_ext.watermark",  # a baseline, not API
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name) or _ALIASES.get(name)
    if module is None:
        raise AttributeError(f"module 'beam_ext' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
