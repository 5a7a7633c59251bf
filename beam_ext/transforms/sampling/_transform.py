"""ApproximateWindowAggregate: the Beam composite around the sampler replay."""
from __future__ import annotations

import collections
import math
from typing import Any, Iterator

import apache_beam as beam
import numpy as np
from apache_beam.coders import FloatCoder, PickleCoder, TupleCoder
from apache_beam.options.pipeline_options import StandardOptions
from apache_beam.transforms import userstate
from apache_beam.transforms import window as beam_window
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.utils.timestamp import Timestamp

from beam_ext.transforms._fields import FieldSpec, field_getter
from beam_ext.transforms.sampling import _online
from beam_ext.transforms.sampling._online import KeyProgress, KeySampler
from beam_ext.transforms.sampling._sampler import (
    AGGREGATES,
    ApproximateResult,
    SamplerConfig,
    replay,
)

METRICS_NAMESPACE = "beam_ext.sampling"
_STREAMING_COUNTERS = (_online.OBSERVED, _online.SAMPLED, _online.STRAGGLERS, _online.LATE,
                       _online.EVICTED, _online.BEHIND, _online.REPLAYS, _online.AT_END)


class ApproximateWindowAggregate(beam.PTransform):
    """Per-window mean, sum or count estimated from a sample that completes
    by the window's deadline, so results do not wait for stragglers
    (Farhat's thesis, chapter 4).

    Each result is an :class:`ApproximateResult` with the confidence
    interval the estimate really has; ``waited_for_stragglers`` tells when
    the sample could not complete by the deadline. With ``corrections=True``
    a window whose stragglers arrive after its result gets one more, exact
    pane (``is_correction=True``) once the K-slack watermark passes it.

    Batch semantics: events are grouped per key and replayed in arrival
    order (``arrival_time``), so results depend only on the data and
    ``seed``, never on the runner or on bundling.

    Streaming semantics (unbounded input or ``--streaming``): a stateful
    DoFn per key releases each pane once the key's clock (the largest
    ``arrival_time`` seen, or a processing-time timer set for the next
    emission time) passes its ``emitted_at``, without waiting for
    stragglers; the panes are those of the batch replay of the same
    arrivals when each key's events come in arrival order and
    ``arrival_time`` is on the runner's processing-time clock. Panes still
    pending when the input ends (watermark at +inf) are released then.

    Example::

        estimates = events | ApproximateWindowAggregate(
            window=3.0, value="trip_distance", aggregate="mean",
            event_time="gen_ts", arrival_time="arr_ts")

    Counters in namespace ``beam_ext.sampling``: ``stragglers_after_emission``
    (arrived after their window's first pane), ``late_events`` (arrived after
    the window's last pane, so in no result), ``observed_events``,
    ``sampled_events``.
    """

    def __init__(
        self,
        window: float | beam_window.FixedWindows,
        value: FieldSpec | None = None,
        aggregate: str = "mean",
        error: float = 0.05,
        confidence: float = 0.95,
        substream: float = 0.6,
        history: int = 20,
        key: FieldSpec | None = None,
        event_time: FieldSpec | None = None,
        arrival_time: FieldSpec = "arr_ts",
        corrections: bool = False,
        seed: int = 0,
        safety: float = 0.5,
    ) -> None:
        super().__init__()
        size, offset = _window_bounds(window)
        if aggregate not in AGGREGATES:
            raise ValueError(f"aggregate must be one of {AGGREGATES}, got {aggregate!r}")
        if value is None and aggregate != "count":
            raise ValueError(f"value is required for aggregate={aggregate!r}")
        self._config = SamplerConfig(
            window=size, substream=substream, aggregate=aggregate, error=error,
            confidence=confidence, history=history, offset=offset,
            corrections=corrections, seed=seed, safety=safety)
        self._value = field_getter(value, "value") if value is not None else None
        self._key = field_getter(key, "key") if key is not None else None
        self._event_time = (field_getter(event_time, "event_time")
                            if event_time is not None else None)
        self._arrival_time = field_getter(arrival_time, "arrival_time")

    def expand(self, events: beam.PCollection) -> beam.PCollection:
        config = self._config
        keyed = (
            events
            | "Extract" >> beam.ParDo(_Extract(self._value, self._key, self._event_time,
                                               self._arrival_time))
            # History spans windows: per key, one replay or one state for all of them.
            | "Unwindow" >> beam.WindowInto(beam_window.GlobalWindows()))
        if events.is_bounded is False or events.pipeline.options.view_as(StandardOptions).streaming:
            panes = keyed | "Online" >> beam.ParDo(_StreamingFn(config))
        else:
            panes = (keyed
                     | "PerKey" >> beam.GroupByKey()
                     | "Replay" >> beam.ParDo(_ReplayFn(config)))
        return panes | "Rewindow" >> beam.WindowInto(
            beam_window.FixedWindows(config.window, config.offset))


def _window_bounds(window: Any) -> tuple[float, float]:
    if isinstance(window, beam_window.FixedWindows):
        return window.size.micros / 1e6, window.offset.micros / 1e6
    if isinstance(window, beam_window.WindowFn):
        raise ValueError(f"window: only tumbling windows (a size in seconds or "
                         f"FixedWindows) are supported, got {type(window).__name__}")
    if isinstance(window, bool) or not isinstance(window, (int, float)):
        raise TypeError(f"window must be a size in seconds or FixedWindows, got {window!r}")
    return float(window), 0.0


def _time(getter: Any, event: Any, role: str) -> float:
    raw = getter(event)
    try:
        t = float(raw.micros / 1e6) if hasattr(raw, "micros") else float(raw)
    except (TypeError, ValueError):
        raise ValueError(
            f"{role}: not a time in seconds ({raw!r}) in event {event!r:.500}") from None
    if not math.isfinite(t):
        raise ValueError(f"{role}: not a finite time ({raw!r}) in event {event!r:.500}")
    return t


class _Extract(beam.DoFn):
    """Event -> (key, (arrival, generation, value)); validates each event."""

    def __init__(self, value: Any, key: Any, event_time: Any, arrival_time: Any) -> None:
        self._value = value
        self._key = key
        self._event_time = event_time
        self._arrival_time = arrival_time

    def process(self, event: Any, timestamp: Any = beam.DoFn.TimestampParam
                ) -> Iterator[tuple[Any, tuple[float, float, float]]]:
        if self._event_time is None:
            gen = float(timestamp.micros / 1e6)
        else:
            gen = _time(self._event_time, event, "event_time")
        arr = _time(self._arrival_time, event, "arrival_time")
        if arr < gen:
            raise ValueError(
                f"arrival_time {arr} is before event_time {gen} in event {event!r:.500}")
        if self._value is None:
            value = 0.0
        else:
            raw = self._value(event)
            try:
                value = float(raw)
            except (TypeError, ValueError):
                raise ValueError(f"value: not a number ({raw!r}) in event {event!r:.500}") from None
            if not math.isfinite(value):
                raise ValueError(f"value: not finite ({raw!r}) in event {event!r:.500}")
        key = self._key(event) if self._key is not None else None
        yield key, (arr, gen, value)


class _ReplayFn(beam.DoFn):
    def __init__(self, config: SamplerConfig) -> None:
        self._config = config
        counter = beam.metrics.Metrics.counter
        self._stragglers = counter(METRICS_NAMESPACE, "stragglers_after_emission")
        self._late = counter(METRICS_NAMESPACE, "late_events")
        self._observed = counter(METRICS_NAMESPACE, "observed_events")
        self._sampled = counter(METRICS_NAMESPACE, "sampled_events")

    def process(self, element: tuple[Any, Any]) -> Iterator[beam_window.TimestampedValue]:
        key, triples = element
        cols = np.array(sorted(triples), dtype=np.float64).reshape(-1, 3)
        outcome = replay(cols[:, 1], cols[:, 0], cols[:, 2], self._config, key=key)
        self._stragglers.inc(outcome.stragglers_after_emission)
        self._late.inc(outcome.late)
        self._observed.inc(outcome.observed)
        self._sampled.inc(outcome.sampled)
        yield from _timestamped(outcome.results)


class _StreamingFn(beam.DoFn):
    """Per key: the kept arrivals in a bag, the :class:`KeyProgress` in a
    value, a processing-time timer at the next emission time and an
    event-time timer for the end of the input; :class:`KeySampler` decides."""

    ARRIVALS = userstate.BagStateSpec(
        "arrivals", TupleCoder([FloatCoder(), FloatCoder(), FloatCoder()]))
    PROGRESS = userstate.ReadModifyWriteStateSpec("progress", PickleCoder())
    DEADLINE = userstate.TimerSpec("deadline", TimeDomain.REAL_TIME)
    END = userstate.TimerSpec("end_of_input", TimeDomain.WATERMARK)

    def __init__(self, config: SamplerConfig) -> None:
        self._config = config
        self._counters = {name: beam.metrics.Metrics.counter(METRICS_NAMESPACE, name)
                          for name in _STREAMING_COUNTERS}

    def process(self, element: tuple[Any, tuple[float, float, float]],
                arrivals=beam.DoFn.StateParam(ARRIVALS), progress=beam.DoFn.StateParam(PROGRESS),
                deadline=beam.DoFn.TimerParam(DEADLINE), end=beam.DoFn.TimerParam(END)
                ) -> Iterator[beam_window.TimestampedValue]:
        key, (arr, gen, value) = element
        p = progress.read()
        if p is None:
            p = KeyProgress()
            end.set(beam_window.GlobalWindow().max_timestamp())
        logic = KeySampler(self._config, key)
        keep, counts = logic.ingest(p, gen, arr, value)
        if keep:
            arrivals.add((gen, arr, value))
        if logic.due(p):
            yield from self._poll(logic, p, arrivals, counts)
        self._arm(logic, p, deadline)
        progress.write(p)
        self._count(counts)

    @userstate.on_timer(DEADLINE)
    def on_deadline(self, key=beam.DoFn.KeyParam, arrivals=beam.DoFn.StateParam(ARRIVALS),
                    progress=beam.DoFn.StateParam(PROGRESS), deadline=beam.DoFn.TimerParam(DEADLINE)
                    ) -> Iterator[beam_window.TimestampedValue]:
        p = progress.read()
        if p is None:
            return  # the input ended
        logic = KeySampler(self._config, key)
        counts = collections.Counter()
        if logic.on_timer(p):
            yield from self._poll(logic, p, arrivals, counts)
        p.timer_at = None
        self._arm(logic, p, deadline)
        progress.write(p)
        self._count(counts)

    @userstate.on_timer(END)
    def on_end_of_input(self, key=beam.DoFn.KeyParam, arrivals=beam.DoFn.StateParam(ARRIVALS),
                        progress=beam.DoFn.StateParam(PROGRESS)
                        ) -> Iterator[beam_window.TimestampedValue]:
        p = progress.read()
        if p is None:
            return
        cols = _columns(arrivals)
        fresh, counts = KeySampler(self._config, key).flush(p, cols[:, 0], cols[:, 1], cols[:, 2])
        yield from _timestamped(fresh)
        arrivals.clear()
        progress.clear()
        self._count(counts)

    @staticmethod
    def _poll(logic: KeySampler, p: KeyProgress, arrivals: Any, counts: collections.Counter
              ) -> Iterator[beam_window.TimestampedValue]:
        cols = _columns(arrivals)
        fresh, keep, polled = logic.poll(p, cols[:, 0], cols[:, 1], cols[:, 2])
        counts.update(polled)
        if not keep.all():
            arrivals.clear()
            for row in cols[keep].tolist():
                arrivals.add(tuple(row))
        yield from _timestamped(fresh)

    @staticmethod
    def _arm(logic: KeySampler, p: KeyProgress, deadline: Any) -> None:
        # A stale timer may stay set when nothing is pending: it finds nothing due.
        micros = logic.timer(p)
        if micros is not None and micros != p.timer_at:
            deadline.set(Timestamp(micros=micros))
            p.timer_at = micros

    def _count(self, counts: collections.Counter) -> None:
        for name, n in counts.items():
            if n:
                self._counters[name].inc(n)


def _columns(arrivals: Any) -> np.ndarray:
    return np.array(list(arrivals.read()), dtype=np.float64).reshape(-1, 3)


def _timestamped(results: list[ApproximateResult]) -> Iterator[beam_window.TimestampedValue]:
    for result in results:
        # The last microsecond of the window: Rewindow puts it back in its window.
        yield beam_window.TimestampedValue(result, result.window_end - 1e-6)


__all__ = ["ApproximateResult", "ApproximateWindowAggregate"]
