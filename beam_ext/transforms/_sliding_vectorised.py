"""Batch SlidingAggregate as array programs: numpy over key-sorted arrays.

Used by SparkRunner per partition (see :func:`_sliding_on_spark`). Every
window is a pair of positions ``[lo, hi)`` in the key-sorted data, found for
all events at once by binary search on (key, timestamp-rank) codes; then

- count, sum, mean, variance: differences of prefix sums. Sums are exact:
  values become integers at a common binary scale (every float is
  ``m * 2**-E``), prefix-summed as Python integers in object arrays, and
  divided once at the end (correctly rounded). So the results equal the
  incremental engine's bit for bit, whatever the magnitudes;
- min, max: a sparse table (range-minimum in O(1) per query after
  O(n log n) set-up);
- count_distinct: the events in ``[lo, hi)`` whose previous occurrence of the
  same value (same key) is before ``lo``, counted with a merge-sort tree
  (O(log^2 n) per query, built level by level so memory stays O(n)).

None of these costs depends on the window size, and every result equals
the incremental engine's exactly.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Iterator

import numpy as np

from beam_ext._key_hash import key_hash, untyped_key_coder
from beam_ext.runner.native import NativeContext, register_native
from beam_ext.transforms._sliding_plan import COUNT_ALL, NATIVE_URN, _Plan



def _codes(values: Iterable[Any]) -> np.ndarray:
    """Dense integer codes by Python equality; nulls get -1."""
    table: dict[Any, int] = {}
    out = []
    for v in values:
        if v is None or (isinstance(v, float) and v != v):
            out.append(-1)
        else:
            out.append(table.setdefault(v, len(table)))
    return np.asarray(out, dtype=np.int64)


def _prefix(x: np.ndarray, dtype=np.int64) -> np.ndarray:
    out = np.zeros(len(x) + 1, dtype=dtype)
    np.cumsum(x, out=out[1:], dtype=dtype)
    return out


def _divide(num: np.ndarray, den: Any) -> list:
    """Correctly rounded int/int division, elementwise; overflow gives +-inf."""
    try:
        return np.true_divide(num, den).tolist()
    except OverflowError:
        out = []
        for a, b in zip(num.tolist(), den.tolist() if isinstance(den, np.ndarray) else [den] * len(num)):
            try:
                out.append(a / b)
            except OverflowError:
                out.append(math.copysign(math.inf, a) * math.copysign(1, b))
        return out


class _ExactPrefix:
    """Exact prefix sums of x and x^2 (nulls as 0) at a common binary scale."""

    def __init__(self, x: np.ndarray) -> None:
        finite = np.isfinite(x)
        xf = np.where(finite, x, 0.0)
        mant, exp = np.frexp(xf)
        m = (mant * (1 << 53)).astype(np.int64)
        # x = m * 2**(exp - 53); bring all to the finest scale 2**-E.
        scale = 53 - exp.astype(np.int64)
        scale[m == 0] = np.iinfo(np.int64).min
        self.e = int(max(scale.max(initial=0), 0))
        shift = np.where(m == 0, 0, self.e - scale)
        ints = m.astype(object) << shift.astype(object)
        self._ints = ints
        self.p1 = _prefix(ints, object)
        self._p2: np.ndarray | None = None
        self.pinf = _prefix(x == np.inf)
        self.ninf = _prefix(x == -np.inf)

    @property
    def p2(self) -> np.ndarray:
        if self._p2 is None:  # only variance and stddev need squares
            self._p2 = _prefix(self._ints * self._ints, object)
        return self._p2

    def answer(self, kind: str, lo: np.ndarray, hi: np.ndarray, cnt: np.ndarray) -> list:
        s1 = self.p1[hi] - self.p1[lo]
        n_obj = cnt.astype(object)
        if kind == "sum":
            out = _divide(s1, 1 << self.e)
        elif kind == "mean":
            out = _divide(s1, np.maximum(n_obj, 1) << self.e)
        else:
            s2 = self.p2[hi] - self.p2[lo]
            nz = np.maximum(n_obj, 1)
            out = _divide(n_obj * s2 - s1 * s1, (nz * nz) << (2 * self.e))
            if kind == "stddev":
                out = [math.sqrt(v) for v in out]
        pinf = self.pinf[hi] - self.pinf[lo]
        ninf = self.ninf[hi] - self.ninf[lo]
        for i in np.flatnonzero((pinf > 0) | (ninf > 0)).tolist():
            if kind in ("variance", "stddev") or (pinf[i] and ninf[i]):
                out[i] = math.nan
            else:
                out[i] = math.inf if pinf[i] else -math.inf
        if kind == "sum":
            for i in np.flatnonzero(cnt == 0).tolist():
                out[i] = 0.0
        return out


def _range_extreme(values: np.ndarray, lo: np.ndarray, hi: np.ndarray, use_max: bool) -> np.ndarray:
    """max (or min) of ``values[lo:hi]`` per query; NaN for empty ranges (sparse table)."""
    op = np.maximum if use_max else np.minimum
    fill = -np.inf if use_max else np.inf
    v = np.where(np.isnan(values), fill, values)
    length = hi - lo
    out = np.full(len(lo), fill)
    nonempty = length > 0
    if not nonempty.any():
        return np.full(len(lo), np.nan)
    level = np.zeros(len(lo), dtype=np.int64)
    level[nonempty] = np.floor(np.log2(length[nonempty])).astype(np.int64)
    # log2 of exact powers of two can round down; fix up.
    too_big = nonempty & ((np.int64(1) << level) > length)
    level[too_big] -= 1
    table = v
    max_level = int(level[nonempty].max())
    for k in range(max_level + 1):
        sel = nonempty & (level == k)
        if sel.any():
            out[sel] = op(table[lo[sel]], table[hi[sel] - (1 << k)])
        if k < max_level:
            half = 1 << k
            table = op(table[:-half], table[half:]) if len(table) > half else table[:0]
    out[~nonempty] = np.nan
    return out


def _distinct_counts(prev: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """#{j in [lo, hi): prev[j] < lo} per query (merge-sort tree, level by level)."""
    n = len(prev)
    out = np.zeros(len(lo), dtype=np.int64)
    if n == 0:
        return out
    span = np.int64(n + 2)
    shifted = prev + 1  # in [0, n + 1]
    left, right = lo.copy(), hi.copy()
    thresh = lo + 1  # prev < lo  <=>  prev + 1 < lo + 1
    positions = np.arange(n, dtype=np.int64)
    level = 0
    while True:
        active = left < right
        if not active.any():
            break
        block = positions >> level
        merged = np.sort(block * span + shifted)
        for take_left in (True, False):
            if take_left:
                sel = active & ((left & 1) == 1)
                bid = left[sel]
            else:
                sel = active & ((right & 1) == 1)
                bid = right[sel] - 1
            if sel.any():
                found = np.searchsorted(merged, bid * span + thresh[sel], side="left")
                out[sel] += found - (bid << level)
        left = np.where(active & ((left & 1) == 1), left + 1, left) >> 1
        right = np.where(active & ((right & 1) == 1), right - 1, right) >> 1
        level += 1
    return out


def _previous_occurrence(kc: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Index of the previous event with the same key and value; -1 if none, n for nulls."""
    n = len(codes)
    prev = np.full(n, -1, dtype=np.int64)
    idx = np.arange(n, dtype=np.int64)
    order = np.lexsort((idx, codes, kc))
    same = (kc[order][1:] == kc[order][:-1]) & (codes[order][1:] == codes[order][:-1])
    prev[order[1:][same]] = order[:-1][same]
    prev[codes < 0] = n  # never "first in window": nulls are not counted
    return prev


def compute_batch(plan: _Plan, groups: list[Any], times: np.ndarray,
                  events: list[Any]) -> list[dict[str, Any]]:
    """Features of every event (batch semantics), in input order.

    ``groups[i]`` is the event's grouping key (any hashable), ``times[i]`` its
    event time in seconds.
    """
    n_all = len(events)
    if n_all == 0:
        return []
    passing = None if plan.where is None else np.fromiter(
        (plan.passes(e) for e in events), dtype=bool, count=n_all)
    rows = [plan.row(e) if passing is None or passing[i] else None for i, e in enumerate(events)]
    columns: list[Any] = []
    for ci, (_, numeric, _) in enumerate(plan.columns):
        if numeric:
            columns.append(np.fromiter((math.nan if r is None else r[ci] for r in rows),
                                       dtype=np.float64, count=n_all))
        else:
            columns.append(_codes(None if r is None else r[ci] for r in rows))
    feats = compute_columns(plan, _codes(groups), times, columns, passing)
    names = [name for name, _, _ in plan.features]
    return [dict(zip(names, row)) for row in zip(*(feats[name] for name in names))]


def compute_columns(plan: _Plan, key_codes: np.ndarray, times: np.ndarray, columns: list[np.ndarray],
                    passing: np.ndarray | None = None) -> dict[str, list]:
    """Columnar form of :func:`compute_batch`: feature name -> values in input order.

    ``key_codes`` are non-negative integers, ``columns[i]`` the values of
    ``plan.columns[i]`` for every event (float64 with NaN for nulls, or
    integer codes with -1 for nulls), ``passing`` the ``where`` mask.
    """
    times = np.asarray(times, dtype=np.float64)
    kc_all = np.asarray(key_codes, dtype=np.int64)
    order = np.lexsort((times, kc_all))
    kq, tq = kc_all[order], times[order]
    data = order if passing is None else order[np.asarray(passing, dtype=bool)[order]]
    kd, td = kc_all[data], times[data]
    columns = [np.asarray(c)[data] for c in columns]

    # Positions of every edge for every query: data codes vs bound codes.
    bounds = [tq - off for off in plan.offsets]
    uniq = np.unique(np.concatenate([td] + bounds))
    width = np.int64(len(uniq) + 1)
    data_code = kd * width + np.searchsorted(uniq, td)
    pos = [np.searchsorted(data_code, kq * width + np.searchsorted(uniq, b), side="right")
           for b in bounds]

    # Per-column helpers, built once and shared by every window.
    cache: dict[tuple, Any] = {}

    def helper(kind: str, ci: int) -> Any:
        key = (kind, ci)
        if key in cache:
            return cache[key]
        x = columns[ci]
        if kind == "nonnull":
            got = _prefix((~np.isnan(x)) if x.dtype == np.float64 else (x >= 0))
        elif kind == "exact":
            got = _ExactPrefix(x)
        elif kind == "prev":
            got = _previous_occurrence(kd, x)
        else:
            raise AssertionError(kind)
        cache[key] = got
        return got

    feats: list[Any] = []
    for _, w, a in plan.features:
        lo, hi = pos[plan.tail[w]], pos[plan.head[w]]
        _, spec, ci = plan.aggs[a]
        kind = spec.kind
        if ci == COUNT_ALL:
            feats.append((hi - lo).tolist())
            continue
        nn = helper("nonnull", ci)
        cnt = nn[hi] - nn[lo]
        if kind == "count":
            feats.append(cnt.tolist())
            continue
        if kind == "count_distinct":
            feats.append(_distinct_counts(helper("prev", ci), lo, hi).tolist())
            continue
        if kind in ("min", "max"):
            vals = _range_extreme(columns[ci], lo, hi, kind == "max").tolist()
        else:
            vals = helper("exact", ci).answer(kind, lo, hi, cnt)
            if kind == "sum":
                feats.append(vals)
                continue
        out = vals
        for i in np.flatnonzero(cnt == 0).tolist():
            out[i] = None
        feats.append(out)

    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    idx = inverse.tolist()
    return {name: [f[i] for i in idx] for (name, _, _), f in zip(plan.features, feats)}


def _partition(plan: _Plan, items: Iterator[tuple[Any, tuple[float, Any]]]) -> Iterator[Any]:
    groups, times, wvs = [], [], []
    for (key, _), (t, wv) in items:
        groups.append((key, wv.windows))
        times.append(t)
        wvs.append(wv)
    feats = compute_batch(plan, groups, np.asarray(times, dtype=np.float64), [wv.value for wv in wvs])
    for wv, f in zip(wvs, feats):
        yield wv.with_value((wv.value, f))


def sliding_on_rdd(plan: _Plan, rdd: Any, parallelism: int) -> Any:
    """RDD of WindowedValue(event) -> RDD of WindowedValue((event, features))."""

    # Keys are grouped and partitioned by their encoding, as GroupByKey does
    # on the Beam path: Python's hash() differs between workers, and Python
    # equality would split NaN keys and merge 1 with 1.0.
    coder = untyped_key_coder("SlidingAggregate key")

    def keyed(wv: Any) -> tuple:
        event = wv.value
        t = plan.event_time(event, wv.timestamp.micros / 1e6)
        return (coder.encode(plan.key(event)), wv.windows), (t, wv)

    return (rdd.map(keyed)
            .partitionBy(parallelism, lambda k: key_hash(k[0]))
            .mapPartitions(lambda it: _partition(plan, it), preservesPartitioning=False))


@register_native(NATIVE_URN)
def _sliding_on_spark(payload: bytes, rdd: Any, ctx: NativeContext) -> Any:
    from apache_beam.internal import pickler

    return sliding_on_rdd(pickler.loads(payload), rdd, ctx.parallelism)
