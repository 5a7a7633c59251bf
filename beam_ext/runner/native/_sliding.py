"""SlidingAggregate on Spark: the vectorised batch path per key partition.

Events are partitioned by the stable hash of their key's encoding; each task
sorts its partition and computes every window of every event at once with
:func:`beam_ext.transforms.sliding._vectorised.compute_batch`.
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from beam_ext._key_hash import key_hash, untyped_key_coder
from beam_ext.transforms.sliding._plan import _Plan
from beam_ext.transforms.sliding._vectorised import compute_batch


def _partition(plan: _Plan, items: Iterator[tuple[Any, tuple[float, Any]]]) -> Iterator[Any]:
    groups, times, wvs = [], [], []
    for (key, _), (t, wv) in items:
        groups.append((key, wv.windows))
        times.append(t)
        wvs.append(wv)
    feats = compute_batch(plan, groups, np.asarray(times, dtype=np.float64), [wv.value for wv in wvs])
    for wv, f in zip(wvs, feats):
        yield wv.with_value((wv.value, f))


def sliding_on_rdd(plan: _Plan, rdd: Any, parallelism: int) -> Any:
    """RDD of WindowedValue(event) -> RDD of WindowedValue((event, features))."""

    # Keys are grouped and partitioned by their encoding, as GroupByKey does
    # on the Beam path: Python's hash() differs between workers, and Python
    # equality would split NaN keys and merge 1 with 1.0.
    coder = untyped_key_coder("SlidingAggregate key")

    def keyed(wv: Any) -> tuple:
        event = wv.value
        t = plan.event_time(event, wv.timestamp.micros / 1e6)
        return (coder.encode(plan.key(event)), wv.windows), (t, wv)

    return (rdd.map(keyed)
            .partitionBy(parallelism, lambda k: key_hash(k[0]))
            .mapPartitions(lambda it: _partition(plan, it), preservesPartitioning=False))


def sliding_on_spark(payload: bytes, rdd: Any, ctx: Any) -> Any:
    """SparkRunner's implementation of ``SlidingAggregate``'s native URN."""
    from apache_beam.internal import pickler

    return sliding_on_rdd(pickler.loads(payload), rdd, ctx.parallelism)
