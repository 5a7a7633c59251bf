"""The Python worker daemon that imports the runner's code before it forks workers,
and the warm daemon that does it while a local session's JVM starts."""
from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_ext import _spark_daemon
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
    assert recommended_spark_conf()["spark.python.daemon.module"] == "beam_ext._spark_daemon"
    # A plain PySpark job: nothing it unpickles imports beam_ext, so the
    # runner's code is there because the worker was forked with it.
    facts = spark.sparkContext.parallelize(range(4), 4).mapPartitions(_worker_facts).collect()
    assert len(facts) == 4
    for fact in facts:
        assert "beam_ext._spark_daemon" in fact["parent"], fact["parent"]
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


# The hand-over between the daemon Spark launches and a warm daemon, with this
# test in the JVM's place: it launches the daemon as PySpark's worker factory
# does (over TCP, so the daemon writes a port) and reads what Spark reads.
def _launch_as_spark(**env):
    env = dict(os.environ, PYTHON_WORKER_FACTORY_SECRET="secret", PYTHONUNBUFFERED="YES", **env)
    env.pop("PYTHON_UNIX_DOMAIN_ENABLED", None)
    return subprocess.Popen([sys.executable, "-m", "beam_ext._spark_daemon", "pyspark.worker"],
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def _port(daemon) -> int:
    data = daemon.stdout.read(4)
    assert len(data) == 4, daemon.stderr.read().decode()[-3000:]
    return struct.unpack("!i", data)[0]


@pytest.fixture
def warm():
    daemon = _spark_daemon.start_warm(hash_seed="0", native_threads="1")
    yield daemon
    daemon.process.kill()
    daemon.process.wait()


def test_spark_daemon_takes_over_the_warm_one_and_stops_it_on_sigterm(warm):
    daemon = _launch_as_spark(BEAM_EXT_WARM_DAEMON=warm.path, PYTHONHASHSEED="0", OMP_NUM_THREADS="1")
    try:
        assert 0 < _port(daemon) < 65536  # written by the warm daemon's loop
        assert warm.handed_over()
        daemon.send_signal(signal.SIGTERM)  # how Spark stops its daemon
        warm.process.wait(timeout=60)  # ended (PySpark's daemon loop exits 1 either way)
        assert daemon.wait(timeout=60) == 0
    finally:
        daemon.kill()


def test_a_warm_daemon_started_otherwise_is_refused(warm):
    daemon = _launch_as_spark(BEAM_EXT_WARM_DAEMON=warm.path, PYTHONHASHSEED="1", OMP_NUM_THREADS="1")
    try:
        assert warm.process.wait(timeout=60) == 0
        assert 0 < _port(daemon) < 65536  # this daemon runs itself instead
        daemon.stdin.close()  # how Spark's JVM tells its daemon to exit
        daemon.wait(timeout=60)
        err = daemon.stderr.read().decode()
        assert "refused the hand-over (PYTHONHASHSEED='1', warm daemon's '0')" in err, err[-3000:]
    finally:
        daemon.kill()


def test_a_warm_daemon_nobody_took_over_ends_with_the_driver(warm):
    warm.process.stdin.close()  # as when the driver exits
    assert warm.process.wait(timeout=60) == 0
    assert not os.path.exists(os.path.dirname(warm.path))


def test_a_worker_whose_socket_the_jvm_closed_exits_without_a_traceback(monkeypatch, capfd):
    import socket

    from pyspark import daemon

    # As Spark starts its daemon; the daemon's loop is PySpark's, restored after the test.
    monkeypatch.setenv("PYTHON_DAEMON_KILL_WORKER_ON_FLUSH_FAILURE", "true")
    monkeypatch.setattr(daemon, "worker", daemon.worker)

    def closed_by_the_jvm() -> socket.socket:
        ours, jvm = socket.socketpair()
        jvm.close()  # Spark's idle-worker cleanup, or its context's stop
        return ours

    # PySpark's own worker: the error it writes after reading the end of its
    # input cannot be flushed, and its daemon would print the traceback.
    with pytest.raises(BrokenPipeError):
        daemon.worker(closed_by_the_jvm(), True)
    _daemon.quiet_closed_workers()
    quiet = daemon.worker
    _daemon.quiet_closed_workers()
    assert daemon.worker is quiet  # wrapped once
    assert daemon.worker(closed_by_the_jvm(), True) == 1  # the daemon's loop ends the worker
    assert "BrokenPipeError" not in capfd.readouterr().err
