"""The cyclic garbage collector of a Spark Python worker, set for bulk work.

A task makes and keeps many small objects (a partition's elements, their
windowed values, the rows a sink buffers). With CPython's default
thresholds the collector runs every 700 allocations and, as the kept
objects grow, traverses all of them again and again; those objects form no
cycles and are freed by reference counting anyway. Only cyclic garbage
waits for the collector, so running it 140 times less often costs little
memory (docs/benchmarks/runner.md gives what it saves).

Between tasks, PySpark's reused worker runs a full collection before it
takes the next task, and that task waits for it. What survives that
collection (modules, pooled bundle processors) is frozen, so the next one
traverses only what later tasks made; one in ``THAW_EVERY`` thaws first, so
frozen objects that died in cycles are freed too.

Applied once per worker process, when SparkRunner's code is first imported
in it, or once in the daemon the workers fork from when it imports that code
first (``_daemon``); never in the driver, whose collector stays the user's.
"""
from __future__ import annotations

import gc
import sys

# Young-generation threshold: objects allocated between collections.
WORKER_GC_THRESHOLD = 100_000
# Between tasks, one full collection in this many also traverses the frozen
# objects, so cycles that died after they were frozen are freed too.
THAW_EVERY = 64

_tuned = False
_since_thaw = 0
_thawing = False


def _in_spark_task() -> bool:
    # pyspark.worker sets the task context before it unpickles the task's
    # functions, which is what imports this module on a worker.
    taskcontext = sys.modules.get("pyspark.taskcontext")
    return taskcontext is not None and taskcontext.TaskContext.get() is not None


def tune_worker_gc() -> bool:
    """Raises the collector's young-generation threshold in a Spark Python worker.

    Returns whether this process is one (and so was tuned). Idempotent.

    >>> tune_worker_gc()  # not in a Spark task: nothing changes
    False
    """
    global _tuned
    if _tuned:
        return True
    if not _in_spark_task():
        return False
    first, *older = gc.get_threshold()
    gc.set_threshold(max(first, WORKER_GC_THRESHOLD), *older)
    gc.callbacks.append(_freeze_between_tasks)
    _tuned = True
    return True


def tune_forked_workers_gc() -> None:
    """Tunes the collector of the process Spark's Python workers fork from.

    The worker daemon (``_daemon``) calls it once it has imported the
    runner's code: each forked worker starts tuned, and what the imports made
    is frozen, so no worker's collection writes to those shared pages.
    """
    global _tuned
    first, *older = gc.get_threshold()
    gc.set_threshold(max(first, WORKER_GC_THRESHOLD), *older)
    if not _tuned:
        gc.callbacks.append(_freeze_between_tasks)
    _tuned = True
    gc.collect()
    gc.freeze()


def _freeze_between_tasks(phase: str, info: dict) -> None:
    """Freezes what survives the full collection PySpark runs after each task.

    A reused worker runs ``gc.collect()`` before it takes its next task, and
    the Spark task waiting for that worker waits for it: with Beam, pyarrow
    and the pooled bundle processors loaded, one full collection traverses
    hundreds of thousands of long-lived objects (tens to hundreds of
    milliseconds), more than a micro-batch's task does. Everything alive
    right after a full collection is really alive, so freezing it there
    leaves the next collection only what later tasks made.
    """
    global _since_thaw, _thawing
    if phase != "stop" or info.get("generation") != 2 or _thawing or _in_spark_task():
        return  # only the collection between tasks: a task's live objects die with it
    _since_thaw += 1
    if _since_thaw >= THAW_EVERY:
        _since_thaw = 0
        _thawing = True
        try:
            gc.unfreeze()
            gc.collect()
        finally:
            _thawing = False
    gc.freeze()
