"""StalenessTrigger: learning, replanning and the standard-trigger rendering."""
from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from apache_beam.transforms import trigger as beam_trigger

from beam_ext.transforms.staleness import StalenessPlanner, StalenessTrigger, max_staleness


def test_without_history_fires_evenly_at_the_uniform_optimum():
    trigger = StalenessTrigger(0.04, allowed_lateness=50.0)
    assert trigger.late_firing_offsets() == pytest.approx([10.0, 20.0, 30.0, 40.0, 50.0])
    # Uniform arrivals: each of the 5 intervals holds 1/5 over 1/5 of T.
    uniform = np.linspace(0.01, 50, 10_000)
    assert max_staleness(trigger.late_firing_offsets(), uniform, 50.0) == pytest.approx(0.04, rel=1e-3)


def test_learns_from_observations_and_matches_the_planner():
    rng = np.random.default_rng(5)
    offsets = rng.lognormal(0, 1, 3000) * 4
    trigger = StalenessTrigger(0.05, allowed_lateness=60.0)
    for i, value in enumerate(offsets):
        trigger.observe(value, window=i // 300)
    plan = trigger.late_firing_offsets()
    history = trigger.history()
    expected = StalenessPlanner(history[history <= 60], 60.0, window_arrivals=300).plan(0.05)
    assert plan == expected
    assert len(plan) < math.ceil(1 / math.sqrt(0.05))  # skewed arrivals need fewer firings
    assert max_staleness(plan, offsets, 60.0) <= 0.05


def test_keeps_only_the_latest_windows():
    trigger = StalenessTrigger(0.1, allowed_lateness=10.0, history_windows=2)
    for window, value in [(1, 1.0), (2, 2.0), (3, 3.0), (3, 4.0)]:
        trigger.observe(value, window=window)
    assert sorted(trigger.history()) == [2.0, 3.0, 4.0]


def test_replans_when_history_grows_or_lateness_changes():
    trigger = StalenessTrigger(0.1, allowed_lateness=10.0, history=np.full(1000, 9.5))
    first = trigger.late_firing_offsets()
    for _ in range(10):  # 1 % growth: the cached plan stays
        trigger.observe(0.5)
    assert trigger.late_firing_offsets() == first
    for _ in range(200):
        trigger.observe(0.5)
    assert trigger.late_firing_offsets() != first
    assert trigger.late_firing_offsets(20.0)[-1] <= 20.0


def test_per_window_history_sets_the_margin():
    windows = [np.random.default_rng(i).uniform(0, 10, 50).tolist() for i in range(5)]
    small = StalenessTrigger(0.05, allowed_lateness=10.0, history=windows)
    large = StalenessTrigger(0.05, allowed_lateness=10.0, history=windows, window_arrivals=10_000)
    # 50 arrivals per window are noisy: the plan needs more firings for the same bound.
    assert len(small.late_firing_offsets()) > len(large.late_firing_offsets())


def test_to_beam_trigger_is_count_driven_with_the_same_number_of_firings():
    windows = [[1.0] * 90 + [50.0] * 10] * 3
    trigger = StalenessTrigger(0.1, allowed_lateness=60.0, history=windows)
    rendered = trigger.to_beam_trigger()
    assert isinstance(rendered, beam_trigger.AfterWatermark)
    late = rendered.late
    assert isinstance(late, beam_trigger.Repeatedly)
    n = len(trigger.late_firing_offsets())
    assert late.underlying.count == round(100 / (n + 1))


def test_pickles_with_history_and_plan():
    trigger = StalenessTrigger(0.1, allowed_lateness=10.0, history=[1.0, 2.0, 3.0])
    plan = trigger.late_firing_offsets()
    clone = pickle.loads(pickle.dumps(trigger))
    assert clone.late_firing_offsets() == plan


@pytest.mark.parametrize("kwargs, error, name", [
    ({"max_staleness": 0}, ValueError, "max_staleness"),
    ({"max_staleness": 1.0}, ValueError, "max_staleness"),
    ({"max_staleness": 0.1, "allowed_lateness": 0}, ValueError, "allowed_lateness"),
    ({"max_staleness": 0.1, "history_windows": 0}, ValueError, "history_windows"),
    ({"max_staleness": 0.1, "history": [1.0, -2.0]}, ValueError, "history"),
    ({"max_staleness": 0.1, "history": [[1.0], [-2.0]]}, ValueError, r"history\[1\]"),
])
def test_bad_arguments(kwargs, error, name):
    with pytest.raises(error, match=name):
        StalenessTrigger(**kwargs)


def test_bad_calls():
    trigger = StalenessTrigger(0.1)
    with pytest.raises(ValueError, match="allowed_lateness"):
        trigger.late_firing_offsets()
    with pytest.raises(ValueError, match="allowed_lateness"):
        trigger.late_firing_offsets(-1.0)
    with pytest.raises(ValueError, match="offset"):
        trigger.observe(-3.0)
