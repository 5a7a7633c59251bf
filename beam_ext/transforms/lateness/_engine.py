"""The late-pane engine: many (key, window)s driven from explicit time advances.

The Spark-native path of ``LateWindowedGroupByKey`` and the lateness
benchmark run the pane transitions through this engine, with the window
values in a backend (``_backends``) and the timers in heaps.
"""
from __future__ import annotations

import heapq
import itertools
from typing import Callable, Iterator

from apache_beam.utils.windowed_value import PaneInfo

from beam_ext.clock import Clock, SystemClock
from beam_ext.transforms.lateness._backends import Window, _Backend
from beam_ext.transforms.lateness._transitions import (
    _EPS,
    _next_firing,
    _PaneState,
    fire_now,
    on_delay,
    on_element,
    on_point,
    on_time,
)
from beam_ext.transforms.lateness.triggers import CleanupPolicy, EveryNLateEvents, LateTrigger

_MAX_LEAD_STEPS = 3  # pre-stage at most this many watermark steps beyond the next


class _LateEngine:
    """Drives the pane logic for many (key, window)s from explicit time advances.

    ``element()`` takes encoded key and value; ``advance_watermark(w)`` fires
    event-time points in time order; ``advance_processing_time(t)`` fires
    :class:`AfterLateDelay` timers. Panes go to ``emit(key, window, values,
    pane)``, values after a window was purged to ``dead(key, window, value)``.
    ``values`` is a lazy iterator (Aion's lazy iteration: a spilled window
    streams in as it is staged) that ``emit`` must consume before returning.

    ``clock`` (default: the system's) times the watermark advances; their
    speed converts the backend's staging time into event time (:meth:`_lead`).

    ``late_events`` and ``firings_without_new_data`` count what the Beam
    path's counters of those names count.
    """

    def __init__(self, trigger: LateTrigger, cleanup: CleanupPolicy, backend: _Backend,
                 emit: Callable[[bytes, Window, Iterator[bytes], PaneInfo], None],
                 dead: Callable[[bytes, Window, bytes], None], prestage: bool = True,
                 clock: Clock | None = None) -> None:
        self._trigger = trigger
        self._cleanup = cleanup
        self._backend = backend
        self._emit = emit
        self._dead = dead
        self._prestage = prestage
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._states: dict[tuple[bytes, Window], _PaneState] = {}
        self._timers: list[tuple[float, int, bytes, Window]] = []  # event time
        self._delays: list[tuple[float, int, bytes, Window]] = []  # processing time
        self._next: dict[tuple[bytes, Window], float] = {}  # pending event-time timer
        self._seq = itertools.count()
        self._watermark = float("-inf")
        self._step = 0.0  # event time between the last two watermarks
        self._speed = 0.0  # event seconds per wall-clock second, smoothed
        self._advanced_at = 0.0
        self._now = 0.0
        self.late_events = 0
        self.firings_without_new_data = 0

    def element(self, key: bytes, window: Window, value: bytes) -> None:
        kw = (key, window)
        st = self._states.get(kw)
        if st is None:
            st = self._states[kw] = _PaneState()
        action = on_element(st, self._trigger)
        if action == "dead":
            self._dead(key, window, value)
            return
        self._backend.add(key, window, value)
        if action == "buffer":
            if kw not in self._next:
                self._set_timer(kw, window[1] - _EPS)
                if self._watermark >= window[1] - _EPS:
                    # Already behind the watermark: fires at once, as a Beam
                    # timer set behind the watermark fires after the bundle.
                    self._fire_due()
            return
        self.late_events += 1
        if action == "fire":
            self._fire(kw, fire_now(st))
        elif action == "delay":
            heapq.heappush(self._delays, (self._now + self._trigger.seconds, next(self._seq), *kw))  # type: ignore[union-attr]
            if self._prestage:
                self._backend.prestage(key, window)
        elif action == "late" and self._prestage and st.late_since_pane == 1:
            if isinstance(self._trigger, EveryNLateEvents):
                # Event-driven firing: a late event announces the re-execution.
                self._backend.prestage(key, window)
            else:
                nxt = _next_firing(st, window)
                if nxt is not None and nxt <= self._watermark + self._lead(kw):
                    self._backend.prestage(key, window)

    def _set_timer(self, kw: tuple[bytes, Window], t: float) -> None:
        self._next[kw] = t
        heapq.heappush(self._timers, (t, next(self._seq), *kw))

    def _fire(self, kw: tuple[bytes, Window], pane: PaneInfo) -> None:
        self._emit(kw[0], kw[1], self._backend.read(*kw), pane)

    def advance_watermark(self, watermark: float) -> None:
        for _ in self.advancing_watermark(watermark):
            pass

    def advancing_watermark(self, watermark: float) -> Iterator[None]:
        """:meth:`advance_watermark`, pausing after each timer it handles, so
        a caller can pass each timer's panes on before the next fire."""
        if watermark < self._watermark:
            raise ValueError(f"watermark cannot go back from {self._watermark} to {watermark}")
        now = self._clock.now()
        if self._watermark != float("-inf") and watermark != float("inf"):
            self._step = watermark - self._watermark
            speed = self._step / max(now - self._advanced_at, 1e-6)
            self._speed = speed if self._speed == 0.0 else 0.7 * self._speed + 0.3 * speed
        self._advanced_at = now
        self._watermark = watermark
        self._backend.flush()  # batched appends reach the store once per watermark step
        yield from self._firing_due()
        if self._prestage and hasattr(self._trigger, "late_firing_offsets"):
            self._prestage_upcoming()

    def _fire_due(self) -> None:
        for _ in self._firing_due():
            pass

    def _firing_due(self) -> Iterator[None]:
        watermark = self._watermark
        while self._timers and self._timers[0][0] <= watermark:
            t, _, key, window = heapq.heappop(self._timers)
            kw = (key, window)
            if self._next.get(kw) != t:
                continue
            del self._next[kw]
            st = self._states[kw]
            if not st.on_time_fired:
                pane, nxt = on_time(st, self._cleanup, self._trigger, window[1] - window[0])
                self._fire(kw, pane)
                self._backend.expire(key, window)
            else:
                pane, nxt, empty = on_point(st, self._cleanup, self._trigger)
                if pane is not None:
                    self._fire(kw, pane)
                elif empty:
                    self.firings_without_new_data += 1
                    if nxt is not None:
                        # Pre-staged for a firing that found no late data.
                        self._backend.release(key, window)
            if nxt is None:
                self._backend.purge(key, window)
            else:
                self._set_timer(kw, window[1] + nxt)
            yield

    def _prestage_upcoming(self) -> None:
        # Aion's periodic-watermark case: stage every window that will fire
        # before the watermark passes now + lead, whether or not late data
        # has arrived yet (it often arrives just before the firing, too late
        # to stage then). On-time firings count too: the global policy may
        # have destaged a window before its end.
        horizon_step = self._watermark + self._step
        due = []
        for t, _, key, window in self._timers:
            kw = (key, window)
            if self._next.get(kw) != t:
                continue
            st = self._states[kw]
            if st.purged:
                continue
            nxt = _next_firing(st, window) if st.on_time_fired else t
            if nxt is not None and (nxt <= horizon_step
                                    or nxt <= self._watermark + self._lead(kw)):
                due.append((nxt, kw))
        due.sort()  # the store admits requests greedily: earliest firings first
        for nxt, (key, window) in due:
            self._backend.prestage(key, window, nxt)

    def _lead(self, kw: tuple[bytes, Window]) -> float:
        """How far ahead of a firing, in event time, to pre-stage (Aion's Δt rule).

        The next watermark step (firings are only decided at watermark
        advances), plus the measured staging time Δt, backlog included,
        converted to event time at the watermark's recent speed.
        """
        stage = getattr(self._backend, "staging_seconds", None)
        if stage is None:
            return self._step
        # Capped: requests queue in firing order anyway, and a long backlog
        # would otherwise plan ever further ahead.
        return self._step + min(stage(*kw) * self._speed, _MAX_LEAD_STEPS * self._step)

    def advance_processing_time(self, now: float) -> None:
        self._now = max(self._now, now)
        while self._delays and self._delays[0][0] <= self._now:
            _, _, key, window = heapq.heappop(self._delays)
            st = self._states.get((key, window))
            if st is None:
                continue
            pane = on_delay(st)
            if pane is not None:
                self._fire((key, window), pane)

    def close(self) -> None:
        self._backend.close()
