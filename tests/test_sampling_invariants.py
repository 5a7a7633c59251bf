"""Randomized invariants of the sampler replay (hypothesis)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_ext.transforms.sampling import _estimators as est
from beam_ext.transforms.sampling._sampler import SamplerConfig, replay


@settings(max_examples=30, deadline=None, derandomize=True)
@given(
    n=st.integers(1, 2500),
    gap_shape=st.floats(0.3, 5.0),
    delay_mean=st.floats(0.0, 1.5),
    value_sigma=st.floats(0.0, 2.0),
    aggregate=st.sampled_from(["mean", "sum", "count"]),
    mode=st.sampled_from(["aion", "aion_minus", "aq_kslack", "exact"]),
    corrections=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_replay_invariants(n, gap_shape, delay_mean, value_sigma, aggregate, mode,
                           corrections, seed):
    rng = np.random.default_rng(seed)
    gen = np.cumsum(rng.gamma(gap_shape, 0.004 / gap_shape, n))
    arr = gen + rng.exponential(delay_mean, n) if delay_mean > 0 else gen.copy()
    vals = rng.lognormal(1.0, value_sigma, n)
    cfg = SamplerConfig(window=0.8, substream=0.2, aggregate=aggregate, history=4,
                        mode=mode, corrections=corrections, seed=seed)
    out = replay(gen, arr, vals, cfg)
    assert out.observed == n
    assert 0 <= out.sampled <= out.observed
    assert out.late <= out.stragglers_after_emission
    firsts = [r for r in out.results if not r.is_correction]
    assert len({r.window_start for r in firsts}) == len(firsts)
    for r in out.results:
        assert r.emitted_at >= r.window_end
        assert r.waited_for_stragglers == (r.emitted_at > r.window_end) or r.is_correction
        assert 0 <= r.sample_size <= r.population_estimate + 1e-9
        if r.sample_size or aggregate == "count":
            assert r.ci_low - 1e-9 <= r.estimate <= r.ci_high + 1e-9
        in_window = (gen >= r.window_start) & (gen < r.window_end)
        assert r.population_estimate >= (in_window & (arr <= r.emitted_at)).sum() - 1e-9
        if mode == "exact" or r.is_correction:
            assert r.sample_size == (in_window & (arr <= r.emitted_at)).sum()
    emitted = [r.emitted_at for r in out.results]
    assert emitted == sorted(emitted)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(target=st.floats(0.0, 1e5), arrived=st.floats(0.0, 1e6), sigmas=st.floats(0, 3))
def test_rates_are_in_unit_interval(target, arrived, sigmas):
    theta = est.substream_rate(target, arrived, sigmas)
    assert 0.0 <= theta <= 1.0
    assert (theta > 0.0) == (target > 0)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(error=st.floats(0.001, 0.99), sd=st.floats(0.0, 100.0), mean=st.floats(-50, 50),
       population=st.floats(1.0, 1e7))
def test_sample_size_never_exceeds_population(error, sd, mean, population):
    n = est.sample_size_mean(error, 1.96, sd, mean, population)
    assert 0.0 <= n <= population
    assert est.sample_size_chebyshev(error, 0.95, sd, mean, population) <= population
