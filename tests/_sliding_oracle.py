"""Brute-force oracle for SlidingAggregate: every event against every other."""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Any


def _nonnull(v: Any) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


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
                vals = [x[field] for x in members if field is not None and _nonnull(x[field])]
                if kind == "count":
                    v = len(members) if field is None else len(vals)
                elif kind == "sum":
                    v = math.fsum(float(x) for x in vals)
                elif kind == "mean":
                    v = float(sum(map(Fraction, vals)) / len(vals)) if vals else None
                elif kind in ("variance", "stddev"):
                    if not vals:
                        v = None
                    else:
                        # Exact rational arithmetic: the oracle must not round before the end.
                        fr = [Fraction(x) for x in vals]
                        m = sum(fr) / len(fr)
                        v = float(sum((x - m) ** 2 for x in fr) / len(fr))
                        if kind == "stddev":
                            v = math.sqrt(v)
                elif kind == "min":
                    v = min(vals) if vals else None
                elif kind == "max":
                    v = max(vals) if vals else None
                elif kind == "count_distinct":
                    v = len(set(vals))
                else:
                    raise AssertionError(kind)
                feats[f"{aname}_{wname}"] = v
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
