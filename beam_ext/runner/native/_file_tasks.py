"""Parts of files (whole files, byte ranges, row groups) packed into Spark tasks.

A task per part costs Spark's scheduling and a task's set-up per part,
whatever the part holds: read as a task each, 200 text files of 70 kB took
longer on SparkRunner than on DirectRunner (docs/benchmarks/runner.md).
Spark's own file sources pack small files into partitions the same way,
counting each file's opening as bytes read (``spark.sql.files.openCostInBytes``).

Parts stay in their order, each task taking a run of neighbours: a task's
elements come in file order, and the tasks' in task order, as they did with
a task per part (a one-shard write of a read keeps the files' order).
"""
from __future__ import annotations

import functools
from itertools import chain
from typing import Any, Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")

#: What opening a file weighs, in bytes read: Spark SQL's default ``spark.sql.files.openCostInBytes``.
OPEN_COST = 4 << 20


def packed(sized_parts: list[tuple[T, int]], parallelism: int) -> list[list[T]]:
    """``(part, bytes)`` pairs as runs of neighbouring parts, one per task.

    Each part weighs its bytes plus :data:`OPEN_COST`; a run is closed before
    a part that would take it past an even share of the whole over
    ``parallelism`` tasks, so no run but a single part's outweighs the share.
    """
    if not sized_parts:
        return []
    weights = [size + OPEN_COST for _, size in sized_parts]
    share = -(-sum(weights) // max(parallelism, 1))
    runs: list[list[T]] = [[]]
    load = 0
    for (part, _), weight in zip(sized_parts, weights):
        if runs[-1] and load + weight > share:
            runs.append([])
            load = 0
        runs[-1].append(part)
        load += weight
    return runs


def _read_run(read: Callable[[T], Iterable[Any]], run: list[T]) -> Iterator[Any]:
    return chain.from_iterable(map(read, run))


def parts_rdd(sc: Any, sized_parts: list[tuple[T, int]], parallelism: int,
              read: Callable[[T], Iterable[Any]]) -> Any:
    """An RDD of what ``read`` gives for each part, the parts :func:`packed` into tasks."""
    runs = packed(sized_parts, parallelism)
    if not runs:
        return sc.parallelize([], 1)
    return sc.parallelize(runs, len(runs)).flatMap(functools.partial(_read_run, read))
