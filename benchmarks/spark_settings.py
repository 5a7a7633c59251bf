"""The Spark settings benchmark sessions start with: those SparkRunner gives a session it starts.

``beam_ext`` comes from ``PYTHONPATH``; a checkout from before
``recommended_spark_conf`` existed gets none, as its users did.
"""
from __future__ import annotations


def session_conf() -> dict[str, str]:
    """``beam_ext.runner.recommended_spark_conf()``, or nothing in older checkouts."""
    import beam_ext.runner

    return getattr(beam_ext.runner, "recommended_spark_conf", dict)()


def local_session(app_name: str, extra: dict[str, str] | None = None):
    """A ``local[2]`` session with :func:`session_conf` (and ``extra``), no
    progress bar and errors-only logging: the session the runner benchmarks
    share between SparkRunner and their PySpark anchors.

    Example::

        spark = local_session("runner-benchmark")
    """
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName(app_name).config(map=session_conf())
             .config(map=extra or {}).config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark
