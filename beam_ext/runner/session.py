"""Finding or starting the Spark context a pipeline runs on.

SparkRunner runs its stages as RDD jobs, so a session it starts itself is a
bare ``SparkContext``: building Spark SQL's ``SparkSession`` on top took
1.35-1.43 s of every start (``benchmarks/spark_startup.py --compare context``).
A user's ``SparkSession.builder.getOrCreate()`` later still builds one on it.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading

from beam_ext import _spark_daemon
from beam_ext.errors import BeamExtError
from beam_ext.runner._jvm_class_cache import driver_java_options
from beam_ext.runner.options import SparkRunnerOptions, parse_spark_conf

_LOG = logging.getLogger(__name__)
# The driver JVM's compilers. Local Spark's JVM shares the machine's cores with
# the Python workers, which do a pipeline's work; its own work is scheduling
# jobs and moving shuffle blobs. The optimizing compiler (C2) spent more of
# the cores than it saved: with the quick one alone the demo's pipeline took
# 10.8-12.8 s instead of 14.4-15.4 s, a streaming pipeline about 10% less,
# and batch pipelines of 2M-10M elements the same (docs/benchmarks/runner.md).
_QUICK_COMPILER = "-XX:TieredStopAtLevel=1"


_DAEMON_MODULE = "beam_ext._spark_daemon"
# The warm daemon of the last local session this process started.
_warm_daemon: _spark_daemon.WarmDaemon | None = None
# The context and recommended settings _warn_missing_conf checked last.
_conf_checked: tuple | None = None
# A session starting while a pipeline is being built (start_context_early).
_early_start: _EarlyStart | None = None


class SparkUnavailableError(BeamExtError, RuntimeError):
    """Spark cannot be started or reached (no Java, bad master URL, ...)."""


def _check_java() -> tuple[str, int, str]:
    """The java Spark will launch, its major version and ``-version`` text."""
    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get(
        "JAVA_HOME") else shutil.which("java")
    if not java or not os.path.exists(java):
        raise SparkUnavailableError(
            "Java not found: PySpark 4 needs Java 17+ (install it or set JAVA_HOME)")
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    try:
        major = int(out.split('"')[1].split(".")[0])
    except (IndexError, ValueError):
        return java, 0, out  # unknown format; let Spark report
    if major < 17:
        raise SparkUnavailableError(f"{java} is Java {major}; PySpark 4 needs Java 17+")
    return java, major, out


def _check_master_reachable(master: str) -> None:
    """Fail fast on a standalone master nobody listens on: Spark itself would
    retry for minutes before giving up with no hint of the URL."""
    if not master.startswith("spark://"):
        return
    for hostport in master[len("spark://"):].split(","):
        host, _, port = hostport.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=5):
                return
        except (OSError, ValueError):
            continue
    raise SparkUnavailableError(f"Spark master {master!r} is unreachable")


def active_session():
    """The running SparkSession, or None."""
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession() or SparkSession._instantiatedSession


def active_context():
    """The running SparkContext (a SparkSession's, or a bare one), or None."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    # PySpark registers a context before its JVM side exists, and until then
    # the context has no ``_jsc`` at all: a pipeline built while Spark starts
    # early on another thread sees that.
    return context if getattr(context, "_jsc", None) is not None else None


def recommended_spark_conf() -> dict[str, str]:
    """Spark settings SparkRunner applies to a session it starts itself.

    A session built elsewhere (a notebook, ``spark-submit``, a test fixture)
    runs SparkRunner's tasks as fast only with these set::

        SparkSession.builder.config(map=recommended_spark_conf()).master("local[4]").getOrCreate()

    They include a Python worker daemon that imports the runner's code once
    before it forks the workers, so ``beam_ext`` must be importable by the
    executors' Python at start (installed, not shipped with ``--py-files``).
    """
    conf = {}
    if hasattr(socket, "AF_UNIX") and os.name == "posix":
        # Spark talks to each task's Python worker over TCP loopback by
        # default; over a Unix domain socket a small task (a micro-batch's)
        # waits less for its worker: a trivial job with a shuffle takes less
        # than half the time (benchmarks/python_worker_socket.py).
        conf["spark.python.unix.domain.socket.enabled"] = "true"
    # Workers forked by this daemon start with Beam and the runner's task
    # code imported, instead of importing them on their first task.
    conf["spark.python.daemon.module"] = _DAEMON_MODULE
    return conf


def _warn_missing_conf(context) -> None:
    # Once per context and recommendation: getConf() copies the whole
    # configuration over py4j, 15 ms of every pipeline's run.
    global _conf_checked
    recommended = recommended_spark_conf()
    checked = (context, tuple(sorted(recommended.items())))
    if checked == _conf_checked:
        return
    _conf_checked = checked
    conf = context.getConf()
    missing = {k: v for k, v in recommended.items() if conf.get(k, None) != v}
    if missing:
        _LOG.info("this Spark context lacks SparkRunner's recommended settings %s: each task is slower "
                  "without them (beam_ext.runner.recommended_spark_conf)",
                  " ".join(f"{k}={v}" for k, v in missing.items()))


def _local_driver_java_options(user_options: str = "") -> str:
    """The driver JVM options of a local session SparkRunner starts: the
    quick compiler only, unless ``user_options`` choose the compilers.

    Example (a user who wants the optimizing compiler back passes
    ``--spark_conf spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=4``)::

        _local_driver_java_options("-Xss4m")                  # '-Xss4m -XX:TieredStopAtLevel=1'
        _local_driver_java_options("-XX:TieredStopAtLevel=4")  # '-XX:TieredStopAtLevel=4'
    """
    if "Tiered" in user_options:  # TieredStopAtLevel, -TieredCompilation: theirs win
        return user_options
    return f"{user_options} {_QUICK_COMPILER}".strip()


def _start_warm_daemon(conf: dict[str, str]) -> None:
    """Starts a warm Python worker daemon beside a local session's JVM and
    names it in ``conf``, when Spark's daemon would run this interpreter
    with SparkRunner's daemon module.

    The JVM takes about 4 s to start and the daemon about 2.5 s to import
    Beam and the runner, both on the first job's path; done side by side,
    the first Python task finds the imports done (``beam_ext._spark_daemon``).
    """
    global _warm_daemon
    if (conf.get("spark.python.daemon.module") != _DAEMON_MODULE
            or conf.get("spark.python.use.daemon", "true").lower() != "true"
            or f"spark.executorEnv.{_spark_daemon.WARM_DAEMON_ENV}" in conf):
        return
    worker_python = shutil.which(os.environ.get("PYSPARK_PYTHON", "python3"))
    if not worker_python or os.path.abspath(worker_python) != sys.executable:
        return
    if _warm_daemon is not None:
        _warm_daemon.stop()
    _warm_daemon = _spark_daemon.start_warm(
        hash_seed=os.environ.get("PYTHONHASHSEED", "0"),  # as PySpark's SparkContext sets it
        native_threads=conf.get("spark.executorEnv.OMP_NUM_THREADS", conf.get("spark.task.cpus", "1")))
    conf[f"spark.executorEnv.{_spark_daemon.WARM_DAEMON_ENV}"] = _warm_daemon.path


class _EarlyStart:
    """A session starting on a thread of its own while the pipeline that
    asked for it is still being built (``start_context_early``)."""

    def __init__(self, key: tuple, start) -> None:
        self.key = key
        self._start = start
        self._context = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="beam_ext-spark-start", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._context = self._start()
        except BaseException as exc:  # re-raised on the thread that runs the pipeline
            self._error = exc

    def result(self):
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._context


def _start_key(options: SparkRunnerOptions, app_name: str,
               derived_conf: dict[str, str] | None) -> tuple:
    return (options.spark_master, options.spark_app_name or app_name,
            tuple(options.spark_conf or ()), tuple(sorted((derived_conf or {}).items())))


def start_context_early(options: SparkRunnerOptions, app_name: str,
                        derived_conf: dict[str, str] | None = None) -> None:
    """Starts the session ``get_or_create_context`` would start, on a thread,
    so that Spark's start overlaps the building of the pipeline.

    A fresh process spends about two seconds starting Spark (the JVM, then
    its context) before any stage can run, while Beam builds and encodes
    the pipeline. Nothing happens if a context is running or already
    starting. ``get_or_create_context`` takes the result, or raises its
    error; were the options different by then, it stops this session and
    starts one with theirs.

    Example (what SparkRunner does when a pipeline's first transform is
    applied)::

        start_context_early(options.view_as(SparkRunnerOptions), "beam_ext")
    """
    global _early_start
    if _early_start is not None or active_context() is not None:
        return
    key = _start_key(options, app_name, derived_conf)
    _early_start = _EarlyStart(key, lambda: _start_context(options, app_name, derived_conf))


def starting() -> bool:
    """Whether a session ``start_context_early`` began is still to be taken."""
    return _early_start is not None


def get_or_create_context(options: SparkRunnerOptions, app_name: str,
                          derived_conf: dict[str, str] | None = None):
    """The running SparkContext if there is one (spark-submit, notebooks,
    tests), else a new one built from ``options``. ``derived_conf`` (from
    Dataflow's options) yields to ``--spark_conf``."""
    global _early_start
    if _early_start is not None:
        early, _early_start = _early_start, None
        context = early.result()
        if early.key == _start_key(options, app_name, derived_conf):
            _cancel_jobs_on_interrupt(context)
            return context
        _LOG.info("the options changed after Spark was started for this pipeline: starting it again")
        context.stop()
    context = active_context()
    if context is not None:
        _warn_missing_conf(context)
        return context
    return _start_context(options, app_name, derived_conf)


def _cancel_jobs_on_interrupt(context) -> None:
    """Ctrl-C cancels the running jobs, as PySpark arranges for a context
    built on the main thread; one built by ``start_context_early`` was not."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        return  # a handler of the user's own stays

    def cancel_and_interrupt(signum, frame):
        try:
            context.cancelAllJobs()
        finally:
            raise KeyboardInterrupt()

    signal.signal(signal.SIGINT, cancel_and_interrupt)


def _start_context(options: SparkRunnerOptions, app_name: str,
                   derived_conf: dict[str, str] | None):
    java, java_major, java_version = _check_java()
    _check_master_reachable(options.spark_master)
    from pyspark import SparkConf, SparkContext

    # Executors must import apache_beam and beam_ext: run this interpreter
    # unless the user chose another one.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = {"spark.ui.showConsoleProgress": "true",
            "spark.sql.execution.arrow.pyspark.enabled": "true", **recommended_spark_conf()}
    local = options.spark_master.startswith("local")
    if local:
        # Everything is in this process: listen on loopback only.
        conf.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    conf.update(derived_conf or {})
    conf.update(parse_spark_conf(options.spark_conf))
    if local:
        conf["spark.driver.extraJavaOptions"] = _local_driver_java_options(
            conf.get("spark.driver.extraJavaOptions", ""))
    if java_major:
        user_java_options = conf.get("spark.driver.extraJavaOptions", "")
        class_cache = driver_java_options(java, java_major, java_version, user_java_options)
        if class_cache:
            conf["spark.driver.extraJavaOptions"] = f"{user_java_options} {class_cache}".strip()
    if local:
        _start_warm_daemon(conf)
    spark_conf = SparkConf().setMaster(options.spark_master).setAppName(options.spark_app_name or app_name)
    spark_conf.setAll(list(conf.items()))
    _LOG.info("Starting Spark (master %s)", options.spark_master)
    try:
        return SparkContext.getOrCreate(spark_conf)
    except Exception as exc:  # py4j and JVM errors carry no hint of the cause
        if _warm_daemon is not None:
            _warm_daemon.stop()
        raise SparkUnavailableError(
            f"could not start Spark with master {options.spark_master!r}: {exc}") from exc
