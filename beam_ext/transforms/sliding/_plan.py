"""A validated SlidingAggregate specification, compiled for the engines."""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

from beam_ext.transforms._fields import FieldSpec, field_getter
from beam_ext.transforms.aggregators.registry import KINDS
from beam_ext.transforms.sliding.agg import AggSpec

COUNT_ALL = -1  # column index of agg.count(): every event counts
NATIVE_URN = "beam_ext:sliding_aggregate:v1"


@dataclasses.dataclass(frozen=True)
class SlidingWindow:
    """A window of ``size`` seconds ending ``delay`` seconds before each event.

    For an event at ``t`` it covers ``t - delay - size < t' <= t - delay``.

    >>> SlidingWindow(300)
    SlidingWindow(size=300, delay=0)
    """

    size: float
    delay: float = 0

    def __post_init__(self) -> None:
        for name in ("size", "delay"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise TypeError(f"SlidingWindow: {name} must be a finite number of seconds, got {v!r}")
        if self.size <= 0:
            raise ValueError(f"SlidingWindow: size must be > 0 seconds, got {self.size}")
        if self.delay < 0:
            raise ValueError(f"SlidingWindow: delay must be >= 0 seconds, got {self.delay}")


class _Plan:
    """Windows as edges, aggregations as columns, features as (window, agg) pairs.

    A window ``(size, delay)`` has a head edge at offset ``delay`` and a tail
    edge at offset ``delay + size`` before the event; windows with an edge
    at the same offset share it (and, in the engine, its iterator).
    """

    def __init__(self, key: FieldSpec, timestamp: FieldSpec | None,
                 windows: Mapping[str, SlidingWindow], aggregations: Mapping[str, AggSpec],
                 where: Callable[[Any], bool] | None) -> None:
        if not isinstance(windows, Mapping) or not windows:
            raise ValueError(f"windows: give a non-empty dict of name -> SlidingWindow, got {windows!r}")
        if not isinstance(aggregations, Mapping) or not aggregations:
            raise ValueError(f"aggregations: give a non-empty dict of name -> agg.*(), got {aggregations!r}")
        for name, w in windows.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"windows: names must be non-empty strings, got {name!r}")
            if not isinstance(w, SlidingWindow):
                raise TypeError(f"windows[{name!r}]: expected SlidingWindow(size, delay), got {w!r}")
        for name, a in aggregations.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"aggregations: names must be non-empty strings, got {name!r}")
            if not isinstance(a, AggSpec):
                raise ValueError(
                    f"aggregations[{name!r}]: unknown aggregation {a!r}; use one of "
                    f"{', '.join(f'agg.{k}(...)' for k in KINDS)} or agg.custom(field, factory)")
        if where is not None and not callable(where):
            raise TypeError(f"where: expected a callable event -> bool, got {where!r}")
        self.key = field_getter(key, "key")
        self.timestamp = None if timestamp is None else field_getter(timestamp, "timestamp")
        # Named fields let a columnar input be read by column (runner/native/_sliding.py).
        self.key_field = key if isinstance(key, str) else None
        self.timestamp_field = timestamp if isinstance(timestamp, str) else None
        self.column_fields: list[str | None] = []
        self.where = where
        self.windows = [(name, float(w.size), float(w.delay)) for name, w in windows.items()]
        offsets = sorted({d for _, _, d in self.windows} | {d + s for _, s, d in self.windows})
        self.offsets = offsets
        self.head = [offsets.index(d) for _, _, d in self.windows]
        self.tail = [offsets.index(d + s) for _, s, d in self.windows]

        # Columns: one per distinct (field, numeric) pair.
        self.columns: list[tuple[Callable[[Any], Any], bool, str]] = []
        seen: dict[tuple[Any, bool], int] = {}
        self.aggs: list[tuple[str, AggSpec, int]] = []
        for name, a in aggregations.items():
            if a.field is None:
                self.aggs.append((name, a, COUNT_ALL))
                continue
            ident = (a.field, a.numeric)
            if ident not in seen:
                seen[ident] = len(self.columns)
                self.columns.append((field_getter(a.field, a.describe()), a.numeric, a.describe()))
                self.column_fields.append(a.field if isinstance(a.field, str) else None)
            self.aggs.append((name, a, seen[ident]))
        self.kinds = ["float" if numeric else "object" for _, numeric, _ in self.columns]

        self.features: list[tuple[str, int, int]] = []
        names: dict[str, tuple[str, str]] = {}
        for ai, (aname, _, _) in enumerate(self.aggs):
            for wi, (wname, _, _) in enumerate(self.windows):
                fname = f"{aname}_{wname}"
                if fname in names:
                    raise ValueError(
                        f"duplicate feature name {fname!r}: aggregation {aname!r} x window {wname!r} "
                        f"and aggregation {names[fname][0]!r} x window {names[fname][1]!r}; rename one")
                names[fname] = (aname, wname)
                self.features.append((fname, wi, ai))
        self.vectorisable = all(a.vectorised is not None for _, a, _ in self.aggs)

    @property
    def reads_named_fields(self) -> bool:
        """Whether every field is a name (no callables, no ``where``): readable from columns."""
        return (self.key_field is not None and self.where is None
                and (self.timestamp is None or self.timestamp_field is not None)
                and all(name is not None for name in self.column_fields))

    def row(self, event: Any) -> tuple:
        """The column values of an event; nulls are NaN (numeric) or None."""
        out = []
        for get, numeric, role in self.columns:
            v = get(event)
            if numeric:
                if v is None:
                    v = math.nan
                else:
                    try:
                        v = float(v)
                    except (TypeError, ValueError):
                        raise ValueError(
                            f"{role}: expected a number, got {v!r:.100} "
                            f"in event {event!r:.500}") from None
            elif isinstance(v, float) and v != v:
                v = None
            out.append(v)
        return tuple(out)

    def passes(self, event: Any) -> bool:
        return self.where is None or bool(self.where(event))

    def event_time(self, event: Any, element_ts: float) -> float:
        if self.timestamp is None:
            return element_ts
        t = self.timestamp(event)
        try:
            t = float(t)
        except (TypeError, ValueError):
            raise ValueError(f"timestamp: expected seconds as a number, got {t!r:.100} "
                             f"in event {event!r:.500}") from None
        if not math.isfinite(t):
            raise ValueError(f"timestamp: expected a finite number of seconds, got {t!r} in event {event!r:.500}")
        return t
