"""The cyclic garbage collector of a Spark Python worker, set for bulk work.

A task makes and keeps many small objects (a partition's elements, their
windowed values, the rows a sink buffers). With CPython's default
thresholds the collector runs every 700 allocations and, as the kept
objects grow, traverses all of them again and again; those objects form no
cycles and are freed by reference counting anyway. Only cyclic garbage
waits for the collector, so running it 140 times less often costs little
memory (docs/benchmarks/runner.md gives what it saves).

Applied once per worker process, when SparkRunner's code is first imported
in it; never in the driver, whose collector stays the user's.
"""
from __future__ import annotations

import gc
import sys

# Young-generation threshold: objects allocated between collections.
WORKER_GC_THRESHOLD = 100_000

_tuned = False


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
    _tuned = True
    return True
