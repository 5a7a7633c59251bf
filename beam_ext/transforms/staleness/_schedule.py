"""Schedule arithmetic behind the staleness planner (Aion section 3.4).

A schedule ``0 < x_1 < ... < x_k <= T`` cuts (0, T] into the intervals
``(x_{j-1}, x_j]`` with ``x_0 = 0`` and ``x_{k+1} = T``. Interval j costs
``(x_j - x_{j-1}) / T * w(n_j)`` where ``n_j`` counts the history offsets in
it and ``w`` is a non-decreasing weight: ``w(n) = n / N`` is Aion's staleness,
a confidence upper bound on ``n / N`` plans for fresh windows.

Why greedy + bisection is optimal: an interval's cost never grows when the
interval shrinks (shorter and holding no more arrivals). So for a bound B, the
schedule that stretches each interval as far as B allows has, by induction,
its j-th execution at or after the j-th execution of any schedule meeting B;
it therefore uses the fewest executions. The fewest executions is a
non-increasing step function of B, so bisection on B finds the smallest bound
reachable with k executions: the min-max schedule.
"""
from __future__ import annotations

import bisect
import math
from typing import Callable, Sequence

import numpy as np

Weight = Callable[[int], float]

# The bisection stops when the bound is known to this relative precision;
# far below any difference that matters on fresh data.
_REL_TOL = 1e-12


def _validate_lateness(allowed_lateness: float) -> float:
    try:
        t = float(allowed_lateness)
    except (TypeError, ValueError):
        raise TypeError(
            f"allowed_lateness must be a number of seconds, got {allowed_lateness!r}") from None
    if not math.isfinite(t) or t <= 0:
        raise ValueError(f"allowed_lateness must be a finite number > 0, got {allowed_lateness!r}")
    return t


def _validate_offsets(values: object, name: str) -> np.ndarray:
    """A float array of offsets; NaN or negative values are errors naming ``name``."""
    try:
        arr = np.asarray(values, dtype=float).ravel()
    except (TypeError, ValueError):
        raise TypeError(
            f"{name} must be an array of numbers (seconds), got {values!r:.200}") from None
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN at index {int(np.flatnonzero(np.isnan(arr))[0])}")
    if (arr < 0).any():
        i = int(np.flatnonzero(arr < 0)[0])
        raise ValueError(f"{name} must be >= 0 (seconds after the window's end); "
                         f"index {i} is {arr[i]!r}")
    return arr


def _late_in_window(arrivals: np.ndarray, t: float) -> np.ndarray:
    """Sorted arrivals in (0, T]: offset 0 is on time, beyond T the window is gone."""
    return np.sort(arrivals[(arrivals > 0) & (arrivals <= t)])


def _validate_schedule(offsets: object, t: float, name: str = "offsets") -> np.ndarray:
    x = _validate_offsets(offsets, name)
    if x.size and (x[0] <= 0 or x[-1] > t):
        bad = x[(x <= 0) | (x > t)][0]
        raise ValueError(f"{name} must lie in (0, allowed_lateness={t}], got {bad!r}")
    if x.size > 1 and not (np.diff(x) > 0).all():
        i = int(np.flatnonzero(np.diff(x) <= 0)[0])
        raise ValueError(f"{name} must be strictly increasing; "
                         f"{name}[{i}]={x[i]!r} >= {name}[{i + 1}]={x[i + 1]!r}")
    return x


def interval_staleness(x: np.ndarray, sorted_late: np.ndarray, t: float) -> np.ndarray:
    """Aion's staleness of every interval of schedule ``x`` (length k + 1)."""
    edges = np.concatenate(([0.0], x, [t]))
    n = len(sorted_late)
    if n == 0:
        return np.zeros(len(edges) - 1)
    counts = np.diff(np.searchsorted(sorted_late, edges, side="right"))
    return np.diff(edges) * counts / (t * n)


def empirical_weight(n_total: int) -> Weight:
    """Aion's ``w(n) = n / N``."""
    return lambda m: m / n_total


def _reach(a: Sequence[float], left: float, budget: float, w: Weight) -> float:
    """The furthest right end r with ``(r - left) * w(count(left, r]) <= budget``.

    ``a`` is sorted. Cost O(log N) evaluations of ``w``.
    """
    n = len(a)
    i0 = bisect.bisect_right(a, left)
    # Largest m such that the interval can hold m arrivals: (a[i0+m-1] - left) * w(m)
    # grows with m, so bisect over m.
    def cost(m: int) -> float:
        return (a[i0 + m - 1] - left) * w(m) if m else -1.0

    m = bisect.bisect_right(range(n - i0 + 1), budget, key=cost) - 1
    wm = w(m)
    r = left + budget / wm if wm > 0 else math.inf
    if i0 + m < n:
        # Reaching the next arrival would hold m + 1, which the bound forbids.
        r = min(r, math.nextafter(a[i0 + m], -math.inf))
    return r


def greedy(a: Sequence[float], t: float, bound: float, w: Weight,
           limit: int | None = None) -> list[float] | None:
    """Fewest executions keeping every interval's cost <= ``bound``.

    Returns None when more than ``limit`` executions would be needed. Cost
    O(k log N).
    """
    budget = bound * t
    x: list[float] = []
    left = 0.0
    while True:
        r = _reach(a, left, budget, w)
        if r >= t:
            return x
        if r <= left:  # the bound is below float resolution here
            return None
        if limit is not None and len(x) >= limit:
            return None
        x.append(r)
        left = r


def min_max(a: Sequence[float], t: float, k: int, w: Weight) -> tuple[float, list[float]]:
    """The smallest bound reachable with at most ``k`` executions, and a schedule for it.

    Cost O(k log N log(1/tol)).
    """
    hi = w(len(a)) * 1.0  # no execution at all: one interval (0, T]
    if hi <= 0:
        return 0.0, []
    lo = 0.0
    best = greedy(a, t, hi, w, k)
    assert best is not None
    while hi - lo > _REL_TOL * hi:
        mid = 0.5 * (lo + hi)
        x = greedy(a, t, mid, w, k)
        if x is None:
            lo = mid
        else:
            hi, best = mid, x
    return hi, best


def pad(x: list[float], k: int, a: np.ndarray, t: float) -> list[float]:
    """Add executions until there are k, splitting the costliest interval in two.

    Splitting never raises any interval's staleness, so the maximum holds.
    """
    x = list(x)
    while len(x) < k:
        edges = np.array([0.0, *x, t])
        lengths = np.diff(edges)
        st = interval_staleness(np.asarray(x), a, t)
        # Costliest first, then longest (an empty interval may still get
        # arrivals); skip intervals too short to split in floating point.
        for j in np.lexsort((lengths, st))[::-1]:
            mid = 0.5 * (edges[j] + edges[j + 1])
            if edges[j] < mid < edges[j + 1]:
                break
        else:
            raise ValueError(f"k={k}: cannot place that many distinct executions in (0, {t}]")
        x.insert(j, float(mid))
    return x
