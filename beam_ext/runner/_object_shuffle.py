"""Python objects through a Spark shuffle, each pickled once by the standard pickler.

PySpark 4 pickles an RDD's records with cloudpickle, whose pickler looks
each object's type up in a ``ChainMap`` and calls a Python
``reducer_override`` for every object other than a string, number, list,
tuple or dict: a ``WindowedValue``, its ``Timestamp`` and windows cost it
about three times what the standard pickler takes (7.9 against 2.9 µs an
element in an interval window, 3.1 against 1.1 µs in the global window:
``benchmarks/object_pickling.py``). The native steps that move batches of
elements between tasks (``Reshuffle``, a file write's shards,
SlidingAggregate's events) hand this module ``(target task, object)``
pairs: each object crosses as the one ``bytes`` the standard pickler makes
of it.

An object the standard pickler refuses (a lambda, a class defined in a
function), or whose pickle names ``__main__`` (a class of the user's
script, which the reading task's ``__main__`` may not have), goes through
cloudpickle, as PySpark would have sent it, but Beam's copy of it, which
pickled the job's DoFns: a class of ``__main__`` then comes out as the very
class the reading task's DoFns make instances of. ``pickle.loads`` reads
both.
"""
from __future__ import annotations

import pickle
from typing import Any

from apache_beam.internal.cloudpickle import cloudpickle

from beam_ext.runner._shuffle import identity_partition

_PROTOCOL = pickle.HIGHEST_PROTOCOL


def dumps(obj: Any) -> bytes:
    """``obj`` pickled, by the standard pickler where the result reads anywhere."""
    try:
        data = pickle.dumps(obj, _PROTOCOL)
    except Exception:  # noqa: BLE001 - whatever it refuses, cloudpickle may take
        return cloudpickle.dumps(obj, _PROTOCOL)
    return cloudpickle.dumps(obj, _PROTOCOL) if b"__main__" in data else data


def _dumped(pair: tuple[int, Any]) -> tuple[int, bytes]:
    return pair[0], dumps(pair[1])


def shuffled(pairs: Any, partitions: int) -> Any:
    """The objects of an RDD of ``(target task, object)`` pairs, each in the
    task its target names (``0 <= target < partitions``)."""
    return pairs.map(_dumped).partitionBy(partitions, identity_partition).values().map(pickle.loads)
