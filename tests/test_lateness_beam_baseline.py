"""BeamGroupByKeyBaseline (Beam's own streaming GroupByKey) against our pane engine.

Both are driven like benchmarks/lateness.py: a few hundred events with
timestamps ``now - lognormal(0, 1) * size``, one watermark step per window.
They must emit the same panes, except where Beam's bundle semantics differ
from our engine's per-value semantics (see benchmarks/_lateness_beam_gbk.py):
windows whose first value arrives after the watermark passed their end.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict

import numpy as np
import pytest
from _lateness_beam_gbk import BeamGroupByKeyBaseline
from apache_beam.utils.windowed_value import PaneInfoTiming
from lateness import _Offsets

from beam_ext.transforms.lateness import FixedLateness
from beam_ext.transforms.lateness._backends import _MemoryBackend
from beam_ext.transforms.lateness._engine import _LateEngine

SIZE = 20.0
LATENESS = 4 * SIZE
STEPS, PER_STEP, KEYS = 20, 15, 3


def _stream(seed: int) -> list[tuple[list[tuple[bytes, tuple[float, float], bytes]], float]]:
    """Per watermark step: its events, then the watermark it advances to."""
    rng = np.random.default_rng(seed)
    steps, n = [], 0
    for step in range(STEPS):
        now = (step + 1) * SIZE
        ts = np.maximum(now - rng.lognormal(0.0, 1.0, PER_STEP) * SIZE, 0.0)
        who = rng.integers(0, KEYS, PER_STEP)
        events = []
        for t, k in zip(ts, who):
            start = math.floor(t / SIZE) * SIZE
            events.append((b"k%d" % k, (start, start + SIZE), b"v%03d" % n))
            n += 1
        steps.append((events, now))
    return steps


def _run(make, stream):
    out, dead = [], []

    def emit(key, window, values, pane):
        out.append((key, window, tuple(sorted(values)), pane.is_first, pane.is_last,
                    pane.timing, pane.index, pane.nonspeculative_index))

    engine = make(emit, lambda key, window, value: dead.append((key, window, value)))
    for events, watermark in stream:
        for key, window, value in events:
            engine.element(key, window, value)
        engine.advance_watermark(watermark)
    engine.advance_watermark(math.inf)
    engine.close()
    return out, dead


def _classify(stream):
    """(key, window) -> 'regular' | 'opened_late' | 'expired', and the values of its first step."""
    kind, first_values = {}, {}
    watermark = -math.inf
    for events, next_watermark in stream:
        opened = set()
        for key, window, value in events:
            kw = (key, window)
            if kw not in kind:
                kind[kw] = ("regular" if watermark < window[1] else
                            "opened_late" if watermark < window[1] + LATENESS else "expired")
                first_values[kw] = []
                opened.add(kw)
            if kw in opened:
                first_values[kw].append(value)
        watermark = next_watermark
    return kind, first_values


def _by_window(items):
    out = defaultdict(list)
    for item in items:
        out[(item[0], item[1])].append(item)
    return out


@pytest.mark.parametrize("seed", [0, 2, 4])
def test_beam_gbk_baseline_emits_the_engines_panes(seed):
    stream = _stream(seed)
    offsets = _Offsets(SIZE).late_firing_offsets(LATENESS)
    ours, ours_dead = _run(
        lambda emit, dead: _LateEngine(_Offsets(SIZE), FixedLateness(LATENESS),
                                       _MemoryBackend(), emit, dead), stream)
    beam, beam_dead = _run(
        lambda emit, dead: BeamGroupByKeyBaseline(SIZE, LATENESS, offsets, emit, dead), stream)
    kind, first_values = _classify(stream)
    ours_w, beam_w = _by_window(ours), _by_window(beam)
    ours_dw, beam_dw = _by_window(ours_dead), _by_window(beam_dead)

    regular = [kw for kw, k in kind.items() if k == "regular"]
    # Windows opened before the watermark passed their end: pane for pane the same
    # (values, is_first, is_last, timing, index), and the same dead letters.
    assert Counter(p for kw in regular for p in ours_w[kw]) == \
        Counter(p for kw in regular for p in beam_w[kw])
    assert sorted(d for kw in regular for d in ours_dw[kw]) == \
        sorted(d for kw in regular for d in beam_dw[kw])
    checked = [p for kw in regular for p in beam_w[kw]]
    assert len(checked) > 100
    assert any(p[4] for p in checked) and any(p[5] == PaneInfoTiming.LATE for p in checked)
    assert len(beam_dead) > 0

    for kw, k in kind.items():
        if k == "opened_late":
            # Its end-of-window timer is already due when its first value arrives.
            # Beam fires from process_elements with every value of the window in
            # that bundle and labels the pane LATE (maybe_ontime=False); our engine
            # fires an ON_TIME pane on the first value, then a late pane for the rest.
            o, b = ours_w[kw], beam_w[kw]
            assert o[0][2:] == ((first_values[kw][0],), True, False, PaneInfoTiming.ON_TIME, 0, 0)
            assert b[0][2:] == (tuple(sorted(first_values[kw])), True, False,
                                PaneInfoTiming.LATE, 0, 0)
            assert o[-1][2] == b[-1][2]  # same final contents
            assert sorted(ours_dw[kw]) == sorted(beam_dw[kw])
        elif k == "expired":
            # First value after end + allowed lateness: Beam drops every value of the
            # window; our engine (which only dead-letters windows it has purged)
            # fires an ON_TIME pane on the first value and purges the window at once.
            assert beam_w[kw] == []
            assert [d[2] for d in beam_dw[kw]] == \
                [v for key, w, v in (e for events, _ in stream for e in events) if (key, w) == kw]
            assert [p[2:] for p in ours_w[kw]] == \
                [((first_values[kw][0],), True, False, PaneInfoTiming.ON_TIME, 0, 0)]


def test_the_seeds_cover_every_kind_of_window():
    kinds = {k for seed in (0, 2, 4) for k in _classify(_stream(seed))[0].values()}
    assert kinds == {"regular", "opened_late", "expired"}
