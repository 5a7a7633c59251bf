"""Spark's Python worker daemon, with the runner's task code imported before it forks.

PySpark starts one daemon per executor and forks a worker from it for each
Python task that finds no idle worker. Its own daemon imports nothing, so
every forked worker imports Beam, pyarrow and the runner's task code again
on its first task: about a second of CPU on this project's 2-core machine
(`python -X importtime -c "import beam_ext.runner.worker"`), paid by
the first task of every new worker, not only by the first job. Spark forks
new workers whenever a task finds the earlier ones busy or not yet released
(a job started right after another, a task retried, a micro-batch's stages).

This daemon imports that code once, freezes what it imported out of the
collector's sight (so forked workers share those pages instead of copying
them when a collection touches them) and tunes the collector as a worker's,
then runs PySpark's own daemon loop. ``recommended_spark_conf`` sets
``beam_ext._spark_daemon`` as ``spark.python.daemon.module``, which runs
this or hands over to a daemon that already did it; it needs ``beam_ext``
importable by the executors' Python at start, as an installed package is.

Importing before the fork is safe for these modules: the only threads they
start are jemalloc's background thread (pyarrow), whose allocator re-arms it
in the child, and OpenBLAS's pool (numpy), which Spark limits to one thread
(``OMP_NUM_THREADS`` is ``spark.task.cpus``) and which is fork-aware. A
failed import is written to stderr and the daemon runs as PySpark's: tasks
then import what they need themselves, as before.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
import traceback

# What a task of the runner unpickles: its executors' task functions, the
# native steps and the transforms' engines (through ``beam_ext``), and
# PySpark's worker loop, which its daemon imports only after the fork.
PRELOADED = ("beam_ext", "beam_ext.runner.executors", "beam_ext.runner.native",
             "beam_ext.runner.worker", "beam_ext.transforms", "pyspark.worker")


def preload(modules: tuple[str, ...] = PRELOADED) -> bool:
    """Imports ``modules``; returns whether all imported.

    Standard output is the daemon's channel to the JVM (it writes its port
    there), so whatever an import prints goes to standard error instead.

    >>> preload(("json",))
    True
    """
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)  # what native code writes
    try:
        with contextlib.redirect_stdout(sys.stderr):  # what Python code prints
            for name in modules:
                importlib.import_module(name)
    except Exception:  # noqa: BLE001 - any failure leaves PySpark's own behaviour
        sys.stderr.write("beam_ext: the Python worker daemon could not import the runner's code; "
                         "each worker will import it itself:\n" + traceback.format_exc())
        return False
    finally:
        sys.stderr.flush()
        os.dup2(saved, 1)
        os.close(saved)
    return True


def prepare() -> None:
    """Readies this process for forking workers: the imports, then the collector."""
    if preload():
        from beam_ext.runner.worker._gc import tune_forked_workers_gc

        tune_forked_workers_gc()


def quiet_closed_workers() -> None:
    """Makes a forked worker whose socket the JVM closed exit without a traceback.

    Spark closes an idle worker's socket after a minute unused, and every
    idle one when its context stops. Over a Unix domain socket (which
    ``recommended_spark_conf`` turns on) PySpark's worker then reads the end
    of its input, writes an error nobody reads, and its daemon prints a
    ``BrokenPipeError`` traceback from that write into the driver's terminal
    (a long DirectRunner run beside an idle session, the end of ``make
    demo``). The JVM closed the socket itself and no task was running, so
    the worker exits as one that failed, quietly. Only that error is caught.
    """
    from pyspark import daemon

    worker = daemon.worker
    if getattr(worker, "quiet_closed", False):
        return

    def quiet(sock, authenticated):
        try:
            return worker(sock, authenticated)
        except BrokenPipeError:
            return 1  # the daemon's loop then ends this worker

    quiet.quiet_closed = True
    daemon.worker = quiet


def run() -> None:
    """The daemon: :func:`prepare`, then PySpark's daemon loop."""
    prepare()
    quiet_closed_workers()
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    run()
