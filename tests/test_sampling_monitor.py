"""Statistics monitor against numpy over the same events."""
from __future__ import annotations

import math

import numpy as np
import pytest

from beam_ext.transforms.sampling._monitor import (
    HistoryView,
    StatisticsMonitor,
    SubstreamStats,
)


def _substream(rng, index, n, f=0.6):
    gen = np.sort(rng.uniform(index * f, (index + 1) * f, n))
    arr = gen + rng.exponential(0.2, n)
    vals = rng.lognormal(0.5, 0.8, n)
    return gen, arr, vals


def test_substream_stats_match_numpy():
    rng = np.random.default_rng(1)
    gen, arr, vals = _substream(rng, 3, 500)
    shuffled = rng.permutation(500)
    s = SubstreamStats.of(3, gen[shuffled], arr[shuffled], vals[shuffled])
    assert s.count == 500
    assert s.gap_mean == pytest.approx(np.diff(gen).mean())
    assert s.delay_mean == pytest.approx((arr - gen).mean())
    assert s.value_mean == pytest.approx(vals.mean())
    assert s.value_m2 == pytest.approx(((vals - vals.mean()) ** 2).sum())
    assert len(s.delays) == 256
    assert np.quantile(arr - gen, 0.5) == pytest.approx(np.median(s.delays), rel=0.05)


def test_empty_and_single_event_substreams():
    one = SubstreamStats.of(0, np.array([0.1]), np.array([0.2]), np.array([5.0]))
    assert one.count == 1 and math.isnan(one.gap_mean)
    empty = SubstreamStats.of(1, np.empty(0), np.empty(0), np.empty(0))
    assert empty.count == 0
    assert HistoryView.of([empty], 0.6) is None
    view = HistoryView.of([one, empty], 0.6)
    assert view.mean_gap == pytest.approx(0.6 / 0.5)


def test_history_view_pools_values_and_averages_means():
    rng = np.random.default_rng(2)
    parts = [_substream(rng, i, n) for i, n in enumerate([120, 300, 45, 800])]
    stats = [SubstreamStats.of(i, *p) for i, p in enumerate(parts)]
    view = HistoryView.of(stats, 0.6)
    all_vals = np.concatenate([p[2] for p in parts])
    assert view.value_mean == pytest.approx(all_vals.mean())
    assert view.value_sd == pytest.approx(all_vals.std(ddof=1))
    # eq. 4.1: the mean of the per-sub-stream means
    assert view.mean_gap == pytest.approx(np.mean([np.diff(p[0]).mean() for p in parts]))
    assert view.mean_delay == pytest.approx(np.mean([(p[1] - p[0]).mean() for p in parts]))
    sizes = [0.6 / np.diff(p[0]).mean() for p in parts]
    assert view.size_sd == pytest.approx(np.std(sizes, ddof=1))


def test_monitor_views_last_m_settled_by_time():
    rng = np.random.default_rng(3)
    monitor = StatisticsMonitor(m=2, f=0.6)
    stats = [SubstreamStats.of(i, *_substream(rng, i, 50 * (i + 1))) for i in range(4)]
    for i, s in enumerate(stats):
        monitor.add(1.0 + i, s)
    assert monitor.view_at(0.5) is None
    assert monitor.view_at(1.0).substreams == 1
    view = monitor.view_at(3.5)  # settled: 0, 1, 2 -> last two are 1, 2
    expected = HistoryView.of(stats[1:3], 0.6)
    assert view.substreams == 2
    assert view.value_mean == pytest.approx(expected.value_mean)
    assert np.array_equal(view.delays, expected.delays)
    with pytest.raises(ValueError, match="settle order"):
        monitor.add(0.0, stats[0])
    with pytest.raises(ValueError, match="history"):
        StatisticsMonitor(m=0, f=0.6)
