"""Spark starts while a pipeline is built (``session.start_context_early``)."""
import json
import os
import subprocess
import sys

from beam_ext.runner import session
from beam_ext.runner.options import SparkRunnerOptions


def test_spark_starts_at_the_first_transform_and_a_changed_master_restarts_it(tmp_path):
    job = os.path.join(os.path.dirname(__file__), "early_start_job.py")
    done = subprocess.run([sys.executable, job, str(tmp_path)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["starting_after_first_apply"] is True
    assert report["start_threads"] == ["beam_ext-spark-start"]
    # Other pipelines built while PySpark's context is registered but not yet
    # connected to its JVM see no running context (they raised AttributeError).
    assert report["built_while_half_started"] is True
    assert report["first"] == {"master": "local[1]", "output": [2, 4, 6],
                               "starting_after_run": False, "ctrl_c_cancels_jobs": True}
    # The master changed after the build: the session started for the old
    # one is stopped, and the pipeline runs on the new one.
    assert report["changed"] == {"master": "local[2]", "output": [2, 4, 6],
                                 "early_session_stopped": True}


def test_nothing_starts_beside_a_running_context(spark):
    session.start_context_early(SparkRunnerOptions(), "x")
    assert not session.starting()
    assert session.get_or_create_context(SparkRunnerOptions(), "x") is spark.sparkContext
