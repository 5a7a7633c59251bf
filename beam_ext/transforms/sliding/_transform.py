"""SlidingAggregate: exact per-event sliding-window aggregations (Railgun).

For every event, aggregates over windows that end exactly at that event,
per key. See ``docs/sliding.md``.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping

import apache_beam as beam
from apache_beam.coders import CloudpickleCoder
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import StandardOptions
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import Timestamp

from beam_ext.state.reservoir import EventReservoir
from beam_ext.transforms._fields import FieldSpec
from beam_ext.transforms._native import native_annotations
from beam_ext.transforms.sliding._engine import _SlidingEngine, compute_sorted
from beam_ext.transforms.sliding._plan import NATIVE_URN, SlidingWindow, _Plan
from beam_ext.transforms.sliding.agg import AggSpec

METRICS_NAMESPACE = "beam_ext.sliding"
_LATE_POLICIES = ("drop", "rewrite")
# Streaming state is pickled per event, so its chunks stay small.
_STREAMING_CHUNK = 256


class SlidingAggregate(beam.PTransform):
    """Per event, aggregates over sliding windows that end at the event.

    Input: any events. Output: one ``(event, features)`` per input event,
    with the event's timestamp; ``features`` maps ``f"{aggregation}_{window}"``
    to the aggregate over the events of the same key that pass ``where``
    and have ``t - delay - size < t' <= t - delay`` (events at equal
    timestamps included).

    Batch pipelines see every event of a key, so results do not depend on
    input order (equal to a brute-force oracle). Streaming pipelines answer
    each event as it arrives, over the events of its key that arrived so
    far; events more than ``allowed_disorder`` seconds older than the newest
    of their key are late: ``late_policy="drop"`` drops them, ``"rewrite"``
    moves them to the oldest accepted time. Either way they are counted in
    the ``beam_ext.sliding/late_events`` counter.

    Example::

        from beam_ext.transforms import SlidingAggregate, SlidingWindow, agg

        features = payments | SlidingAggregate(
            key="card", timestamp="ts",
            windows={"5m": SlidingWindow(300)},
            aggregations={"n": agg.count(), "total": agg.sum("amount")})
        # -> (event, {"n_5m": 3, "total_5m": 120.0})

    Cost: O(1) amortised per event and window edge, independent of the window
    size (plus O(window) for an out-of-order streaming event). Batch on
    SparkRunner runs a vectorised numpy implementation instead.

    ``key``, ``timestamp`` (seconds; default: the element timestamp) and
    aggregation fields are dict keys, attribute names or callables.
    ``streaming`` overrides the pipeline's ``--streaming`` option.
    ``deterministic=True`` (batch semantics under reordering in streaming) is
    reserved and not implemented yet.
    """

    def __init__(self, *, key: FieldSpec, windows: Mapping[str, SlidingWindow],
                 aggregations: Mapping[str, AggSpec], timestamp: FieldSpec | None = None,
                 where: Callable[[Any], bool] | None = None, allowed_disorder: float = 0.0,
                 late_policy: str = "drop", deterministic: bool = False,
                 streaming: bool | None = None, label: str | None = None) -> None:
        super().__init__(label)
        self._plan = _Plan(key, timestamp, windows, aggregations, where)
        if (isinstance(allowed_disorder, bool) or not isinstance(allowed_disorder, (int, float))
                or not math.isfinite(allowed_disorder) or allowed_disorder < 0):
            raise ValueError(f"allowed_disorder must be a finite number of seconds >= 0, got {allowed_disorder!r}")
        if late_policy not in _LATE_POLICIES:
            raise ValueError(f"late_policy must be one of {_LATE_POLICIES}, got {late_policy!r}")
        if deterministic:
            raise NotImplementedError(
                "SlidingAggregate(deterministic=True) (replay with corrections and retractions under "
                "reordering) is not implemented yet; batch pipelines are already order-free")
        if streaming is not None and not isinstance(streaming, bool):
            raise TypeError(f"streaming must be None, True or False, got {streaming!r}")
        self._allowed_disorder = float(allowed_disorder)
        self._late_policy = late_policy
        self._streaming = streaming

    @property
    def feature_names(self) -> list[str]:
        """The keys of every output's features dict, in order."""
        return [name for name, _, _ in self._plan.features]

    def _is_streaming(self, pcoll: beam.PCollection) -> bool:
        if self._streaming is not None:
            return self._streaming
        return bool(pcoll.pipeline._options.view_as(StandardOptions).streaming)

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        streaming = self._is_streaming(pcoll)
        self._streaming = streaming  # annotations() must know the mode
        keyed = pcoll | "KeyAndTime" >> beam.ParDo(_KeyAndTime(self._plan))
        if streaming:
            return keyed | "Immediate" >> beam.ParDo(
                _ImmediateFn(self._plan, self._allowed_disorder, self._late_policy))
        return (keyed
                | "GroupByKey" >> beam.GroupByKey()
                | "Exact" >> beam.ParDo(_ExactBatchFn(self._plan)))

    def annotations(self) -> dict:
        base = super().annotations()
        if self._streaming or not self._plan.vectorisable:
            return base
        from apache_beam.internal import pickler

        return {**base, **native_annotations(NATIVE_URN, pickler.dumps(self._plan))}


class _KeyAndTime(beam.DoFn):
    """event -> (key, (event time, element timestamp in micros, event))."""

    def __init__(self, plan: _Plan) -> None:
        self._plan = plan

    def process(self, event: Any, ts=beam.DoFn.TimestampParam) -> Iterable:
        micros = int(ts.micros)
        t = self._plan.event_time(event, micros / 1e6)
        yield self._plan.key(event), (t, micros, event)


class _ExactBatchFn(beam.DoFn):
    """All events of a key (and window) at once: sort, then run the engine."""

    def __init__(self, plan: _Plan) -> None:
        self._plan = plan

    def process(self, element: Any) -> Iterable:
        _, items = element
        items = sorted(items, key=lambda it: it[0])
        feats = compute_sorted(self._plan, [it[0] for it in items], [it[2] for it in items])
        for (_, micros, event), f in zip(items, feats):
            yield TimestampedValue((event, f), Timestamp(micros=micros))


class _ImmediateFn(beam.DoFn):
    """Streaming: answer each event on arrival; engine per key in Beam state."""

    ENGINE = ReadModifyWriteStateSpec("engine", CloudpickleCoder())

    def __init__(self, plan: _Plan, allowed_disorder: float, late_policy: str) -> None:
        self._plan = plan
        self._disorder = allowed_disorder
        self._policy = late_policy
        self._late = Metrics.counter(METRICS_NAMESPACE, "late_events")

    def process(self, element: Any, engine_state=beam.DoFn.StateParam(ENGINE)) -> Iterable:
        _, (t, micros, event) = element
        plan = self._plan
        engine = engine_state.read()
        if engine is None:
            engine = _SlidingEngine(plan, EventReservoir(plan.kinds, chunk_size=_STREAMING_CHUNK),
                                    retain=self._disorder)
        else:
            engine.attach(plan)
        oldest = engine.clock - self._disorder
        if t < oldest:
            self._late.inc()
            if self._policy == "drop":
                return
            t = oldest
        if plan.passes(event):
            engine.push(t, plan.row(event))
        if t >= engine.clock:
            engine.advance(t)
            feats = engine.features()
        else:
            feats = engine.query(t)
        engine_state.write(engine)
        yield TimestampedValue((event, feats), Timestamp(micros=micros))


__all__ = ["SlidingAggregate", "SlidingWindow", "NATIVE_URN"]
