"""The path users take to a real cluster: a standalone master and two workers.

Both are started on loopback from the pyspark wheel's ``spark-class``; the
pipeline is submitted with ``--spark_master=spark://127.0.0.1:PORT`` from a
separate process (one SparkContext per process).
"""
from __future__ import annotations

import collections
import glob
import json
import os
import socket
import subprocess
import sys
import time

import pyspark
import pytest

pytestmark = pytest.mark.cluster

_SPARK_HOME = os.path.dirname(pyspark.__file__)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory):
    env = dict(os.environ, SPARK_HOME=_SPARK_HOME, SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_PYTHON=sys.executable, SPARK_NO_DAEMONIZE="1")
    spark_class = os.path.join(_SPARK_HOME, "bin", "spark-class")
    port = _free_port()
    logs = tmp_path_factory.mktemp("cluster-logs")
    procs = []

    def start(name, *args):
        log = open(logs / f"{name}.log", "wb")
        procs.append(subprocess.Popen([spark_class, *args], env=env, stdout=log,
                                      stderr=subprocess.STDOUT))

    start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
          "--port", str(port), "--webui-port", str(_free_port()))
    try:
        _wait_for_port(port, 120)
        for i in range(2):
            start(f"worker{i}", "org.apache.spark.deploy.worker.Worker",
                  f"spark://127.0.0.1:{port}", "--host", "127.0.0.1", "--cores", "1",
                  "--memory", "1g", "--webui-port", str(_free_port()),
                  "--work-dir", str(tmp_path_factory.mktemp(f"work{i}")))
        yield f"spark://127.0.0.1:{port}", logs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_unreachable_master_is_a_clear_error(tmp_path):
    job = os.path.join(os.path.dirname(__file__), "cluster_job.py")
    done = subprocess.run(
        [sys.executable, job, str(tmp_path / "x"), "--runner=beam_ext.runner.SparkRunner",
         f"--spark_master=spark://127.0.0.1:{_free_port()}"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "is unreachable" in done.stderr and "spark://127.0.0.1:" in done.stderr


def test_a_pipeline_and_its_dependencies_run_on_a_standalone_cluster(standalone_cluster, tmp_path):
    """One submission (each starts a driver and its executors, about half a
    minute on 2 cores): words counted through a shuffle over both workers, and Dataflow's
    dependency options: the DoFn's package by --setup_file, a wheel by
    --extra_package, another by --requirements_file, and a __main__ global
    under dill by --save_main_session. None of them is installed or on the
    executors' PYTHONPATH; each element reports where executors imported them."""
    from _user_packages import write_package, write_wheel

    master, logs = standalone_cluster
    setup_py = write_package(tmp_path / "src", "userpkg", with_dofn=True)
    extra = write_wheel(tmp_path / "dist", "extrapkg")
    required = write_wheel(tmp_path / "wheelhouse", "reqpkg")
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(f"{required}\n")
    out = tmp_path / "out"
    job = os.path.join(os.path.dirname(__file__), "dataflow_job.py")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    # The driver imports the wheels' packages from their sources, as a user's
    # development environment would.
    driver_path = os.pathsep.join([str(setup_py.parent), str(tmp_path / "driver")])
    for name in ("extrapkg", "reqpkg"):
        (tmp_path / "driver" / name).mkdir(parents=True)
        (tmp_path / "driver" / name / "__init__.py").write_text(f"NAME = {name!r}\n")
    done = subprocess.run(
        [sys.executable, job, str(out), driver_path, "userpkg,extrapkg,reqpkg",
         "--runner=beam_ext.runner.SparkRunner", f"--spark_master={master}", "--spark_parallelism=2",
         "--spark_conf=spark.executor.memory=512m", f"--staging_location={tmp_path / 'staging'}",
         f"--setup_file={setup_py}", f"--extra_package={extra}", f"--requirements_file={requirements}",
         "--pickle_library=dill", "--save_main_session", "--project=p", "--region=r"],
        env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = []
    for path in glob.glob(str(out) + "-*"):
        with open(path) as f:
            rows += [line.strip() for line in f]
    assert all(row.startswith("main:") for row in rows), rows  # the saved main session's PREFIX
    parsed = sorted(json.loads(row[len("main:"):]) for row in rows)
    assert [element for element, _ in parsed] == ["a", "b", "c"]
    (built,) = glob.glob(str(tmp_path / "staging" / "beam_ext-deps" / "*" / "beam_ext_deps-*.zip"))
    for _, files in parsed:
        for name in ("userpkg", "extrapkg", "reqpkg"):
            # On the executors, from the zip Spark shipped: not the driver's copies.
            assert files[name].endswith(os.path.join(os.path.basename(built), name, "__init__.py")), files
            assert not files[name].startswith(str(tmp_path)), files
    counts = collections.Counter()
    for path in glob.glob(str(out) + ".counts-*"):
        with open(path) as f:
            for line in f:
                word, n = line.strip().split(",")
                counts[word] += int(n)
    expected = collections.Counter()
    for i in range(100):
        expected[f"w{i % 7}"] += 1
        expected[f"w{i % 3}"] += 1
    assert counts == expected
    # Both workers registered with the master (the job had two executors to use).
    master_log = (logs / "master.log").read_text(errors="replace")
    assert master_log.count("Registering worker") == 2
