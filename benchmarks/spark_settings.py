"""The Spark settings benchmark sessions start with: those SparkRunner gives a session it starts.

``beam_ext`` comes from ``PYTHONPATH``; a checkout from before
``recommended_spark_conf`` existed gets none, as its users did.
"""
from __future__ import annotations


def session_conf() -> dict[str, str]:
    """``beam_ext.runner.recommended_spark_conf()``, or nothing in older checkouts."""
    import beam_ext.runner

    return getattr(beam_ext.runner, "recommended_spark_conf", dict)()
