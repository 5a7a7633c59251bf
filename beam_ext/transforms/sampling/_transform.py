"""ApproximateWindowAggregate: the Beam composite around the sampler replay."""
from __future__ import annotations

import math
from typing import Any, Iterator

import apache_beam as beam
import numpy as np
from apache_beam.transforms import window as beam_window

from beam_ext.transforms._fields import FieldSpec, field_getter
from beam_ext.transforms.sampling._sampler import (
    AGGREGATES,
    ApproximateResult,
    SamplerConfig,
    replay,
)

METRICS_NAMESPACE = "beam_ext.sampling"


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
        return (
            events
            | "Extract" >> beam.ParDo(_Extract(self._value, self._key, self._event_time,
                                               self._arrival_time))
            # History spans windows: one replay per key over the whole input.
            | "Unwindow" >> beam.WindowInto(beam_window.GlobalWindows())
            | "PerKey" >> beam.GroupByKey()
            | "Replay" >> beam.ParDo(_ReplayFn(config))
            | "Rewindow" >> beam.WindowInto(
                beam_window.FixedWindows(config.window, config.offset)))


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
        for result in outcome.results:
            # The last microsecond of the window: Rewindow puts it back in its window.
            yield beam_window.TimestampedValue(result, result.window_end - 1e-6)


__all__ = ["ApproximateResult", "ApproximateWindowAggregate"]
