"""Shared fixtures: one local[2] SparkSession for the whole test session.

``make test`` runs two pytest workers (pytest-xdist, whole files to each):
each worker is a test session of its own, with one SparkSession.
"""
from __future__ import annotations

import os
import sys

import pytest

# Executors must run this interpreter (the venv's), not the system python3,
# or they cannot import apache_beam and beam_ext.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# DoFns defined in test modules are pickled by reference: executors must be
# able to import the test modules too, as users' executors import their code.
_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
_BENCHMARKS_DIR = os.path.join(os.path.dirname(_TESTS_DIR), "benchmarks")
sys.path.append(_BENCHMARKS_DIR)  # benchmark smoke tests import the benchmarks
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in [_TESTS_DIR, _BENCHMARKS_DIR, os.environ.get("PYTHONPATH", "")] if p)
# The tests' JVMs (this session's, and those of the cluster, killed-driver and
# job-server tests, which inherit this) run thousands of jobs of a few tasks.
# The optimizing compiler spent more of the two cores than it saved on such
# jobs: with the quick compiler only, the JVM of tests/test_runner_batch.py
# used 19.7 s of CPU instead of 44.8 s (benchmarks/pytest_cpu_split.py), and
# the two-worker suite took 733 s instead of 849 s. A local session the runner
# starts does the same (runner/session.py). Semantics do not depend on it.
os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")


def _make_session():
    from pyspark.sql import SparkSession

    from beam_ext.runner import recommended_spark_conf

    return (
        SparkSession.builder.config(map=recommended_spark_conf()).master("local[2]")
        .appName("beam_ext-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )


@pytest.fixture(scope="session")
def spark():
    """The test session's SparkSession (local[2]); SparkRunner attaches to it."""
    session = _make_session()
    session.sparkContext.setLogLevel("WARN")
    yield session
    session.stop()
