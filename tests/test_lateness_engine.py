"""The lateness pane transitions and engine: observation points and the injected clock."""
from __future__ import annotations

import pytest

from beam_ext.clock import ManualClock
from beam_ext.transforms.lateness import FixedLateness, PredictiveCleanup
from beam_ext.transforms.lateness import _transitions as transitions
from beam_ext.transforms.lateness._backends import _MemoryBackend
from beam_ext.transforms.lateness._engine import _LateEngine

SIZE = 10.0


class _Planned:
    """A scheduled trigger that learns nothing (as StalenessRefire's frozen plan)."""

    def __init__(self, offsets):
        self.offsets = list(offsets)

    def late_firing_offsets(self, allowed_lateness):
        return self.offsets


class _Learning(_Planned):
    def __init__(self, offsets):
        super().__init__(offsets)
        self.observed: list[float] = []

    def observe(self, offset):
        self.observed.append(offset)


def _points(cleanup, trigger):
    st = transitions._PaneState()
    transitions.on_time(st, cleanup, trigger, SIZE)
    return st.points


def test_observation_ticks_only_when_something_learns_from_them():
    # Nothing observes: only the planned firing and the close.
    assert _points(FixedLateness(30.0), _Planned([25.0])) == [(25.0, True), (30.0, True)]
    ticks = [(10.0, False), (20.0, False), (25.0, True), (30.0, True)]
    assert _points(FixedLateness(30.0), _Learning([25.0])) == ticks
    assert _points(PredictiveCleanup(initial_lateness=30.0), _Planned([25.0])) == ticks


def test_a_learning_trigger_is_told_of_late_arrivals_at_the_ticks():
    trigger = _Learning([25.0])
    engine = _LateEngine(trigger, FixedLateness(30.0), _MemoryBackend(),
                         lambda *pane: None, lambda *dead: None)
    engine.element(b"k", (0.0, SIZE), b"on time")
    engine.advance_watermark(SIZE)
    engine.element(b"k", (0.0, SIZE), b"late")
    engine.advance_watermark(21.0)  # the tick at offset 10 reports it
    assert trigger.observed == [10.0]


def test_engine_counts_late_events_and_firings_without_new_data():
    # What the Beam path's counters of the same names count (the Spark-native
    # path reports these): a firing point, ticks aside, with no late data
    # since the previous pane is a firing without new data.
    panes, dead = [], []
    engine = _LateEngine(_Learning([5.0, 20.0]), FixedLateness(30.0), _MemoryBackend(),
                         lambda key, w, values, pane: panes.append(list(values)),
                         lambda key, w, value: dead.append(value))
    engine.element(b"k", (0.0, SIZE), b"on time")
    engine.advance_watermark(SIZE)
    engine.element(b"k", (0.0, SIZE), b"late 1")
    engine.element(b"k", (0.0, SIZE), b"late 2")
    engine.advance_watermark(16.0)       # fires at 5 with both
    engine.advance_watermark(40.0)       # tick at 10, firings at 20 and 30: nothing new
    engine.element(b"k", (0.0, SIZE), b"dead")
    assert panes == [[b"on time"], [b"on time", b"late 1", b"late 2"]]
    assert dead == [b"dead"]
    assert (engine.late_events, engine.firings_without_new_data) == (2, 2)


class _Staging(_MemoryBackend):
    """Takes ``seconds`` to stage any window; records the pre-staging requests."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.prestaged: list[tuple[bytes, tuple[float, float], float | None]] = []

    def staging_seconds(self, key, window):
        return self.seconds

    def prestage(self, key, window, deadline=None):
        self.prestaged.append((key, window, deadline))


@pytest.mark.parametrize("wall_seconds_per_step,prestaged", [(1.0, True), (10.0, False)])
def test_the_injected_clock_times_the_watermark(wall_seconds_per_step, prestaged):
    # The window [0, 10) fires a late pane at 10 + 25 = 35. Staging takes 2 s;
    # the watermark moves 10 s of event time per step. Lead = one step + 2 s
    # converted at the watermark's speed: 10 + 20 = 30 at one step per wall
    # second (35 <= 20 + 30: pre-staged at 20), 10 + 2 = 12 at one step per
    # 10 wall seconds (35 > 20 + 12: not yet).
    clock = ManualClock(100.0)
    backend = _Staging(seconds=2.0)
    engine = _LateEngine(_Planned([25.0]), FixedLateness(30.0), backend,
                         lambda key, window, values, pane: list(values), lambda *dead: None,
                         clock=clock)
    engine.element(b"k", (0.0, SIZE), b"on time")
    engine.advance_watermark(SIZE)
    clock.advance(wall_seconds_per_step)
    engine.advance_watermark(2 * SIZE)
    assert backend.prestaged == ([(b"k", (0.0, SIZE), 35.0)] if prestaged else [])
