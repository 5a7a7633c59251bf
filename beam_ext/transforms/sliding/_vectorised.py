"""Batch SlidingAggregate as array programs: numpy over key-sorted arrays.

Used by SparkRunner per partition (``beam_ext/runner/native/_sliding.py``). Every
window is a pair of positions ``[lo, hi)`` in the key-sorted data, found for
all events at once by binary search on (key, timestamp-rank) codes; then each
aggregation's vectorised form, taken from the registry of kinds
(``aggregators/registry.py``), answers all its windows at once:

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
the incremental engine's exactly. A kind without a vectorised form (or one
this version does not know) is refused, naming the aggregation.
"""
from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np

from beam_ext.transforms.aggregators._columnar import Column
from beam_ext.transforms.aggregators.registry import Vectorised
from beam_ext.transforms.sliding._plan import COUNT_ALL, _Plan
from beam_ext.transforms.sliding.agg import AggSpec


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
    return feature_dicts(compute_columns(plan, _codes(groups), times, columns, passing), n_all)


def feature_dicts(feats: dict[str, list], n: int) -> list[dict]:
    """Each event's features as a dict, from :func:`compute_columns`' lists; keys in ``feats``' order."""
    # Filled a column at a time, which is faster than a dict(zip()) per event
    # (benchmarks/sliding_task_steps.py times this step).
    out: list[dict] = [{} for _ in range(n)]
    for name, values in feats.items():
        for features, value in zip(out, values):
            features[name] = value
    return out


def _vectorised_form(name: str, spec: AggSpec) -> Vectorised:
    """The aggregation's numpy form; one without (or of an unknown kind) is refused by name."""
    try:
        form = spec.vectorised
    except ValueError as e:  # an unknown kind, say from a plan pickled by another version
        raise ValueError(f"aggregations[{name!r}]: {e}") from None
    if form is None:
        raise ValueError(f"aggregations[{name!r}]: {spec.describe()} has no vectorised form; "
                         "SlidingAggregate keeps its Beam expansion for it")
    return form


def compute_columns(plan: _Plan, key_codes: np.ndarray, times: np.ndarray, columns: list[np.ndarray],
                    passing: np.ndarray | None = None) -> dict[str, list]:
    """Columnar form of :func:`compute_batch`: feature name -> values in input order.

    ``key_codes`` are non-negative integers, ``columns[i]`` the values of
    ``plan.columns[i]`` for every event (float64 with NaN for nulls, or
    integer codes with -1 for nulls), ``passing`` the ``where`` mask.
    """
    forms = [_vectorised_form(name, spec) for name, spec, _ in plan.aggs]
    times = np.asarray(times, dtype=np.float64)
    kc_all = np.asarray(key_codes, dtype=np.int64)
    order = np.lexsort((times, kc_all))
    kq, tq = kc_all[order], times[order]
    data = order if passing is None else order[np.asarray(passing, dtype=bool)[order]]
    kd, td = kc_all[data], times[data]
    columns = [np.asarray(c)[data] for c in columns]

    # Positions of every edge for every query, queries in key-sorted order
    # (sorted queries search memory in order). A data row's code is (key,
    # rank of its time among the data's distinct times); the rows at or
    # before bound b of key k are those whose code is below (k, number of
    # distinct times <= b).
    uniq = np.unique(td)
    width = np.int64(len(uniq) + 1)
    data_code = kd * width + np.searchsorted(uniq, td)
    kq_code = kq * width
    pos = [np.searchsorted(data_code, kq_code + np.searchsorted(uniq, tq - off, side="right"))
           for off in plan.offsets]

    # One Column per plan column: helpers built once are shared by every aggregation and window.
    cols: dict[int, Column] = {}
    feats: list[list] = []
    for _, w, a in plan.features:
        lo, hi = pos[plan.tail[w]], pos[plan.head[w]]
        ci = plan.aggs[a][2]
        if ci not in cols:
            cols[ci] = Column.every_event(kd) if ci == COUNT_ALL else Column(columns[ci], kd)
        feats.append(forms[a](cols[ci], lo, hi))

    inverse = np.empty_like(order)
    inverse[order] = np.arange(len(order))
    # Object arrays keep each value's Python type (int counts, None for empty windows).
    return {name: np.asarray(f, dtype=object)[inverse].tolist() for (name, _, _), f in zip(plan.features, feats)}
