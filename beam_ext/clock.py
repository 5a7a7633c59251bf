"""Injectable clocks, so time-driven logic is testable without sleeping."""
from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Seconds since an arbitrary epoch; never goes backwards."""

    def now(self) -> float: ...


class SystemClock:
    """Wall-clock time (``time.time()``)."""

    def now(self) -> float:
        return time.time()


class MonotonicClock:
    """Seconds on the system's monotonic clock: for timeouts and intervals.

    >>> c = MonotonicClock(); c.now() <= c.now()
    True
    """

    def now(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to.

    >>> c = ManualClock(10.0); c.advance(2.5); c.now()
    12.5
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"seconds must be >= 0, got {seconds}")
        with self._lock:
            self._now += seconds

    def set(self, now: float) -> None:
        with self._lock:
            if now < self._now:
                raise ValueError(f"clock cannot go back from {self._now} to {now}")
            self._now = now
