"""Pipelines on the runner's own local Spark, run by test_runner_errors.py.

A separate process: the runner must start Spark itself, with its default
master, which the test session's ``local[2]`` would otherwise shadow.
Prints one JSON line: the master, recommended settings and driver Java
options of the Spark context the runner started, whether it built a Spark
SQL session (it need not) and whether a user can build one on that context
afterwards, the first pipeline's output, the
second pipeline's error, how many times its failing element was tried, the
processes the first pipeline's Python workers forked from, the warm daemon
the runner started, and whether that daemon ended when the session stopped.
"""
import glob
import json
import os
import signal
import subprocess
import sys

import apache_beam as beam

from beam_ext.runner import PipelineError, SparkRunner, recommended_spark_conf, session
from beam_ext.runner.session import active_context, active_session


def main(work_dir: str) -> None:
    marker = os.path.join(work_dir, "killed-once")
    parents = os.path.join(work_dir, "parents")

    def die_once(x):
        with open(parents, "a") as f:
            f.write(f"{os.getppid()}\n")
        # The first attempt's Python worker dies as the kernel's OOM killer
        # would kill it; Spark's retry must then give the exact result.
        if x == 3 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return x

    attempts = os.path.join(work_dir, "attempts")

    def fail_on_three(x):
        if x == 3:
            with open(attempts, "a") as f:
                f.write("attempt\n")
            raise ValueError(f"bad element {x}")
        return x

    out = os.path.join(work_dir, "out")
    with beam.Pipeline(runner=SparkRunner()) as p:
        _ = (p | beam.Create(range(10)) | "DieOnce" >> beam.Map(die_once)
             | beam.io.WriteToText(out))
    error = None
    try:
        with beam.Pipeline(runner=SparkRunner()) as p:
            _ = p | beam.Create([1, 2, 3]) | "FailOnThree" >> beam.Map(fail_on_three)
    except PipelineError as exc:
        error = str(exc)
    written = []
    for path in glob.glob(out + "*"):
        with open(path) as f:
            written += [int(line) for line in f]
    context = active_context()
    conf = context.getConf()
    report = {"master": context.master, "sql_session_started": active_session() is not None,
              "settings": {key: conf.get(key, None) for key in recommended_spark_conf()},
              "java_options": conf.get("spark.driver.extraJavaOptions", ""),
              "killed": os.path.exists(marker),
              "written": sorted(written), "error": error,
              "attempts": len(open(attempts).readlines()),
              "worker_parents": sorted({int(line) for line in open(parents)}),
              "warm_daemon": session._warm_daemon.pid}
    from pyspark.sql import SparkSession

    users = SparkSession.builder.getOrCreate()  # a user's, after the pipelines: on the same context
    report["users_session"] = {"same_context": users.sparkContext is context,
                               "count": users.range(5).count()}
    context.stop()  # Spark stops its daemon: the warm one must end with it
    try:
        report["warm_daemon_exit"] = session._warm_daemon.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        report["warm_daemon_exit"] = "still running"
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
