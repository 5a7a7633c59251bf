"""When late panes fire and when a past window is closed, for the late-pane transforms.

Two kinds of late trigger:

* *scheduled*: any object with ``late_firing_offsets(allowed_lateness)``
  (e.g. ``beam_ext.transforms.staleness.StalenessTrigger``): a late pane fires
  when the watermark reaches ``window_end + offset``, if late data arrived
  since the previous pane. :class:`EveryNLateEvents` and
  :class:`AfterLateDelay` are event-driven instead.
* *cleanup*: a float (a fixed allowed lateness, seconds) or any object with
  ``observe(offset)`` and ``allowed_lateness()`` (e.g.
  :class:`~beam_ext.transforms.lateness.PredictiveCleanup`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["CleanupPolicy", "ScheduledLateTrigger", "EveryNLateEvents", "AfterLateDelay",
           "FixedLateness", "LateTrigger", "Cleanup"]


@runtime_checkable
class CleanupPolicy(Protocol):
    """Decides how long a past window stays open (seconds of event time after its end)."""

    def observe(self, offset: float) -> None: ...

    def allowed_lateness(self) -> float: ...


@runtime_checkable
class ScheduledLateTrigger(Protocol):
    """Fires late panes at fixed event-time offsets after the window's end."""

    def late_firing_offsets(self, allowed_lateness: float) -> list[float]: ...


@dataclass(frozen=True)
class EveryNLateEvents:
    """Fire a late pane as soon as ``n`` late events arrived since the previous pane.

    >>> EveryNLateEvents(10).n
    10
    """

    n: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"EveryNLateEvents: n must be an int >= 1, got {self.n!r}")


@dataclass(frozen=True)
class AfterLateDelay:
    """Fire a late pane ``seconds`` of processing time after the first late event since the last pane.

    >>> AfterLateDelay(5.0).seconds
    5.0
    """

    seconds: float

    def __post_init__(self) -> None:
        if not self.seconds > 0:
            raise ValueError(f"AfterLateDelay: seconds must be > 0, got {self.seconds!r}")


@dataclass
class FixedLateness:
    """A fixed allowed lateness; what a float ``cleanup`` argument becomes."""

    seconds: float

    def __post_init__(self) -> None:
        if not self.seconds >= 0:
            raise ValueError(f"cleanup: allowed lateness must be >= 0 seconds, got {self.seconds!r}")

    def observe(self, offset: float) -> None:
        pass

    def allowed_lateness(self) -> float:
        return self.seconds


LateTrigger = ScheduledLateTrigger | EveryNLateEvents | AfterLateDelay
Cleanup = float | CleanupPolicy


def as_cleanup(cleanup: Cleanup) -> CleanupPolicy:
    """A float becomes :class:`FixedLateness`; a policy object is checked and kept."""
    if isinstance(cleanup, bool):
        raise TypeError("cleanup must be a float (seconds) or a CleanupPolicy, got a bool")
    if isinstance(cleanup, (int, float)):
        return FixedLateness(float(cleanup))
    if not isinstance(cleanup, CleanupPolicy):
        raise TypeError(
            "cleanup must be a float (allowed lateness, seconds) or an object with "
            f"observe(offset) and allowed_lateness(), got {cleanup!r}")
    return cleanup


def check_trigger(trigger: object) -> LateTrigger:
    if isinstance(trigger, (EveryNLateEvents, AfterLateDelay, ScheduledLateTrigger)):
        return trigger  # type: ignore[return-value]
    raise TypeError(
        "trigger must be EveryNLateEvents, AfterLateDelay or an object with "
        f"late_firing_offsets(allowed_lateness), got {trigger!r}")
