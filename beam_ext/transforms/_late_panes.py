"""The pane logic of LateWindowedGroupByKey, shared by every execution path.

One :class:`_PaneState` per (key, window). The Beam path keeps it in Beam
state and drives it from timers; :class:`_LateEngine` keeps it in a dict and
drives it from explicit watermark / processing-time advances (the Spark-native
path and the benchmark). Both call the same functions below, so they emit the
same panes.

Event-time points are offsets after the window's end: the on-time pane fires
when the watermark reaches the window's max timestamp; late points at
``end + offset``; the last point is the allowed lateness ``T`` taken from the
cleanup policy when the on-time pane fires. Points between are the trigger's
firing offsets plus observation ticks (every window length, at most
``_MAX_TICKS``) at which late arrivals are reported to ``observe()`` with the
point's offset, an upper bound of their true arrival offset.
"""
from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming

from beam_ext.transforms.late_triggers import (
    AfterLateDelay,
    CleanupPolicy,
    EveryNLateEvents,
    LateTrigger,
)

_MAX_TICKS = 100
_MAX_LEAD_STEPS = 3  # pre-stage at most this many watermark steps beyond the next
_EPS = 1e-6  # Beam's window max timestamp is end - 1 microsecond


@dataclass
class _PaneState:
    on_time_fired: bool = False
    panes: int = 0
    late_since_pane: int = 0
    unobserved: int = 0
    lateness: float = 0.0
    points: list[tuple[float, bool]] = field(default_factory=list)  # (offset, fires), ascending
    purged: bool = False
    delay_pending: bool = False


def _schedule(lateness: float, size: float, trigger: LateTrigger) -> list[tuple[float, bool]]:
    if lateness <= 0:
        return []
    step = max(size, lateness / _MAX_TICKS) if size > 0 else lateness
    points: dict[float, bool] = {}
    k = 1
    while k * step < lateness:
        points[k * step] = False
        k += 1
    if hasattr(trigger, "late_firing_offsets"):
        for off in trigger.late_firing_offsets(lateness):  # type: ignore[union-attr]
            off = float(off)
            if 0 < off < lateness:
                points[off] = True
    points[lateness] = True
    return sorted(points.items())


def _late_pane(st: _PaneState, is_last: bool) -> PaneInfo:
    # No early panes: the on-time pane is index 0 and every later pane is
    # non-speculative, so index == nonspeculative_index.
    pane = PaneInfo(False, is_last, PaneInfoTiming.LATE, st.panes, st.panes)
    st.panes += 1
    st.late_since_pane = 0
    st.delay_pending = False
    return pane


def on_element(st: _PaneState, trigger: LateTrigger) -> str:
    """What to do with an arriving value: 'dead', 'buffer', 'late', 'fire' or 'delay'."""
    if st.purged:
        return "dead"
    if not st.on_time_fired:
        return "buffer"
    st.late_since_pane += 1
    st.unobserved += 1
    if isinstance(trigger, EveryNLateEvents) and st.late_since_pane >= trigger.n:
        return "fire"
    if isinstance(trigger, AfterLateDelay) and not st.delay_pending:
        st.delay_pending = True
        return "delay"
    return "late"


def fire_now(st: _PaneState) -> PaneInfo:
    """The pane for an event-driven firing ('fire' from :func:`on_element`)."""
    return _late_pane(st, is_last=False)


def on_time(st: _PaneState, cleanup: CleanupPolicy, trigger: LateTrigger,
            size: float) -> tuple[PaneInfo, float | None]:
    """Fire the on-time pane; returns it and the next event-time offset (None: purge now)."""
    st.on_time_fired = True
    st.lateness = max(0.0, float(cleanup.allowed_lateness()))
    st.points = _schedule(st.lateness, size, trigger)
    last = not st.points
    pane = PaneInfo(True, last, PaneInfoTiming.ON_TIME, 0, 0)
    st.panes = 1
    if last:
        st.purged = True
        return pane, None
    return pane, st.points[0][0]


def on_point(st: _PaneState, cleanup: CleanupPolicy,
             trigger: LateTrigger) -> tuple[PaneInfo | None, float | None]:
    """Handle the next event-time point; returns a pane or None, and the next offset.

    A returned next offset of None means the window is closed: purge it.
    """
    offset, fires = st.points.pop(0)
    observe = getattr(trigger, "observe", None)
    for _ in range(st.unobserved):
        cleanup.observe(offset)
        if observe is not None:
            observe(offset)
    st.unobserved = 0
    final = not st.points
    pane = None
    if fires and st.late_since_pane > 0:
        pane = _late_pane(st, is_last=final)
    if final:
        st.purged = True
        return pane, None
    return pane, st.points[0][0]


def on_delay(st: _PaneState) -> PaneInfo | None:
    """The processing-time delay of :class:`AfterLateDelay` expired."""
    st.delay_pending = False
    if st.purged or st.late_since_pane == 0:
        return None
    return _late_pane(st, is_last=False)


def _next_firing(st: _PaneState, window: tuple[float, float]) -> float | None:
    """Event time of the next point that may fire a pane (skipping observation ticks)."""
    for offset, fires in st.points:
        if fires:
            return window[1] + offset
    return None


# --------------------------------------------------------------------------- engine

Window = tuple[float, float]
Output = tuple[bytes, Window, Iterator[bytes], PaneInfo]


class _MemoryBackend:
    """Everything in a dict: the in-memory baseline of the benchmark."""

    def __init__(self) -> None:
        self._data: dict[tuple[bytes, Window], list[bytes]] = {}

    def add(self, key: bytes, window: Window, value: bytes) -> None:
        try:
            self._data[key, window].append(value)
        except KeyError:
            self._data[key, window] = [value]

    def read(self, key: bytes, window: Window) -> Iterator[bytes]:
        return iter(list(self._data.get((key, window), ())))

    def expire(self, key: bytes, window: Window) -> None:
        pass

    def flush(self) -> None:
        pass

    def prestage(self, key: bytes, window: Window, deadline: float | None = None) -> None:
        pass

    def release(self, key: bytes, window: Window) -> None:
        pass

    def purge(self, key: bytes, window: Window) -> None:
        self._data.pop((key, window), None)

    def close(self) -> None:
        self._data.clear()


class _SpillBackend:
    """Window values in a :class:`~beam_ext.state.SpillStore` (Aion's standard policy).

    Appends collect in per-window lists before they reach the store, which
    takes a lock and accounts bytes per call: the store sees them every
    ``_FLUSH_VALUES`` values and at every watermark advance. Every other
    operation on a window hands over its list first, so the store always sees
    values in order.
    """

    _FLUSH_VALUES = 1024  # bounds the values held outside the store's accounting

    def __init__(self, store: Any) -> None:
        self.store = store
        self._handles: dict[tuple[bytes, Window], Any] = {}
        self._pending: dict[tuple[bytes, Window], list[bytes]] = {}
        self._room = self._FLUSH_VALUES  # a countdown is the cheapest per-value check

    def _w(self, key: bytes, window: Window) -> Any:
        kw = (key, window)
        h = self._handles.get(kw)
        if h is None:
            h = self._handles[kw] = self.store.window(key, window)
        pending = self._pending.pop(kw, None)
        if pending:
            h._extend(pending)
        return h

    def add(self, key: bytes, window: Window, value: bytes) -> None:
        try:
            self._pending[key, window].append(value)
        except KeyError:
            self._pending[key, window] = [value]
        self._room -= 1
        if not self._room:
            self.flush()

    def flush(self) -> None:
        for kw in list(self._pending):
            self._w(*kw)
        self._room = self._FLUSH_VALUES

    def read(self, key: bytes, window: Window) -> Iterator[bytes]:
        return self._w(key, window).iter()

    def expire(self, key: bytes, window: Window) -> None:
        self._w(key, window).expire()

    def prestage(self, key: bytes, window: Window, deadline: float | None = None) -> None:
        self._w(key, window).prestage(deadline)

    def release(self, key: bytes, window: Window) -> None:
        self._w(key, window).release()

    def staging_seconds(self, key: bytes, window: Window) -> float:
        return self._w(key, window).staging_seconds()

    def purge(self, key: bytes, window: Window) -> None:
        self._w(key, window).purge()
        del self._handles[(key, window)]

    def close(self) -> None:
        self.flush()
        self.store.close()


class _LateEngine:
    """Drives the pane logic for many (key, window)s from explicit time advances.

    ``element()`` takes encoded key and value; ``advance_watermark(w)`` fires
    event-time points in time order; ``advance_processing_time(t)`` fires
    :class:`AfterLateDelay` timers. Panes go to ``emit(key, window, values,
    pane)``, values after a window was purged to ``dead(key, window, value)``.
    ``values`` is a lazy iterator (Aion's lazy iteration: a spilled window
    streams in as it is staged) that ``emit`` must consume before returning.
    """

    def __init__(self, trigger: LateTrigger, cleanup: CleanupPolicy, backend: Any,
                 emit: Callable[[bytes, Window, Iterator[bytes], PaneInfo], None],
                 dead: Callable[[bytes, Window, bytes], None], prestage: bool = True) -> None:
        self._trigger = trigger
        self._cleanup = cleanup
        self._backend = backend
        self._emit = emit
        self._dead = dead
        self._prestage = prestage
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
        elif action == "fire":
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
        now = time.perf_counter()
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
                fires = bool(st.points) and st.points[0][1]
                pane, nxt = on_point(st, self._cleanup, self._trigger)
                if pane is not None:
                    self._fire(kw, pane)
                elif fires and nxt is not None:
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
