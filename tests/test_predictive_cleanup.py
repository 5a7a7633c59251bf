"""PredictiveCleanup: order-statistic bound against a sorted-list model and by simulation."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binom

from beam_ext.transforms.lateness import PredictiveCleanup


def model_bound(offsets, coverage, confidence, initial, min_history, size):
    """Brute force: scan ranks until the binomial tail reaches the confidence."""
    kept = sorted(offsets[-size:])
    n = len(kept)
    if n < min_history:
        return initial
    for r in range(1, n + 1):
        if binom.cdf(r - 1, n, coverage) >= confidence:
            return kept[r - 1]
    return initial


@settings(max_examples=40, deadline=None, derandomize=True)
@given(offsets=st.lists(st.floats(0, 1e4, allow_nan=False), max_size=120),
       coverage=st.sampled_from([0.5, 0.9, 0.99]),
       confidence=st.sampled_from([0.5, 0.9, 0.95]),
       size=st.integers(5, 60))
def test_matches_model_after_every_observation(offsets, coverage, confidence, size):
    c = PredictiveCleanup(coverage, confidence, initial_lateness=77.0, min_history=5,
                          history_size=size)
    seen = []
    for value in offsets:
        c.observe(value)
        seen.append(value)
        c._check()
        assert c.allowed_lateness() == model_bound(seen, coverage, confidence, 77.0, 5, size)


def test_initial_lateness_until_min_history():
    c = PredictiveCleanup(0.5, 0.5, initial_lateness=30.0, min_history=3)
    for value in (1.0, 2.0):
        c.observe(value)
        assert c.allowed_lateness() == 30.0
    c.observe(3.0)
    assert c.allowed_lateness() == 2.0


def test_too_few_offsets_for_the_confidence_keep_initial():
    # 0.99 ** 50 > 0.05: no order statistic of 50 offsets is a 95 % bound on the 99th percentile.
    c = PredictiveCleanup(0.99, 0.95, initial_lateness=500.0, min_history=10)
    for value in range(50):
        c.observe(float(value))
    assert c.allowed_lateness() == 500.0


@pytest.mark.parametrize("dist", ["exponential", "lognormal", "pareto"])
def test_coverage_by_simulation(dist):
    """The bound misses more than 1 - coverage of late events in at most 1 - confidence of runs."""
    rng = np.random.default_rng(42)
    coverage, confidence, n, reps = 0.95, 0.9, 400, 400
    draw = {"exponential": lambda size: rng.exponential(10, size),
            "lognormal": lambda size: rng.lognormal(1, 1, size),
            "pareto": lambda size: rng.pareto(1.5, size)}[dist]
    true_quantile = np.quantile(draw(2_000_000), coverage)
    covered = 0
    for _ in range(reps):
        c = PredictiveCleanup(coverage, confidence, initial_lateness=1e9, min_history=n,
                              history_size=n)
        for value in draw(n):
            c.observe(value)
        covered += c.allowed_lateness() >= true_quantile
    # Exact-binomial slack for 400 repetitions (3 sigma of 0.9*0.1/400).
    assert covered / reps >= confidence - 3 * np.sqrt(confidence * (1 - confidence) / reps)
    # ...and not trivially conservative.
    assert covered / reps <= 0.99


def test_sliding_history_follows_drift():
    c = PredictiveCleanup(0.9, 0.9, initial_lateness=1.0, min_history=50, history_size=200)
    for value in np.linspace(100, 200, 200):
        c.observe(value)
    high = c.allowed_lateness()
    for value in np.linspace(1, 2, 200):
        c.observe(value)
    assert high > 180 and c.allowed_lateness() < 2.0


def test_pickles_with_its_history():
    c = PredictiveCleanup(0.9, 0.9, initial_lateness=5.0, min_history=2)
    for value in (3.0, 1.0, 2.0):
        c.observe(value)
    clone = pickle.loads(pickle.dumps(c))
    clone._check()
    assert clone.allowed_lateness() == c.allowed_lateness() and len(clone) == 3


@pytest.mark.parametrize("kwargs, name", [
    ({"coverage": 1.0}, "coverage"), ({"coverage": 0.0}, "coverage"),
    ({"confidence": 1.5}, "confidence"), ({"initial_lateness": 0}, "initial_lateness"),
    ({"initial_lateness": float("inf")}, "initial_lateness"),
    ({"min_history": 0}, "min_history"), ({"min_history": 10, "history_size": 5}, "history_size"),
])
def test_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        PredictiveCleanup(**kwargs)


def test_bad_offsets():
    c = PredictiveCleanup()
    with pytest.raises(ValueError, match="offset"):
        c.observe(-1.0)
    with pytest.raises(ValueError, match="offset"):
        c.observe(float("nan"))
    with pytest.raises(TypeError, match="offset"):
        c.observe("late")
    assert len(c) == 0
