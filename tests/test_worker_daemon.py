"""The Python worker daemon that imports the runner's code before it forks workers."""
from __future__ import annotations

import os
import sys

import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to

from beam_ext.runner import SparkRunner, recommended_spark_conf
from beam_ext.runner.worker import _daemon


def _worker_facts(_):
    """In a Spark task: the daemon the worker was forked from, and what it inherited."""
    import gc
    import sys

    with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
        parent = f.read().split(b"\0")
    yield {"parent": [a.decode() for a in parent if a],
           "runner_imported": "beam_ext.runner.worker._task" in sys.modules,
           "gc_threshold": gc.get_threshold()[0]}


def test_workers_fork_from_the_runners_daemon(spark):
    assert recommended_spark_conf()["spark.python.daemon.module"] == "beam_ext.runner.worker._daemon"
    # A plain PySpark job: nothing it unpickles imports beam_ext, so the
    # runner's code is there because the worker was forked with it.
    facts = spark.sparkContext.parallelize(range(4), 4).mapPartitions(_worker_facts).collect()
    assert len(facts) == 4
    for fact in facts:
        assert "beam_ext.runner.worker._daemon" in fact["parent"], fact["parent"]
        assert fact["runner_imported"]
        assert fact["gc_threshold"] >= 100_000  # tuned as a worker's before the fork


def test_pipeline_runs_on_forked_workers(spark):
    with beam.Pipeline(runner=SparkRunner()) as p:
        counts = (p | beam.Create(["a b", "b c", "b"]) | beam.FlatMap(str.split)
                  | beam.combiners.Count.PerElement())
        assert_that(counts, equal_to([("a", 1), ("b", 3), ("c", 1)]))


def test_preload_failure_leaves_pysparks_daemon(capfd):
    assert _daemon.preload(("json", "beam_ext_no_such_module")) is False
    err = capfd.readouterr().err
    assert "could not import the runner's code" in err
    assert "beam_ext_no_such_module" in err


def test_preload_keeps_standard_output_for_the_jvm(tmp_path, monkeypatch, capfd):
    # The daemon writes its port to standard output: an import that prints
    # must not get in front of it.
    (tmp_path / "beam_ext_noisy_module.py").write_text("print('noise from an import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _daemon.preload(("beam_ext_noisy_module",)) is True
    print("after")
    sys.stdout.flush()
    out, err = capfd.readouterr()
    assert out == "after\n"
    assert "noise from an import" in err
