"""StalenessTrigger: late firings planned from the observed late arrivals."""
from __future__ import annotations

import collections
import math
from typing import Hashable, Iterable

import numpy as np

from beam_ext.transforms.staleness._planner import StalenessPlanner
from beam_ext.transforms.staleness._schedule import _validate_lateness, _validate_offsets

# Replan once the history has grown by this fraction since the last plan:
# planning is cheap but sorting 100k offsets per window is not free.
_REPLAN_GROWTH = 0.05


class StalenessTrigger:
    """Fires a window's late panes where its late arrivals make results stale.

    Attach it to a windowed aggregation (``LateWindowedGroupByKey(trigger=...)``
    or :class:`StalenessRefire`). It learns the distribution of late-arrival
    offsets (seconds of event time after a window's end) from past windows
    and plans the fewest late firings keeping the maximum staleness
    (Aion section 3.4, see :func:`max_staleness`) under ``max_staleness`` on
    fresh windows, using :class:`StalenessPlanner`.

    ``allowed_lateness``: T, the window's lifetime after its end; required
    by :class:`StalenessRefire` and :meth:`to_beam_trigger`, optional when
    the aggregation passes T to :meth:`late_firing_offsets`.
    ``history``: offsets seen before the pipeline started: a flat array, or
    a list of per-window arrays. ``history_windows``: how many past windows
    the trigger learns from (older ones are forgotten, so the plan follows
    drift). ``history_size``: bound on offsets kept from :meth:`observe`
    calls that name no window. ``window_arrivals``: late arrivals expected
    per window (default: the median of the complete windows seen, else the
    planner's default); it sizes the planner's safety margin.

    Without any history the trigger fires at ``ceil(1 / sqrt(max_staleness))``
    evenly spaced offsets, the optimum when late arrivals are uniform.

    >>> import numpy as np
    >>> trigger = StalenessTrigger(max_staleness=0.05, allowed_lateness=100.0,
    ...                            history=np.random.default_rng(0).lognormal(0, 1, 5000) * 5)
    >>> offsets = trigger.late_firing_offsets(100.0)
    >>> 0 < offsets[0] and offsets[-1] <= 100.0 and offsets == sorted(offsets)
    True
    """

    def __init__(self, max_staleness: float, allowed_lateness: float | None = None,
                 history_windows: int = 20, *,
                 history: Iterable[float] | Iterable[Iterable[float]] | None = None,
                 window_arrivals: int | None = None, history_size: int = 100_000) -> None:
        StalenessPlanner._check_bound(max_staleness)
        if isinstance(history_windows, bool) or not isinstance(history_windows, int) \
                or history_windows < 1:
            raise ValueError(f"history_windows must be an integer >= 1, got {history_windows!r}")
        if isinstance(history_size, bool) or not isinstance(history_size, int) or history_size < 1:
            raise ValueError(f"history_size must be an integer >= 1, got {history_size!r}")
        if window_arrivals is not None and not window_arrivals >= 1:
            raise ValueError(f"window_arrivals must be >= 1, got {window_arrivals!r}")
        self.max_staleness = float(max_staleness)
        self.allowed_lateness = (None if allowed_lateness is None
                                 else _validate_lateness(allowed_lateness))
        self.history_windows = history_windows
        self.window_arrivals = window_arrivals
        self._windows: collections.OrderedDict[Hashable, list[float]] = collections.OrderedDict()
        self._pool: collections.deque[float] = collections.deque(maxlen=history_size)
        self._version = 0
        self._cache: tuple[float, int, int, list[float]] | None = None  # T, version, size, plan
        if history is not None:
            self._load(history)

    def _load(self, history: Iterable) -> None:
        items = list(history)
        if items and all(isinstance(w, Iterable) and not isinstance(w, (str, bytes))
                         for w in items):
            for i, window in enumerate(items):
                offsets = _validate_offsets(list(window), f"history[{i}]")
                self._windows[("history", i)] = offsets.tolist()
            while len(self._windows) > self.history_windows:
                self._windows.popitem(last=False)
        else:
            self._pool.extend(_validate_offsets(items, "history").tolist())
        self._version += 1

    def observe(self, offset: float, window: Hashable | None = None) -> None:
        """Record a late event ``offset`` seconds of event time after its window's end.

        ``window`` (any hashable, e.g. the window's end) groups offsets per
        window: the trigger then keeps the latest ``history_windows``
        windows and learns how many late events a window gets.
        """
        try:
            value = float(offset)
        except (TypeError, ValueError):
            raise TypeError(f"offset must be a number of seconds, got {offset!r}") from None
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"offset must be a finite number >= 0, got {offset!r}")
        if window is None:
            self._pool.append(value)
        else:
            if window not in self._windows:
                self._windows[window] = []
                if len(self._windows) > self.history_windows:
                    self._windows.popitem(last=False)
            self._windows[window].append(value)
        self._version += 1

    def history(self) -> np.ndarray:
        """The offsets the next plan learns from."""
        parts = [np.asarray(w, dtype=float) for w in self._windows.values()]
        parts.append(np.fromiter(self._pool, dtype=float, count=len(self._pool)))
        return np.concatenate(parts)

    def _expected_arrivals(self) -> int | None:
        if self.window_arrivals is not None:
            return int(self.window_arrivals)
        sizes = [len(w) for w in self._windows.values()]
        complete = sizes[:-1] if len(sizes) > 1 else []  # the newest window may still grow
        return int(np.median(complete)) if complete else None

    def late_firing_offsets(self, allowed_lateness: float | None = None) -> list[float]:
        """Sorted offsets in (0, T] (event-time seconds after the window's end) to fire late panes.

        ``allowed_lateness`` defaults to the one given to the constructor.
        Replans only when T changed or the history grew by 5 %.
        """
        t = self._lateness(allowed_lateness)
        if self._cache is not None:
            cached_t, version, size, plan = self._cache
            grown = self._version - version
            if cached_t == t and (grown == 0 or grown < _REPLAN_GROWTH * size):
                return list(plan)
        history = self.history()
        late = history[(history > 0) & (history <= t)]
        if late.size == 0:
            k = math.ceil(1 / math.sqrt(self.max_staleness))
            plan = [t * j / k for j in range(1, k + 1)]
        else:
            plan = StalenessPlanner(late, t, window_arrivals=self._expected_arrivals()) \
                .plan(self.max_staleness)
        self._cache = (t, self._version, max(len(history), 1), plan)
        return list(plan)

    def _lateness(self, allowed_lateness: float | None) -> float:
        if allowed_lateness is None:
            if self.allowed_lateness is None:
                raise ValueError("allowed_lateness is needed: pass it to the StalenessTrigger "
                                 "or to late_firing_offsets")
            return self.allowed_lateness
        return _validate_lateness(allowed_lateness)

    def to_beam_trigger(self, allowed_lateness: float | None = None):
        """An approximation with Beam's standard triggers, for runners accepting nothing else.

        Returns ``AfterWatermark(late=Repeatedly(AfterCount(n)))`` where
        ``n`` = expected late events per window / (planned firings + 1): a
        count-driven trigger with the same number of late firings as the
        plan. What is lost: Beam's late firings are driven by element
        counts, not by event time, so panes fire after every n late events
        instead of at the planned offsets (the ``deltaev`` baseline of
        Aion's figure 9, which needs several times more firings for the same
        staleness); a window receiving fewer late events than expected never
        gets its last late pane; and Beam triggers carry no lifetime, so
        set ``allowed_lateness`` (T) on ``beam.WindowInto`` yourself.

        >>> t = StalenessTrigger(0.1, allowed_lateness=60.0, history=[[1.0, 2.0, 3.0, 50.0]] * 3)
        >>> type(t.to_beam_trigger()).__name__
        'AfterWatermark'
        """
        from apache_beam.transforms import trigger as beam_trigger

        plan = self.late_firing_offsets(allowed_lateness)
        expected = self._expected_arrivals()
        if expected is None:
            history = self.history()
            n_windows = max(len(self._windows), 1)
            expected = max(int(len(history) / n_windows), 1)
        per_firing = max(1, round(expected / (len(plan) + 1)))
        return beam_trigger.AfterWatermark(
            late=beam_trigger.Repeatedly(beam_trigger.AfterCount(per_firing)))

    def __repr__(self) -> str:
        return (f"StalenessTrigger(max_staleness={self.max_staleness}, "
                f"allowed_lateness={self.allowed_lateness}, "
                f"history_windows={self.history_windows}; {len(self.history())} offsets)")
