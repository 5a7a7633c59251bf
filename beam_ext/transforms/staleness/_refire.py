"""StalenessRefire: on-time and staleness-planned late panes, on the lateness pane engine."""
from __future__ import annotations

from dataclasses import dataclass

import apache_beam as beam
from apache_beam.transforms.window import GlobalWindows, NonMergingWindowFn
from apache_beam.utils.timestamp import Duration

from beam_ext.transforms.lateness._beam_panes import (
    _ByEncodedKey,
    _keep_late_data,
    _kv_coders,
    _LatePaneTransform,
    _PaneFn,
)
from beam_ext.transforms.lateness.triggers import FixedLateness
from beam_ext.transforms.staleness._trigger import StalenessTrigger

METRICS_NAMESPACE = "beam_ext.staleness"


@dataclass(frozen=True)
class _PlannedOffsets:
    """A trigger's plan, fixed when the pipeline is built: workers fire it as is."""

    offsets: tuple[float, ...]

    def late_firing_offsets(self, allowed_lateness: float) -> list[float]:
        return list(self.offsets)


class StalenessRefire(_LatePaneTransform):
    """Group a keyed, windowed PCollection with staleness-planned late panes.

    Input: ``(key, value)`` elements in non-merging windows (fixed or
    sliding). Output, the same shape as ``LateWindowedGroupByKey``'s: the
    panes, ``(key, [values])`` per key and window, each in its window with
    the timestamp ``window.max_timestamp()`` and Beam ``PaneInfo`` (first,
    last, ON_TIME/LATE, index):

    * the on-time pane, when the watermark reaches the window's end;
    * a late pane at each offset of ``trigger.late_firing_offsets(T)`` that
      saw new late data;
    * a final pane (``is_last``) at T if late data is still unreported;
      then the window's state is purged.

    ``accumulate=True`` re-executes over all values so far (Aion's
    re-execution), ``False`` emits only new ones. Values for a window
    already closed (more than T late) are dead letters: counted, and
    returned unchanged as ``(key, value)`` by :meth:`with_dead_letters`,
    which makes the transform return ``(panes, dead_letters)``. Counters,
    namespace ``beam_ext.staleness``: ``dead_letter``, ``late_panes``,
    ``late_events``, ``firings_without_new_data``.

    The schedule is planned once, when the pipeline is built, from the
    trigger's history; the panes come from the lateness pane engine with a
    fixed allowed lateness T. Runs on any runner with state and event-time
    timers; it re-windows its input with allowed lateness 2T so the runner
    keeps state until the close and can still route too-late elements to
    the dead letters for another T (beyond that, the runner's own late-data
    policy applies).

    Example::

        trigger = StalenessTrigger(0.05, allowed_lateness=600, history=past_offsets)
        panes, too_late = (events
                           | beam.WindowInto(beam.window.FixedWindows(60))
                           | beam.Map(lambda e: (e["user"], e["amount"]))
                           | StalenessRefire(trigger).with_dead_letters())
    """

    _NAMESPACE = METRICS_NAMESPACE

    def __init__(self, trigger: StalenessTrigger, accumulate: bool = True,
                 label: str | None = None) -> None:
        super().__init__(label)
        if not hasattr(trigger, "late_firing_offsets"):
            raise TypeError(f"trigger must have late_firing_offsets(allowed_lateness), "
                            f"got {trigger!r}")
        t = getattr(trigger, "allowed_lateness", None)
        if t is None:
            raise ValueError("trigger: StalenessRefire needs the trigger's allowed_lateness "
                             "(StalenessTrigger(..., allowed_lateness=T))")
        self._trigger = trigger
        self._t = float(t)
        self._accumulate = accumulate

    def _tagged(self, pcoll: beam.PCollection) -> beam.PCollection:
        windowfn = pcoll.windowing.windowfn
        if not isinstance(windowfn, NonMergingWindowFn) or isinstance(windowfn, GlobalWindows):
            raise ValueError(f"StalenessRefire needs non-merging windows that end (fixed, "
                             f"sliding); the input uses {type(windowfn).__name__}")
        plan = _PlannedOffsets(tuple(float(x) for x in self._trigger.late_firing_offsets(self._t)))
        panes = _PaneFn(plan, FixedLateness(self._t), self._accumulate, self._NAMESPACE)
        return (pcoll
                | "KeepStateForLateness" >> _keep_late_data(pcoll, Duration(2 * self._t))
                | "Refire" >> _ByEncodedKey(panes, _kv_coders(pcoll, self.label)[0]))
