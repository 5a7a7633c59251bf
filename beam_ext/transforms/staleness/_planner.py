"""The staleness evaluator and planner (Aion section 3.4); see ``staleness``."""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

from beam_ext.transforms.staleness._schedule import (
    Weight,
    _late_in_window,
    _validate_lateness,
    _validate_offsets,
    _validate_schedule,
    empirical_weight,
    greedy,
    interval_staleness,
    min_max,
    pad,
)

# Fresh windows assumed this large when the caller does not say (see the class docstring).
_DEFAULT_WINDOW_ARRIVALS = 1000
#: Fraction of fresh windows on which ``plan`` aims to meet its bound.
DEFAULT_CONFIDENCE = 0.9
#: Fraction of fresh windows that ``plan`` aims to keep within 1.1x its bound.
DEFAULT_CONFIDENCE_110 = 0.999


def max_staleness(offsets: Iterable[float], arrivals: Iterable[float],
                  allowed_lateness: float) -> float:
    """The maximum staleness of a schedule on one window's late arrivals.

    ``offsets`` are the execution times, strictly increasing in
    ``(0, allowed_lateness]`` (seconds after the window's end); ``arrivals``
    are the window's late-event offsets. With ``x_0 = 0`` and
    ``x_{k+1} = T``, interval j is ``(x_{j-1}, x_j]`` and its staleness is
    ``(x_j - x_{j-1}) * n_j / (T * N)``, ``n_j`` the arrivals in it and N the
    arrivals in (0, T]. Arrivals at offset 0 (on time) or beyond T (after the
    window closed) belong to no interval and are not counted. No arrivals
    gives 0. Cost O((N + k) log N).

    >>> max_staleness([5.0], [1.0, 2.0, 6.0, 9.0], allowed_lateness=10.0)
    0.25
    """
    t = _validate_lateness(allowed_lateness)
    x = _validate_schedule(list(offsets), t)
    late = _late_in_window(_validate_offsets(list(arrivals), "arrivals"), t)
    return float(interval_staleness(x, late, t).max())


def _wilson_upper(p: float, n: float, z: float) -> float:
    """Wilson score upper bound for a proportion ``p`` seen in ``n`` trials."""
    z2n = z * z / n
    centre = p + z2n / 2
    spread = z * math.sqrt(p * (1 - p) / n + z2n / (4 * n))
    return min(1.0, (centre + spread) / (1 + z2n))


class StalenessPlanner:
    """Plans late re-executions of a window from a history of late offsets.

    ``history``: late-arrival offsets observed on past windows (seconds
    after their window's end), array-like; values beyond
    ``allowed_lateness`` are ignored, offset 0 (on time) too.
    ``window_arrivals``: late arrivals expected in one fresh window; ``plan``
    sizes its safety margin with it. Default ``min(len(history), 1000)``:
    measured, it keeps the bound on >= 80 % of fresh windows (all within
    1.1x) down to ~500 arrivals per window and costs at most one extra
    execution when windows are far larger; pass the real figure when known.
    ``confidence``: the fraction of fresh windows on which ``plan`` should
    meet its bound.

    ``plan_for_budget(k)`` is the exact min-max schedule on the history.
    ``plan(bound)`` plans for fresh windows: each interval's share of the
    arrivals is replaced by a Wilson upper confidence bound (fresh-window
    and history sampling noise, Bonferroni over the intervals, at
    ``confidence`` for the bound and at 99.9 % for 1.1x the bound), then the
    fewest executions keeping every interval under it are found and
    re-balanced to the smallest such bound. Planning cost
    O(k log N log(1/tol)) after an O(N log N) sort: 30 executions over
    100,000 samples take tens of milliseconds.

    >>> import numpy as np
    >>> history = np.random.default_rng(0).lognormal(0, 1, 10_000)
    >>> planner = StalenessPlanner(history, allowed_lateness=20.0)
    >>> x = planner.plan(max_staleness=0.05)
    >>> max_staleness(x, history, 20.0) <= 0.05
    True
    >>> len(planner.plan_for_budget(5))
    5
    """

    def __init__(self, history: Iterable[float], allowed_lateness: float, *,
                 window_arrivals: float | None = None,
                 confidence: float = DEFAULT_CONFIDENCE) -> None:
        t = _validate_lateness(allowed_lateness)
        raw = _validate_offsets(list(history) if not isinstance(history, np.ndarray)
                                else history, "history")
        if raw.size == 0:
            raise ValueError("history must hold at least one late-arrival offset, got none")
        late = _late_in_window(raw, t)
        if late.size == 0:
            raise ValueError(f"history has no offset in (0, allowed_lateness={t}]: "
                             "nothing arrived late within the window's lifetime")
        if window_arrivals is not None and not window_arrivals >= 1:
            raise ValueError(f"window_arrivals must be >= 1, got {window_arrivals!r}")
        if not 0 < confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
        self._t = t
        self._late = late
        self._list: Sequence[float] = late.tolist()  # bisect on a list is faster than on numpy
        self._window_arrivals = float(window_arrivals or min(late.size, _DEFAULT_WINDOW_ARRIVALS))
        self._confidence = confidence

    @property
    def allowed_lateness(self) -> float:
        return self._t

    def max_staleness(self, offsets: Iterable[float]) -> float:
        """``max_staleness(offsets, history, allowed_lateness)``."""
        x = _validate_schedule(list(offsets), self._t)
        return float(interval_staleness(x, self._late, self._t).max())

    def plan_for_budget(self, k: int) -> list[float]:
        """``k`` offsets minimising the maximum staleness on the history.

        Exact (to 1e-12 relative) for the min-max problem, so no other
        schedule of k executions, Aion's greedy + gradient included, does
        better on the history.
        """
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        _, x = min_max(self._list, self._t, int(k), empirical_weight(len(self._list)))
        return pad(x, int(k), self._late, self._t)

    def plan(self, max_staleness: float) -> list[float]:
        """Fewest offsets whose maximum staleness stays <= ``max_staleness`` on fresh windows.

        Meets the bound on the history itself too (the margin only adds
        executions).
        """
        bound = self._check_bound(max_staleness)
        # The margin depends on the number of intervals (Bonferroni), which
        # depends on the plan: iterate to a fixed point (2-3 rounds).
        intervals, x = 1, None
        for _ in range(8):
            w = self._robust_weight(intervals, bound)
            x = greedy(self._list, self._t, bound, w)
            if x is None:
                raise ValueError(f"max_staleness={bound} is below what float resolution allows")
            if len(x) + 1 <= intervals:
                break
            intervals = len(x) + 1
        assert x is not None
        # Re-balance: same number of executions, every interval as far under the bound as possible.
        _, balanced = min_max(self._list, self._t, len(x), self._robust_weight(intervals, bound))
        return balanced

    @staticmethod
    def _check_bound(bound: float) -> float:
        try:
            b = float(bound)
        except (TypeError, ValueError):
            raise TypeError(f"max_staleness must be a number, got {bound!r}") from None
        if not 0 < b < 1:
            raise ValueError(
                f"max_staleness must be in (0, 1) (a fraction of T * N), got {bound!r}")
        return b

    def _robust_weight(self, intervals: int, bound: float) -> Weight:
        n_hist = len(self._list)
        n_eff = 1.0 / (1.0 / self._window_arrivals + 1.0 / n_hist)
        # SciPy costs a second of import in every Spark Python worker: load it on use.
        from scipy.stats import norm

        z = float(norm.isf((1 - self._confidence) / intervals))
        z110 = float(norm.isf((1 - DEFAULT_CONFIDENCE_110) / intervals))
        cache: dict[int, float] = {}

        def w(m: int) -> float:
            v = cache.get(m)
            if v is None:
                p = m / n_hist
                # Both must hold: upper share at z under the bound, and at z110 under 1.1x.
                v = max(_wilson_upper(p, n_eff, z), _wilson_upper(p, n_eff, z110) / 1.1, p)
                cache[m] = v
            return v

        return w
