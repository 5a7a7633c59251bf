"""Statistics monitor: per-sub-stream workload statistics and the history
estimators over the last ``m`` settled sub-streams (thesis section 4.1.1).

A sub-stream's statistics are taken when it *settles*, i.e. when the K-slack
watermark (arrival clock minus the largest delay seen so far) passes its
end: earlier, its delays would be censored (only the fast events are in) and
the estimators would underestimate delays and stragglers.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

# Delay distributions are kept as this many quantiles per sub-stream, so
# memory does not grow with the event rate.
_DELAY_QUANTILES = 256


@dataclasses.dataclass(frozen=True)
class SubstreamStats:
    """What the monitor keeps of one settled sub-stream.

    ``gap_mean`` is the mean inter-event generation delay (nan with fewer
    than two events); ``delays`` is a compact sample of the network delays.
    """

    index: int
    count: int
    gap_mean: float
    delay_mean: float
    value_mean: float
    value_m2: float
    delays: np.ndarray

    @classmethod
    def of(cls, index: int, gen: np.ndarray, arrival: np.ndarray,
           values: np.ndarray) -> SubstreamStats:
        """Statistics of the events of sub-stream ``index`` (any order).

        The mean of consecutive generation gaps telescopes to
        ``(max - min) / (count - 1)``, so no sort is needed. Cost O(count).
        """
        count = len(gen)
        gap_mean = float((gen.max() - gen.min()) / (count - 1)) if count >= 2 else math.nan
        if count == 0:
            return cls(index, 0, math.nan, math.nan, math.nan, 0.0, np.empty(0))
        delays = arrival - gen
        if count > _DELAY_QUANTILES:
            kept = np.quantile(delays, (np.arange(_DELAY_QUANTILES) + 0.5) / _DELAY_QUANTILES)
        else:
            kept = np.sort(delays)
        value_mean = float(values.mean())
        return cls(index, count, gap_mean, float(delays.mean()), value_mean,
                   float(((values - value_mean) ** 2).sum()), kept)


@dataclasses.dataclass(frozen=True)
class HistoryView:
    """Estimators for the next sub-stream from the last ``m`` settled ones.

    ``mean_gap`` and ``mean_delay`` follow eq. 4.1 (mean of the sub-stream
    means); the value mean and standard deviation pool all history events
    (Chan's parallel formula), which is what eq. 4.4 needs for ``sigma``.
    ``size_sd`` is the spread of the eq. 4.2 sub-stream size estimates.
    """

    substreams: int
    mean_gap: float
    mean_delay: float
    value_mean: float
    value_sd: float
    size_sd: float
    delays: np.ndarray

    @classmethod
    def of(cls, history: list[SubstreamStats], f: float) -> HistoryView | None:
        with_events = [s for s in history if s.count > 0]
        if not with_events:
            return None
        gaps = np.array([s.gap_mean for s in with_events if not math.isnan(s.gap_mean)])
        # A history of single-event sub-streams still tells the rate.
        mean_gap = float(gaps.mean()) if len(gaps) else f / np.mean([s.count for s in history])
        sizes = np.array([f / s.gap_mean if not math.isnan(s.gap_mean) and s.gap_mean > 0
                          else float(s.count) for s in history])
        size_sd = float(sizes.std(ddof=1)) if len(sizes) >= 2 else 0.0
        n = 0
        mean = 0.0
        m2 = 0.0
        for s in with_events:
            delta = s.value_mean - mean
            total = n + s.count
            mean += delta * s.count / total
            m2 += s.value_m2 + delta ** 2 * n * s.count / total
            n = total
        value_sd = math.sqrt(m2 / (n - 1)) if n >= 2 else 0.0
        return cls(
            substreams=len(history),
            mean_gap=mean_gap,
            mean_delay=float(np.mean([s.delay_mean for s in with_events])),
            value_mean=mean,
            value_sd=value_sd,
            size_sd=size_sd,
            delays=np.concatenate([s.delays for s in with_events]),
        )


class StatisticsMonitor:
    """Settled sub-stream statistics in settle order, queried by time.

    ``add`` must be called in non-decreasing settle time; ``view_at(t)`` is
    the :class:`HistoryView` of the last ``m`` sub-streams settled by ``t``
    (None before any). Views are cached, so repeated queries cost O(log n).
    """

    def __init__(self, m: int, f: float) -> None:
        if m < 1:
            raise ValueError(f"history must be >= 1, got {m}")
        self._m = m
        self._f = f
        self._settled_at: list[float] = []
        self._stats: list[SubstreamStats] = []
        self._views: dict[int, HistoryView | None] = {}

    def add(self, settled_at: float, stats: SubstreamStats) -> None:
        if self._settled_at and settled_at < self._settled_at[-1]:
            raise ValueError("sub-streams must be added in settle order")
        self._settled_at.append(settled_at)
        self._stats.append(stats)

    def view_at(self, t: float) -> HistoryView | None:
        end = int(np.searchsorted(self._settled_at, t, side="right"))
        if end not in self._views:
            self._views[end] = HistoryView.of(self._stats[max(0, end - self._m):end], self._f)
        return self._views[end]
