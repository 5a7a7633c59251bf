"""The staleness benchmark's core functions on tiny sizes (not its timings)."""
from __future__ import annotations

import importlib.util
import pathlib
import sys

import numpy as np

_PATH = pathlib.Path(__file__).resolve().parent.parent / "benchmarks" / "staleness.py"
_spec = importlib.util.spec_from_file_location("staleness_benchmark", _PATH)
bench = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench  # dataclasses look their module up
_spec.loader.exec_module(bench)


def test_figure9_right_tiny():
    rows = bench.figure9_right(3, 10, 300, k_max=40, dists={"lnorm": bench._lnorm},
                               bounds=(0.05,))
    by = {r.method: r for r in rows}
    assert set(by) == {"planner", "deltat", "deltaev"}
    assert by["planner"].executions < by["deltat"].executions
    assert 0 <= by["planner"].fresh_meet <= 1


def test_figure9_left_tiny_is_monotone_for_the_planner():
    left = bench.figure9_left(2, 5, 300, k_max=4)
    assert list(left["k"]) == [1, 2, 3, 4]
    assert np.all(np.diff(left["planner"]) < 0)
    assert np.all(left["planner"] <= left["deltat"] + 1e-12)


def test_deltaev_fires_after_every_n_events():
    window = np.arange(1.0, 11.0)
    # 10 expected, 2 executions: after the 5th and the 10th event.
    assert bench.deltaev_staleness(window, 2, 10.0) == bench.schedule_staleness([5.0, 10.0],
                                                                                [window])[0]
