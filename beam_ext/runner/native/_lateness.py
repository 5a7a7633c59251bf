"""LateWindowedGroupByKey on Spark: the lateness engine over a SpillStore per task.

Keys are partitioned by the stable hash of their encoding; each task feeds
its partition to the same pane engine the Beam path's transitions come from
(:mod:`beam_ext.transforms.lateness`), with values in a spill store bounded
by the transform's memory budget, and passes panes on as windows fire. It
replaces only the transform's stateful step: the stateless step after it
splits and counts panes and dead letters on both paths, and the engine counts
what the Beam path's stateful step counts.
"""
from __future__ import annotations

import functools
import itertools
import pickle
import shutil
import tempfile
from typing import Any, Iterable, Iterator

from apache_beam.utils.windowed_value import PaneInfo, WindowedValue

from beam_ext._key_hash import key_hash
from beam_ext.runner._element_batches import BATCH
from beam_ext.runner._object_shuffle import shuffled
from beam_ext.transforms.lateness._backends import _SpillBackend
from beam_ext.transforms.lateness._beam_panes import (
    FIRINGS_WITHOUT_NEW_DATA,
    LATE_EVENTS,
    _dead_output,
    _pane_output,
)
from beam_ext.transforms.lateness._engine import _LateEngine
from beam_ext.transforms.lateness._gbk import METRICS_NAMESPACE


def late_panes_on_spark(payload: bytes, rdd: Any, ctx: Any) -> Any:
    """Per key partition, the same pane logic over a SpillStore per task.

    The input is bounded, so the watermark jumps to +infinity once a
    partition's values are all in the store, as on Beam's batch runners.
    """
    config = pickle.loads(payload)
    _, _, _, key_coder, _ = config
    batches = shuffled(rdd.mapPartitions(functools.partial(_keyed_batches, key_coder, ctx.parallelism)),
                       ctx.parallelism)
    counters = {name: ctx.counter(METRICS_NAMESPACE, name)
                for name in (LATE_EVENTS, FIRINGS_WITHOUT_NEW_DATA)}
    return batches.mapPartitions(functools.partial(_batches_panes, config, counters))


def _keyed_batches(key_coder: Any, partitions: int,
                   elements: Iterable[WindowedValue]) -> Iterator[tuple[int, list[tuple[bytes, WindowedValue]]]]:
    """``(target task, [(encoded key, element), ...])``: up to :data:`BATCH` of
    a task's elements bound for one task, by the stable hash of their key's
    encoding. Batches, not pairs, cross the shuffle (runner/_object_shuffle.py)."""
    pending: list[list] = [[] for _ in range(partitions)]
    encode = key_coder.encode
    for wv in elements:
        key = encode(wv.value[0])
        target = key_hash(key) % partitions
        batch = pending[target]
        batch.append((key, wv))
        if len(batch) >= BATCH:
            yield target, batch
            pending[target] = []
    for target, batch in enumerate(pending):
        if batch:
            yield target, batch


def _batches_panes(config: tuple, counters: dict[str, Any], batches: Iterable[list]) -> Iterator[WindowedValue]:
    return _partition_panes(config, counters, itertools.chain.from_iterable(batches))


def _partition_panes(config: tuple, counters: dict[str, Any],
                     partition: Iterable[tuple[bytes, WindowedValue]]) -> Iterator[WindowedValue]:
    """One partition's panes and dead letters, passed on as the engine makes them.

    Only the outputs of one engine step (an element, or one window's timer)
    are held at a time, so a task holds at most one pane beside the spill
    store however many windows it fires. ``counters`` by name: the engine's
    counts, added once the partition is done.
    """
    from beam_ext.state import SpillStore

    trigger, cleanup, budget, key_coder, value_coder = config
    tmp = tempfile.mkdtemp(prefix="beam_ext-spill-")
    ready: list[WindowedValue] = []
    windows: dict[tuple[float, float], Any] = {}

    def emit(key: bytes, w: tuple[float, float], vals: Iterable[bytes], pane: PaneInfo) -> None:
        ready.append(_pane_output(key_coder.decode(key),
                                  [value_coder.decode(v) for v in vals], windows[w], pane))

    def dead(key: bytes, w: tuple[float, float], value: bytes) -> None:
        ready.append(_dead_output(key_coder.decode(key), value_coder.decode(value), windows[w]))

    engine = _LateEngine(trigger, cleanup, _SpillBackend(SpillStore(tmp, budget)), emit, dead)
    try:
        for key, wv in partition:
            encoded = value_coder.encode(wv.value[1])
            for window in wv.windows:
                end = window.end.micros / 1e6
                w = (getattr(window, "start", window.end).micros / 1e6, end)
                windows.setdefault(w, window)
                engine.element(key, w, encoded)
            yield from ready
            ready.clear()
        for _ in engine.advancing_watermark(float("inf")):
            yield from ready
            ready.clear()
        # Beam reports a counter only once incremented: so do we, for equal metrics.
        for name, n in ((LATE_EVENTS, engine.late_events),
                        (FIRINGS_WITHOUT_NEW_DATA, engine.firings_without_new_data)):
            if n:
                counters[name].inc(n)
    finally:
        engine.close()
        shutil.rmtree(tmp, ignore_errors=True)
