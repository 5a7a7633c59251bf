"""Brute-force oracle for SlidingAggregate: every event against every other."""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Callable

from beam_ext.transforms.aggregators.registry import KINDS


def _nonnull(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def _variance(vals: list) -> float | None:
    # Exact rational arithmetic: the oracle must not round before the end.
    if not vals:
        return None
    fr = [Fraction(x) for x in vals]
    m = sum(fr) / len(fr)
    return float(sum((x - m) ** 2 for x in fr) / len(fr))


def _stddev(vals: list) -> float | None:
    v = _variance(vals)
    return None if v is None else math.sqrt(v)


# Per kind: the answer over the non-null values of a window (one None per event
# for a field-less kind). Every registered kind needs one; the tests check it.
ORACLES: dict[str, Callable[[list], Any]] = {
    "count": len,
    "sum": lambda vals: math.fsum(float(x) for x in vals),
    "mean": lambda vals: float(sum(map(Fraction, vals)) / len(vals)) if vals else None,
    "min": lambda vals: min(vals) if vals else None,
    "max": lambda vals: max(vals) if vals else None,
    "variance": _variance,
    "stddev": _stddev,
    "count_distinct": lambda vals: len(set(vals)),
}


def every_kind(numeric_field: str, other_field: str) -> dict[str, tuple[str, str | None]]:
    """One aggregation per registered kind and field it reads: name -> (kind, field).

    Numeric kinds read ``numeric_field``; the others read both fields, and
    field-optional kinds also run without one.
    """
    out: dict[str, tuple[str, str | None]] = {}
    for kind in KINDS.values():
        if kind.field_optional:
            out[kind.name] = (kind.name, None)
        fields = [numeric_field] if kind.numeric else [numeric_field, other_field]
        for field in fields:
            out[f"{kind.name}_{field}"] = (kind.name, field)
    return out


def oracle(events, key, ts, windows, aggregations, where=None):
    """Features per event, in input order; fields are dict keys.

    ``windows``: name -> (size, delay); ``aggregations``: name -> (kind, field).
    """
    out = []
    for e in events:
        t = e[ts]
        feats = {}
        for wname, (size, delay) in windows.items():
            lo, hi = t - (delay + size), t - delay
            members = [x for x in events if x[key] == e[key] and lo < x[ts] <= hi
                       and (where is None or where(x))]
            for aname, (kind, field) in aggregations.items():
                if field is None:
                    vals = [None] * len(members)
                else:
                    vals = [x[field] for x in members if _nonnull(x[field])]
                feats[f"{aname}_{wname}"] = ORACLES[kind](vals)
        out.append(feats)
    return out


def close(a: Any, b: Any, scale: float = 1.0, rel: float = 1e-9) -> bool:
    """Equal, or both floats within ``rel`` of ``scale`` (the magnitude of the inputs)."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        return abs(a - b) <= rel * max(scale, abs(a), abs(b), 1.0)
    return a == b


def assert_features_close(got: list[dict], want: list[dict], scale: float = 1.0, rel: float = 1e-9,
                          variance_scale: float | None = None) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert set(g) == set(w), (i, g, w)
        for name in w:
            s = scale
            if name.startswith(("var", "variance")) and variance_scale is not None:
                s = variance_scale
            assert close(g[name], w[name], s, rel), (i, name, g[name], w[name], g, w)
