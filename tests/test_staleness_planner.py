"""The staleness evaluator and planner against hand-computed values and brute force."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_ext.transforms.staleness import StalenessPlanner, max_staleness


def brute_staleness(offsets, arrivals, t):
    """Straight from the definition, one interval and one arrival at a time."""
    late = [a for a in arrivals if 0 < a <= t]
    if not late:
        return 0.0
    edges = [0.0, *offsets, t]
    worst = 0.0
    for lo, hi in zip(edges, edges[1:]):
        n = sum(1 for a in late if lo < a <= hi)
        worst = max(worst, (hi - lo) * n / (t * len(late)))
    return worst


def aion_greedy(arrivals, t, bound, grid=2000):
    """Aion's first step: walk time in small steps, execute where the bound breaks."""
    late = sorted(a for a in arrivals if 0 < a <= t)
    n_total = len(late)
    x, left = [], 0.0
    steps = np.linspace(0, t, grid + 1)[1:]
    prev = 0.0
    for s in steps:
        n = sum(1 for a in late if left < a <= s)
        if (s - left) * n / (t * n_total) > bound:
            if prev <= left:
                return None
            x.append(prev)
            left = prev
        prev = s
    return x


def test_hand_computed_examples():
    assert max_staleness([5.0], [1, 2, 6, 9], 10.0) == pytest.approx(0.25)
    # (0,2]: 2*2/40, (2,8]: 6*1/40, (8,10]: 2*1/40
    assert max_staleness([2.0, 8.0], [1, 2, 3, 9], 10.0) == pytest.approx(0.15)
    # Right-closed intervals: the arrival at 2 belongs to (0, 2].
    assert max_staleness([2.0], [2.0, 2.5], 10.0) == pytest.approx(8 * 1 / 20)
    # On-time (0) and too-late (> T) arrivals are in no interval and not in N.
    assert max_staleness([5.0], [0.0, 1, 2, 6, 9, 11], 10.0) == pytest.approx(0.25)
    # x_k = T leaves an empty last interval.
    assert max_staleness([10.0], [1, 9], 10.0) == pytest.approx(1.0)
    assert max_staleness([], [1, 9], 10.0) == pytest.approx(1.0)
    assert max_staleness([3.0], [], 10.0) == 0.0


@settings(max_examples=60, deadline=None, derandomize=True)
@given(arrivals=st.lists(st.floats(0, 12, allow_nan=False), max_size=30),
       cuts=st.lists(st.floats(0.01, 10, allow_nan=False), max_size=6, unique=True))
def test_evaluator_matches_brute_force(arrivals, cuts):
    x = sorted(cuts)
    assert max_staleness(x, arrivals, 10.0) == pytest.approx(brute_staleness(x, arrivals, 10.0),
                                                             abs=1e-12)


@pytest.mark.parametrize("call, message", [
    (lambda: max_staleness([1.0], [1.0], 0), "allowed_lateness"),
    (lambda: max_staleness([1.0], [1.0], -5), "allowed_lateness"),
    (lambda: max_staleness([1.0], [-1.0], 5), "arrivals"),
    (lambda: max_staleness([3.0, 2.0], [1.0], 5), "strictly increasing"),
    (lambda: max_staleness([6.0], [1.0], 5), "offsets"),
    (lambda: max_staleness([0.0], [1.0], 5), "offsets"),
    (lambda: StalenessPlanner([], 5), "history"),
    (lambda: StalenessPlanner([7.0], 5), "history"),
    (lambda: StalenessPlanner([-1.0, 2.0], 5), "history"),
    (lambda: StalenessPlanner([1.0], 0), "allowed_lateness"),
    (lambda: StalenessPlanner([1.0], 5).plan(0), "max_staleness"),
    (lambda: StalenessPlanner([1.0], 5).plan(1), "max_staleness"),
    (lambda: StalenessPlanner([1.0], 5).plan(-0.1), "max_staleness"),
    (lambda: StalenessPlanner([1.0], 5).plan_for_budget(0), "k"),
    (lambda: StalenessPlanner([1.0], 5).plan_for_budget(2.5), "k"),
])
def test_bad_arguments_name_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_plan_for_budget_returns_k_distinct_offsets_in_range():
    planner = StalenessPlanner([1.0, 1.0, 1.0], 10.0)
    for k in (1, 2, 7):
        x = planner.plan_for_budget(k)
        assert len(x) == k and all(0 < v <= 10 for v in x) and x == sorted(set(x))


def test_plan_for_budget_beats_uniform_on_skewed_history():
    rng = np.random.default_rng(3)
    history = rng.lognormal(0, 1, 5000)
    history = history[history <= 20]
    planner = StalenessPlanner(history, 20.0)
    even = [20.0 * j / 10 for j in range(1, 11)]
    assert planner.max_staleness(planner.plan_for_budget(10)) < 0.5 * planner.max_staleness(even)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(arrivals=st.lists(st.floats(0.01, 10, allow_nan=False), min_size=1, max_size=40),
       bound=st.floats(0.005, 0.9))
def test_plan_meets_its_bound_on_its_own_history(arrivals, bound):
    planner = StalenessPlanner(arrivals, 10.0)
    x = planner.plan(bound)
    assert max_staleness(x, arrivals, 10.0) <= bound


@settings(max_examples=40, deadline=None, derandomize=True)
@given(arrivals=st.lists(st.floats(0.01, 10, allow_nan=False), min_size=1, max_size=25),
       bound=st.floats(0.02, 0.6))
def test_budget_never_worse_than_aion_greedy(arrivals, bound):
    x = aion_greedy(arrivals, 10.0, bound, grid=500)
    if not x:
        return
    planner = StalenessPlanner(arrivals, 10.0)
    ours = planner.max_staleness(planner.plan_for_budget(len(x)))
    assert ours <= brute_staleness(x, arrivals, 10.0) + 1e-9


def _brute_min_max(arrivals, t, k):
    """Best max staleness over schedules drawn from arrivals, just before them, and a grid."""
    cands = set(np.linspace(0, t, 41)[1:])
    for a in arrivals:
        if 0 < a <= t:
            cands.add(a)
            cands.add(math.nextafter(a, -math.inf))
    cands = sorted(c for c in cands if 0 < c <= t)
    return min(brute_staleness(list(c), arrivals, t) for c in itertools.combinations(cands, k))


@settings(max_examples=25, deadline=None, derandomize=True)
@given(arrivals=st.lists(st.floats(0.05, 4, allow_nan=False), min_size=1, max_size=7),
       k=st.integers(1, 2))
def test_budget_matches_brute_force_on_tiny_inputs(arrivals, k):
    planner = StalenessPlanner(arrivals, 4.0)
    ours = planner.max_staleness(planner.plan_for_budget(k))
    assert ours <= _brute_min_max(arrivals, 4.0, k) + 1e-9


def test_budget_is_balanced_min_max_on_uniform_grid():
    # Arrivals at 1..10, T=10: one execution at 5 gives 5*5/100 on both sides.
    planner = StalenessPlanner(np.arange(1, 11, dtype=float), 10.0)
    x = planner.plan_for_budget(1)
    assert planner.max_staleness(x) == pytest.approx(0.25, rel=1e-9)


def test_plan_keeps_bound_on_fresh_windows():
    """The judging rule: >= 80% of fresh windows meet the bound, all within 1.1x."""
    rng = np.random.default_rng(11)
    t = 100.0

    def window(n):
        v = rng.lognormal(0, 1, 3 * n) * t / 22
        return v[v <= t][:n]

    planner = StalenessPlanner(np.concatenate([window(1000) for _ in range(10)]), t,
                               window_arrivals=1000)
    for bound in (0.1, 0.05, 0.01):
        x = planner.plan(bound)
        fresh = np.array([max_staleness(x, window(1000), t) for _ in range(100)])
        assert (fresh <= bound).mean() >= 0.8 and fresh.max() <= 1.1 * bound, bound
