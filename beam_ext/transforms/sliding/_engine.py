"""The incremental per-key engine: edge iterators over a reservoir feeding aggregators.

Each distinct edge offset ``o`` (a window's ``delay`` or ``delay + size``)
has one cursor over the key's reservoir; at clock ``T`` the cursor stands at
the first event with ``ts > T - o``. Moving the clock moves every cursor
forward; an event passing a window's head edge is added to the window's
aggregators, passing its tail edge removes it. Windows that share an edge
share its cursor (Railgun 4.1.1), and all windows with delay 0 share the head.
Each event is added and removed once per window, so the cost per event does
not depend on the window size, nor does memory beyond the reservoir's chunks.
"""
from __future__ import annotations

import math
from typing import Any

from beam_ext.state.reservoir import EventReservoir
from beam_ext.transforms.sliding._plan import COUNT_ALL, _Plan


def _is_null(v: Any) -> bool:
    return v is None or (isinstance(v, float) and v != v)


class _SlidingEngine:
    """Per-key running state. Not thread-safe; one per key.

    ``push(ts, row)`` stores an event (a where-passing one), ``advance(t)``
    moves the clock, ``features()`` answers for a query at the clock and
    ``query(t)`` answers for an older time by scanning (the out-of-order path).
    """

    def __init__(self, plan: _Plan, reservoir: EventReservoir | None = None,
                 retain: float = 0.0, truncate: bool = True) -> None:
        self._plan = plan
        self._r = reservoir if reservoir is not None else EventReservoir(plan.kinds, chunk_size=1024)
        self.clock = -math.inf
        # Out-of-order queries reach back ``retain`` seconds before the clock.
        self._retain = retain
        self._truncate = truncate
        self._cursors = [self._r.cursor(self._r.start) for _ in plan.offsets]
        self._aggs = [[spec.make() for _, spec, _ in plan.aggs] for _ in plan.windows]
        n_edges = len(plan.offsets)
        self._adds: list[list[tuple[Any, int]]] = [[] for _ in range(n_edges)]
        self._removes: list[list[tuple[Any, int]]] = [[] for _ in range(n_edges)]
        self._wire()
        self._since_truncate = 0

    def _wire(self) -> None:
        plan = self._plan
        for e in range(len(plan.offsets)):
            self._adds[e] = []
            self._removes[e] = []
        for w in range(len(plan.windows)):
            for a, (_, _, col) in enumerate(plan.aggs):
                self._adds[plan.head[w]].append((self._aggs[w][a], col))
                self._removes[plan.tail[w]].append((self._aggs[w][a], col))

    def __getstate__(self) -> dict:
        # The plan holds user callables and is the same for every key: the
        # owner re-attaches it (:meth:`attach`) instead of storing it per key.
        state = dict(self.__dict__)
        del state["_adds"], state["_removes"], state["_plan"]
        return state

    def attach(self, plan: _Plan) -> _SlidingEngine:
        """Re-attach the plan after unpickling; returns self."""
        self._plan = plan
        n = len(plan.offsets)
        self._adds = [[] for _ in range(n)]
        self._removes = [[] for _ in range(n)]
        self._wire()
        return self

    @property
    def reservoir(self) -> EventReservoir:
        return self._r

    def push(self, ts: float, row: tuple) -> None:
        """Store an event. In order (``ts >= clock``) it is appended; older ones are inserted."""
        if ts >= self.clock:
            self._r.append(ts, row)
            return
        self._r.insert(ts, row)
        plan, clock = self._plan, self.clock
        for e, off in enumerate(plan.offsets):
            if ts <= clock - off:
                self._cursors[e].shift(1)
        for w in range(len(plan.windows)):
            if clock - plan.offsets[plan.tail[w]] < ts <= clock - plan.offsets[plan.head[w]]:
                for a, (_, _spec, col) in enumerate(plan.aggs):
                    agg = self._aggs[w][a]
                    if agg.fifo_only:
                        self._rebuild(w, a)
                    elif col == COUNT_ALL:
                        agg.add(None)
                    elif not _is_null(row[col]):
                        agg.add(row[col])

    def _rebuild(self, w: int, a: int) -> None:
        # A FIFO structure cannot take a value in the middle: rebuild from the window's rows.
        plan = self._plan
        _, spec, col = plan.aggs[a]
        fresh = spec.make()
        for p in range(self._cursors[plan.tail[w]].pos, self._cursors[plan.head[w]].pos):
            _, row = self._r.row(p)
            if col == COUNT_ALL:
                fresh.add(None)
            elif not _is_null(row[col]):
                fresh.add(row[col])
        old = self._aggs[w][a]
        self._aggs[w][a] = fresh
        for lst in (self._adds[plan.head[w]], self._removes[plan.tail[w]]):
            for i, (agg, c) in enumerate(lst):
                if agg is old:
                    lst[i] = (fresh, c)

    def advance(self, t: float) -> None:
        """Move the clock forward to ``t`` (no-op if ``t`` is older than the clock)."""
        if t < self.clock:
            return
        self.clock = t
        offsets, cursors, adds, removes = self._plan.offsets, self._cursors, self._adds, self._removes
        for e, off in enumerate(offsets):
            bound = t - off
            cur = cursors[e]
            add, rem = adds[e], removes[e]
            while True:
                pt = cur.peek_ts()
                if pt is None or pt > bound:
                    break
                _, row = cur.take()
                for agg, col in add:
                    if col == COUNT_ALL:
                        agg.add(None)
                    else:
                        v = row[col]
                        if v is not None and v == v:
                            agg.add(v)
                for agg, col in rem:
                    if col == COUNT_ALL:
                        agg.remove(None)
                    else:
                        v = row[col]
                        if v is not None and v == v:
                            agg.remove(v)
        self._r.seal(t - self._retain)
        self._since_truncate += 1
        if self._truncate and self._since_truncate >= 256:
            self._since_truncate = 0
            self._forget()

    def _forget(self) -> None:
        r = self._r
        keep = min(c.pos for c in self._cursors)
        if self._retain > 0:
            keep = min(keep, r.locate(self.clock - self._retain - self._plan.offsets[-1]))
        r.truncate(keep)

    def features(self) -> dict[str, Any]:
        """The features of a query at the clock."""
        aggs = self._aggs
        return {name: aggs[w][a].get() for name, w, a in self._plan.features}

    def query(self, t: float) -> dict[str, Any]:
        """The features of a query at ``t <= clock``, by scanning the reservoir."""
        plan, r = self._plan, self._r
        out_aggs = []
        for (_, _, _), h, tl in zip(plan.windows, plan.head, plan.tail):
            lo = max(r.locate(t - plan.offsets[tl]), r.start)
            hi = r.locate(t - plan.offsets[h])
            fresh = [spec.make() for _, spec, _ in plan.aggs]
            for p in range(lo, hi):
                _, row = r.row(p)
                for agg, (_, _, col) in zip(fresh, plan.aggs):
                    if col == COUNT_ALL:
                        agg.add(None)
                    elif not _is_null(row[col]):
                        agg.add(row[col])
            out_aggs.append(fresh)
        return {name: out_aggs[w][a].get() for name, w, a in plan.features}

    def close(self) -> None:
        self._r.close()


def compute_sorted(plan: _Plan, times: list[float], events: list[Any],
                   reservoir: EventReservoir | None = None) -> list[dict[str, Any]]:
    """Batch semantics for one key: features of every event, all events known.

    ``times``/``events`` are sorted by time. Events with equal timestamps are
    all stored before any of them is answered, so peers are included and
    the result does not depend on input order.
    """
    engine = _SlidingEngine(plan, reservoir)
    out: list[dict[str, Any]] = []
    n = len(times)
    i = 0
    while i < n:
        t = times[i]
        j = i
        while j < n and times[j] == t:
            if plan.passes(events[j]):
                engine.push(t, plan.row(events[j]))
            j += 1
        engine.advance(t)
        feats = engine.features()
        out.extend(dict(feats) if k else feats for k in range(j - i))
        i = j
    return out
