"""Estimator formulas of thesis chapter 4 against hand-computed cases."""
from __future__ import annotations

import math

import numpy as np
import pytest

from beam_ext.transforms.sampling import _estimators as est


def test_z_value_matches_normal_table():
    assert est.z_value(0.95) == pytest.approx(1.959964, abs=1e-6)
    assert est.z_value(0.99) == pytest.approx(2.575829, abs=1e-6)


@pytest.mark.parametrize("bad", [0.0, 1.0, -0.1, 1.5])
def test_z_value_rejects_confidence_outside_unit_interval(bad):
    with pytest.raises(ValueError, match="confidence"):
        est.z_value(bad)


def test_history_mean_is_mean_of_substream_means():  # eq. 4.1
    assert est.history_mean(np.array([0.2, 0.3, 0.4])) == pytest.approx(0.3)
    with pytest.raises(ValueError):
        est.history_mean(np.array([]))


def test_substream_size_eq_4_2():
    assert est.substream_size(0.6, 0.002) == pytest.approx(300.0)
    assert est.substream_size(0.6, 0.0) == math.inf


def test_window_size_overestimates_by_two_sd_of_the_sum():
    # 5 sub-streams of 300 +- 10: sum 1500, sd of the sum 10*sqrt(5)
    assert est.window_size(300.0, 10.0, 5) == pytest.approx(1500 + 2 * 10 * math.sqrt(5))
    assert est.window_size(300.0, 10.0, 5, sigmas=0.0) == 1500.0


def test_sample_size_eq_4_4_by_hand():
    # z=2, sd=3, mean=10, r=0.1, N=100: n = 36 / (1 + 36/100) = 26.47...
    assert est.sample_size_mean(0.1, 2.0, 3.0, 10.0, 100.0) == pytest.approx(36 / 1.36)
    # infinite population: n0 = z^2 s^2 / (r mu)^2
    assert est.sample_size_mean(0.1, 2.0, 3.0, 10.0, math.inf) == pytest.approx(36.0)
    # never above the population, whole window when the mean is zero
    assert est.sample_size_mean(0.001, 2.0, 3.0, 10.0, 50.0) <= 50.0
    assert est.sample_size_mean(0.1, 2.0, 3.0, 0.0, 50.0) == 50.0
    # constant values: two events suffice
    assert est.sample_size_mean(0.1, 2.0, 0.0, 10.0, 50.0) == 2.0


def test_chebyshev_sample_size_is_larger_than_normal():
    # sd=3, mean=10, r=0.1, delta=0.05: n0 = 9 / (0.05 * 1) = 180; N=1000: 180/1.18
    assert est.sample_size_chebyshev(0.1, 0.95, 3.0, 10.0, 1000.0) == pytest.approx(180 / 1.18)
    assert (est.sample_size_chebyshev(0.1, 0.95, 3.0, 10.0, 1000.0)
            > est.sample_size_mean(0.1, est.z_value(0.95), 3.0, 10.0, 1000.0))


def test_arrived_by_deadline_eq_4_7():
    assert est.arrived_by_deadline(0.6, 0.15, 0.001) == pytest.approx(450.0)
    assert est.arrived_by_deadline(0.6, 0.9, 0.001) == 0.0


def test_substream_rate_eq_4_8_capped_at_one():
    assert est.substream_rate(90, 450.0, sigmas=0) == pytest.approx(0.2)
    assert est.substream_rate(81, 450.0) == pytest.approx((81 + 2 * 9) / 450)
    assert est.substream_rate(500, 450.0) == 1.0
    assert est.substream_rate(10, 0.0) == 1.0
    assert est.substream_rate(0, 450.0) == 0.0


def test_expected_missing_matches_brute_force_integral():
    delays = np.array([0.05, 0.2, 0.4, 0.9])
    rate, now, start, end = 500.0, 10.0, 9.0, 9.6
    # brute force: generation instants on a fine grid, count those not arrived
    t = np.linspace(start, end, 600_001)[:-1]
    not_arrived = (t[:, None] + delays[None, :] > now).mean(axis=1)
    brute = rate * not_arrived.mean() * (end - start)
    assert est.expected_missing(rate, delays, now, start, end) == pytest.approx(brute, rel=1e-3)
    assert est.expected_missing(rate, delays, now + 5.0, start, end) == 0.0


def test_mean_interval_finite_population_corrected():
    low, high = est.mean_interval(10.0, 2.0, 16, 64.0, 2.0)
    half = 2.0 * 2.0 / 4.0 * math.sqrt(1 - 16 / 64)
    assert (low, high) == pytest.approx((10 - half, 10 + half))
    assert est.mean_interval(10.0, 2.0, 64, 64.0, 2.0) == (10.0, 10.0)


def test_sum_interval_adds_straggler_uncertainty():
    estimate, low, high = est.sum_interval(2.0, 1.0, 25, 100.0, 4.0, 2.0)
    var = 100.0 ** 2 * 1.0 / 25 * (1 - 25 / 100) + 2.0 ** 2 * 4.0
    assert estimate == 200.0
    assert (low, high) == pytest.approx((200 - 2 * math.sqrt(var), 200 + 2 * math.sqrt(var)))


def test_count_interval_is_poisson_in_the_missing():
    assert est.count_interval(100.0, 9.0, 2.0) == (94.0, 106.0)
