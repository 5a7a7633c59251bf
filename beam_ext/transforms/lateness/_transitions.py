"""Pane transitions of a late-data window: pure functions over a :class:`_PaneState`.

One :class:`_PaneState` per (key, window). Every execution path calls these
functions and nothing else to decide panes, so all paths emit the same panes
and count the same events: the Beam path (the stateful DoFns of
``_beam_panes``) keeps the state in Beam state and drives it from timers;
:class:`~beam_ext.transforms.lateness._engine._LateEngine` keeps it in a dict
and drives it from explicit watermark / processing-time advances (the
Spark-native path and the benchmark).

Event-time points are offsets after the window's end: the on-time pane fires
when the watermark reaches the window's max timestamp; late points at
``end + offset``; the last point is the allowed lateness ``T`` taken from the
cleanup policy when the on-time pane fires. Points between are the trigger's
firing offsets plus, when the cleanup policy or the trigger observes late
arrivals, observation ticks (every window length, at most ``_MAX_TICKS``) at
which late arrivals are reported to ``observe()`` with the point's offset, an
upper bound of their true arrival offset.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming

from beam_ext.transforms.lateness.triggers import (
    AfterLateDelay,
    CleanupPolicy,
    EveryNLateEvents,
    FixedLateness,
    LateTrigger,
)

_MAX_TICKS = 100
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


def _observes(cleanup: CleanupPolicy, trigger: LateTrigger) -> bool:
    """Whether anything learns from late arrivals (``FixedLateness.observe`` does nothing)."""
    return not isinstance(cleanup, FixedLateness) or hasattr(trigger, "observe")


def _schedule(lateness: float, size: float, trigger: LateTrigger,
              ticks: bool) -> list[tuple[float, bool]]:
    """The points after the window's end as (offset, fires), ascending.

    ``ticks``: add the observation ticks; they only report arrivals, so
    without an observer they would be timers that do nothing.
    """
    if lateness <= 0:
        return []
    points: dict[float, bool] = {}
    if ticks:
        step = max(size, lateness / _MAX_TICKS) if size > 0 else lateness
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
    """What to do with an arriving value: 'dead', 'buffer', 'late', 'fire' or 'delay'.

    The last three are for a late value (one counted as a late event).
    """
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
    st.points = _schedule(st.lateness, size, trigger, ticks=_observes(cleanup, trigger))
    last = not st.points
    pane = PaneInfo(True, last, PaneInfoTiming.ON_TIME, 0, 0)
    st.panes = 1
    if last:
        st.purged = True
        return pane, None
    return pane, st.points[0][0]


class _Point(NamedTuple):
    """What :func:`on_point` decided."""

    pane: PaneInfo | None  # the late pane to emit, if any
    next_offset: float | None  # of the next point; None: the window closed, purge it
    empty_firing: bool  # a firing point without late data since the previous pane


def on_point(st: _PaneState, cleanup: CleanupPolicy, trigger: LateTrigger) -> _Point:
    """Handle the next event-time point: the pane it fires, if any, and the next offset."""
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
    empty = fires and pane is None
    if final:
        st.purged = True
        return _Point(pane, None, empty)
    return _Point(pane, st.points[0][0], empty)


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
