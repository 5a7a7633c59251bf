"""Spark starting while a pipeline is built, run by test_early_start.py.

A separate process: the runner must start Spark itself, which the test
session's context would otherwise shadow. Prints one JSON line: for a
pipeline whose options stay as built, whether Spark was starting right after
its first transform was applied, on which thread, whether other pipelines
were built while PySpark's context was registered but not yet connected to
its JVM, the master and output it
ran with and whether Ctrl-C now cancels Spark's jobs; for a pipeline whose
master changed after it was built, the master it ran on, its output and
whether the session started for the old master was stopped.
"""
import glob
import json
import os
import signal
import sys
import threading

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from beam_ext.runner import SparkRunner, session
from beam_ext.runner.options import SparkRunnerOptions

_ARGS = ["--spark_conf=spark.ui.enabled=false", "--spark_conf=spark.ui.showConsoleProgress=false"]


def _written(prefix: str) -> list[int]:
    return sorted(int(line) for path in glob.glob(prefix + "*") for line in open(path))


def _build_while_starting() -> bool:
    """Builds pipelines until the early start ends; whether one was built
    while PySpark had registered the context but not yet connected it to its
    JVM (``SparkContext._active_spark_context`` set, ``_jsc`` unset)."""
    from pyspark import SparkContext

    seen = False
    while session._early_start._thread.is_alive():
        half_started = SparkContext._active_spark_context is not None
        q = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(["--spark_master=local[1]", *_ARGS]))
        _ = q | beam.Create([1]) | beam.Map(str)
        seen = seen or (half_started and session._early_start is not None
                        and getattr(SparkContext._active_spark_context, "_jsc", None) is None)
    return seen


def main(work_dir: str) -> None:
    report = {}
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(["--spark_master=local[1]", *_ARGS]))
    numbers = p | beam.Create([1, 2, 3])
    report["starting_after_first_apply"] = session.starting()
    report["start_threads"] = [t.name for t in threading.enumerate() if t.name.startswith("beam_ext")]
    report["built_while_half_started"] = _build_while_starting()
    _ = numbers | beam.Map(lambda x: 2 * x) | beam.io.WriteToText(os.path.join(work_dir, "first"))
    p.run().wait_until_finish()
    context = session.active_context()
    report["first"] = {"master": context.master, "output": _written(os.path.join(work_dir, "first")),
                       "starting_after_run": session.starting(),
                       "ctrl_c_cancels_jobs": signal.getsignal(signal.SIGINT) is not signal.default_int_handler}
    context.stop()

    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(["--spark_master=local[1]", *_ARGS]))
    _ = (p | beam.Create([1, 2, 3]) | beam.Map(lambda x: 2 * x)
         | beam.io.WriteToText(os.path.join(work_dir, "changed")))
    early = session._early_start.result()  # the session started for local[1]
    p.options.view_as(SparkRunnerOptions).spark_master = "local[2]"
    p.run().wait_until_finish()
    report["changed"] = {"master": session.active_context().master, "output": _written(os.path.join(work_dir, "changed")),
                         "early_session_stopped": early._jsc is None}
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
