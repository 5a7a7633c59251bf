"""Predictive cleanup: when a past window's state may be purged (Aion section 3.4).

Aion starts with a conservatively large lateness bound and, once a
representative history of late offsets exists, moves it to a value that
covers a chosen fraction of late events with a chosen confidence.
"""
from __future__ import annotations

import bisect
import collections
import math


class PredictiveCleanup:
    """Learns from late offsets how long window state must be kept.

    ``observe(offset)`` records that a late event arrived ``offset`` seconds
    of event time after its window's end (feed every late event, including
    those that arrived after the purge: they are the evidence that the bound
    is too short). ``allowed_lateness()`` is a distribution-free upper
    confidence bound on the ``coverage`` quantile of late offsets: with the
    ``n`` kept offsets sorted, the r-th smallest, r the least index with
    ``P(Binomial(n, coverage) < r) >= confidence``. For offsets drawn
    independently from any continuous distribution, the returned lateness
    covers at least ``coverage`` of late events in at least ``confidence`` of
    histories. Until ``min_history`` offsets are seen, or while ``n`` is too
    small for that confidence (``coverage ** n > 1 - confidence``), it returns
    ``initial_lateness``.

    Memory is bounded: only the latest ``history_size`` offsets are kept (a
    sliding history, so the bound follows drift). ``observe`` costs
    O(log n) comparisons plus an O(n) memmove; ``allowed_lateness`` O(1)
    after the first call per history length.

    >>> c = PredictiveCleanup(coverage=0.9, confidence=0.9, initial_lateness=100.0,
    ...                       min_history=10)
    >>> c.allowed_lateness()
    100.0
    >>> for offset in range(1, 101):
    ...     c.observe(float(offset))
    >>> c.allowed_lateness()  # the 95th smallest of 1..100
    95.0
    """

    def __init__(self, coverage: float = 0.99, confidence: float = 0.95,
                 initial_lateness: float = 3600.0, min_history: int = 100,
                 history_size: int = 10_000) -> None:
        if not 0 < coverage < 1:
            raise ValueError(f"coverage must be in (0, 1), got {coverage!r}")
        if not 0 < confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
        if not (isinstance(initial_lateness, (int, float)) and math.isfinite(initial_lateness)
                and initial_lateness > 0):
            raise ValueError(f"initial_lateness must be a finite number of seconds > 0, "
                             f"got {initial_lateness!r}")
        if isinstance(min_history, bool) or not isinstance(min_history, int) or min_history < 1:
            raise ValueError(f"min_history must be an integer >= 1, got {min_history!r}")
        if (isinstance(history_size, bool) or not isinstance(history_size, int)
                or history_size < min_history):
            raise ValueError(f"history_size must be an integer >= min_history={min_history}, "
                             f"got {history_size!r}")
        self.coverage = float(coverage)
        self.confidence = float(confidence)
        self.initial_lateness = float(initial_lateness)
        self.min_history = min_history
        self.history_size = history_size
        self._arrival_order: collections.deque[float] = collections.deque()
        self._sorted: list[float] = []
        self._rank_for_n: dict[int, int] = {}

    def observe(self, offset: float) -> None:
        """Record one late event ``offset`` seconds after its window's end."""
        try:
            value = float(offset)
        except (TypeError, ValueError):
            raise TypeError(f"offset must be a number of seconds, got {offset!r}") from None
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"offset must be a finite number >= 0 (seconds after the "
                             f"window's end), got {offset!r}")
        if len(self._arrival_order) == self.history_size:
            oldest = self._arrival_order.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, oldest)]
        self._arrival_order.append(value)
        bisect.insort(self._sorted, value)

    def allowed_lateness(self) -> float:
        """Seconds after a window's end after which its state may be purged."""
        n = len(self._sorted)
        if n < self.min_history:
            return self.initial_lateness
        r = self._rank(n)
        return self._sorted[r - 1] if r <= n else self.initial_lateness

    def __len__(self) -> int:
        """Offsets currently kept."""
        return len(self._sorted)

    def _rank(self, n: int) -> int:
        r = self._rank_for_n.get(n)
        if r is None:
            # P(Binom(n, q) <= r - 1) >= confidence  <=>  r - 1 >= ppf(confidence).
            # SciPy costs a second of import in every Spark Python worker: load it on use.
            from scipy.stats import binom

            r = int(binom.ppf(self.confidence, n, self.coverage)) + 1
            self._rank_for_n[n] = r
        return r

    def _check(self) -> None:
        """Assert the invariants (tests call this after every action)."""
        assert len(self._sorted) == len(self._arrival_order) <= self.history_size
        assert self._sorted == sorted(self._arrival_order)

    def __repr__(self) -> str:
        return (f"PredictiveCleanup(coverage={self.coverage}, confidence={self.confidence}, "
                f"initial_lateness={self.initial_lateness}, min_history={self.min_history}, "
                f"history_size={self.history_size}; {len(self)} offsets kept)")
