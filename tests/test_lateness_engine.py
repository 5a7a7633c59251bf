"""The lateness pane engine: the injected clock."""
from __future__ import annotations

import pytest

from beam_ext.clock import ManualClock
from beam_ext.transforms.lateness import FixedLateness
from beam_ext.transforms.lateness._backends import _MemoryBackend
from beam_ext.transforms.lateness._engine import _LateEngine

SIZE = 10.0


class _Planned:
    """A scheduled trigger that learns nothing (as StalenessRefire's frozen plan)."""

    def __init__(self, offsets):
        self.offsets = list(offsets)

    def late_firing_offsets(self, allowed_lateness):
        return self.offsets


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
