"""Closed-form estimators of the straggler-free sampler (thesis chapter 4).

Every function is pure and cheap (O(1) unless stated); the sampler and the
benchmark baselines share them so a formula lives in exactly one place.
"""
from __future__ import annotations

import math

import numpy as np


def z_value(confidence: float) -> float:
    """Two-sided normal quantile ``z_{delta/2}`` for ``confidence = 1 - delta``.

    >>> round(z_value(0.95), 3)
    1.96
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    # SciPy costs a second of import in every Spark Python worker: load it on use.
    from scipy import stats

    return float(stats.norm.ppf(0.5 + confidence / 2.0))


def history_mean(means: np.ndarray) -> float:
    """Eq. 4.1: the expectation for the next sub-stream is the mean of the
    last ``m`` sub-stream means (the caller passes exactly those ``m``)."""
    if len(means) == 0:
        raise ValueError("history_mean needs at least one sub-stream")
    return float(np.mean(means))


def substream_size(f: float, mean_gap: float) -> float:
    """Eq. 4.2: expected events in a sub-stream of length ``f`` seconds,
    ``E[N_i] = f / E[g]``.

    >>> substream_size(0.6, 0.001)
    600.0
    """
    if mean_gap <= 0.0:
        return math.inf
    return f / mean_gap


def window_size(expected_substream: float, substream_sd: float, k: int,
                sigmas: float = 2.0) -> float:
    """Window size ``N^w`` over ``k`` sub-streams, over-estimated by
    ``sigmas`` standard deviations of the sum (the thesis uses two): an
    underestimate would shrink the sample below what the bound needs.

    >>> window_size(600.0, 10.0, 4)
    2440.0
    """
    return k * expected_substream + sigmas * substream_sd * math.sqrt(k)


def sample_size_mean(error: float, z: float, sd: float, mean: float,
                     population: float) -> float:
    """Eq. 4.4: smallest ``n^w`` with relative error of the sample mean
    within ``error`` at the confidence of ``z`` (finite-population corrected).

    ``n = z^2 s^2 / (r^2 mu^2 + z^2 s^2 / N)``; with a zero mean no relative
    bound is reachable by sampling, so the whole window is taken.

    >>> round(sample_size_mean(0.05, 1.96, 1.0, 1.0, math.inf), 2)
    1536.64
    """
    if population <= 0:
        return 0.0
    var_term = (z * sd) ** 2
    if var_term == 0.0:
        return min(2.0, population)
    denom = (error * mean) ** 2 + var_term / population
    if denom <= 0.0 or (error * mean) ** 2 == 0.0:
        return float(population)
    return min(var_term / denom, float(population))


def sample_size_chebyshev(error: float, confidence: float, sd: float,
                          mean: float, population: float) -> float:
    """Distribution-free sample size (Chebyshev), the conservative rule we
    use for the AQ-K-Slack baseline: ``P(|err| > r mu) <= s^2/(n r^2 mu^2)``,
    finite-population corrected."""
    if population <= 0:
        return 0.0
    delta = 1.0 - confidence
    if (error * mean) ** 2 == 0.0:
        return float(population)
    n0 = sd ** 2 / (delta * (error * mean) ** 2)
    return min(n0 / (1.0 + n0 / population), float(population))


def arrived_by_deadline(f: float, mean_delay: float, mean_gap: float) -> float:
    """Eq. 4.7: events of a sub-stream expected to have arrived by its
    deadline, ``((ddl_i - E[D]) - ddl_{i-1}) / E[G]`` with
    ``ddl_i - ddl_{i-1} = f``; never negative.

    >>> arrived_by_deadline(0.6, 0.24, 0.001)
    360.0
    """
    if mean_gap <= 0.0:
        return math.inf
    return max(0.0, (f - mean_delay) / mean_gap)


def substream_rate(target: float, arrived: float, sigmas: float = 2.0) -> float:
    """Eq. 4.8: Bernoulli rate ``theta_i = n_i / N_{i,t=ddl_i}``, capped at 1
    (above 1 the sampler takes everything and waits the least time needed).

    The target is raised by ``sigmas`` binomial standard deviations
    (``n + sigmas * sqrt(n)``) so the sample is complete at the deadline in
    most sub-streams instead of half of them; ``sigmas=0`` is eq. 4.8 as
    printed.

    >>> substream_rate(90, 450.0, sigmas=0)
    0.2
    """
    if target <= 0:
        return 0.0
    wanted = target + sigmas * math.sqrt(target)
    if arrived <= 0.0 or wanted >= arrived:
        return 1.0
    return wanted / arrived


def expected_missing(rate: float, delays: np.ndarray, now: float,
                     start: float, end: float) -> float:
    """Events generated in ``[start, end)`` not yet arrived at ``now``:
    ``rate * integral_{now-end}^{now-start} P(D > x) dx``, computed from the
    empirical delays as ``rate * (E[min(D, now-start)] - E[min(D, now-end)])``.
    Cost O(len(delays)).

    >>> expected_missing(1000.0, np.array([0.1, 0.3]), 1.0, 0.0, 1.0)
    200.0
    """
    if len(delays) == 0 or rate <= 0.0:
        return 0.0
    hi = max(now - start, 0.0)
    lo = max(now - end, 0.0)
    return float(rate * (np.minimum(delays, hi).mean() - np.minimum(delays, lo).mean()))


def mean_interval(sample_mean: float, sample_sd: float, n: int, population: float,
                  z: float) -> tuple[float, float]:
    """Confidence interval of a sample mean, finite-population corrected:
    ``x +- z s / sqrt(n) * sqrt(1 - n/N)``.

    >>> mean_interval(10.0, 2.0, 4, 4.0, 1.96)
    (10.0, 10.0)
    """
    if n <= 0:
        return (math.nan, math.nan)
    fpc = max(0.0, 1.0 - n / population) if population > 0 else 0.0
    half = z * sample_sd / math.sqrt(n) * math.sqrt(fpc)
    return (sample_mean - half, sample_mean + half)


def sum_interval(sample_mean: float, sample_sd: float, n: int, population: float,
                 missing: float, z: float) -> tuple[float, float, float]:
    """Eq. 4.5 sum estimate ``N * mean(s)`` and its interval: the sampling
    variance of the mean scaled by ``N^2`` plus the uncertainty of the
    stragglers still missing (Poisson: variance = expected count).

    Returns ``(estimate, low, high)``.
    """
    estimate = population * sample_mean
    if n <= 0:
        return (estimate, math.nan, math.nan)
    fpc = max(0.0, 1.0 - n / population) if population > 0 else 0.0
    var = population ** 2 * sample_sd ** 2 / n * fpc + sample_mean ** 2 * missing
    half = z * math.sqrt(var)
    return (estimate, estimate - half, estimate + half)


def count_interval(population: float, missing: float, z: float) -> tuple[float, float]:
    """Interval of a count made of exact arrivals plus ``missing`` expected
    stragglers (Poisson)."""
    half = z * math.sqrt(max(missing, 0.0))
    return (population - half, population + half)
