"""An online driver of the sampler: events are added as they arrive and
panes come out as soon as the injected clock passes their emission time."""
from __future__ import annotations

from typing import Any

import numpy as np

from beam_ext.clock import Clock
from beam_ext.transforms.sampling._sampler import ApproximateResult, SamplerConfig, replay


class OnlineSampler:
    """Straggler-free sampling for one key, driven by a :class:`Clock`.

    A window's pane depends only on the events that arrived up to its
    emission time (sub-stream statistics, draws, deadlines and the K-slack
    fallback all look back, never ahead), so replaying the arrivals so far
    and releasing the panes with ``emitted_at <= clock.now()`` gives exactly
    the panes of a batch replay of the whole stream, at the moment they
    become safe. Cost: O(E log E) per :meth:`poll` for E events so far.

    >>> from beam_ext.clock import ManualClock
    >>> clock = ManualClock(0.0)
    >>> s = OnlineSampler(SamplerConfig(window=1.0, substream=0.5, history=2), clock)
    >>> for i in range(300):
    ...     clock.set(i / 100 + 0.05); s.add(i / 100, 1.0)
    >>> [r.window_start for r in s.poll()]
    [0.0, 1.0, 2.0]
    """

    def __init__(self, config: SamplerConfig, clock: Clock, key: Any = None) -> None:
        self._config = config
        self._clock = clock
        self._key = key
        self._gen: list[float] = []
        self._arr: list[float] = []
        self._val: list[float] = []
        self._released: set[tuple[float, bool]] = set()

    def add(self, event_time: float, value: float, arrival_time: float | None = None) -> None:
        """Ingest one event; its arrival time defaults to ``clock.now()``."""
        now = self._clock.now()
        arrival = now if arrival_time is None else float(arrival_time)
        if arrival > now:
            raise ValueError(f"arrival_time {arrival} is in the future (clock at {now})")
        if arrival < event_time:
            raise ValueError(f"arrival_time {arrival} is before event_time {event_time}")
        self._gen.append(float(event_time))
        self._arr.append(arrival)
        self._val.append(float(value))

    def poll(self) -> list[ApproximateResult]:
        """Panes that became safe to emit since the last poll."""
        now = self._clock.now()
        if not self._gen:
            return []
        outcome = replay(np.array(self._gen), np.array(self._arr), np.array(self._val),
                         self._config, key=self._key)
        fresh = []
        for result in outcome.results:
            ident = (result.window_start, result.is_correction)
            if result.emitted_at <= now and ident not in self._released:
                self._released.add(ident)
                fresh.append(result)
        return fresh
