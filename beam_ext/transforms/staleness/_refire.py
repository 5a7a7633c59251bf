"""StalenessRefire: on-time and staleness-planned late panes with Beam state and timers."""
from __future__ import annotations

from typing import Any

import apache_beam as beam
from apache_beam.coders import BooleanCoder, PickleCoder, VarIntCoder
from apache_beam.transforms import userstate
from apache_beam.transforms.window import GlobalWindows, NonMergingWindowFn
from apache_beam.utils.timestamp import Duration
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue

from beam_ext.transforms.staleness._trigger import StalenessTrigger

METRICS_NAMESPACE = "beam_ext.staleness"
DEAD_LETTER = "dead_letter"

_CLOSED = -1  # firing index once the window's lifetime is over


class _RefireFn(beam.DoFn):
    """Per key and window: collect values, fire at the watermark and at planned offsets.

    Firing 0 is the on-time pane (watermark at the window's end); firing j
    (1..k) is planned offset j; the last firing closes the window at T and
    emits a final pane only if late data is still unreported. State is
    purged at the close; later elements go to the dead-letter output.
    """

    VALUES = userstate.BagStateSpec("values", PickleCoder())
    NEXT_FIRING = userstate.ReadModifyWriteStateSpec("next_firing", VarIntCoder())
    PANES = userstate.ReadModifyWriteStateSpec("panes", VarIntCoder())
    PENDING = userstate.ReadModifyWriteStateSpec("pending", BooleanCoder())
    FIRE = userstate.TimerSpec("fire", userstate.TimeDomain.WATERMARK)

    def __init__(self, offsets: list[float], allowed_lateness: float, accumulate: bool) -> None:
        closing = [] if offsets and offsets[-1] >= allowed_lateness else [allowed_lateness]
        self._late_offsets = [*offsets, *closing]
        self._accumulate = accumulate
        self._late = beam.metrics.Metrics.counter(METRICS_NAMESPACE, "late_events")
        self._dropped = beam.metrics.Metrics.counter(
            METRICS_NAMESPACE, "events_beyond_allowed_lateness")
        self._late_panes = beam.metrics.Metrics.counter(METRICS_NAMESPACE, "late_panes")
        self._skipped = beam.metrics.Metrics.counter(METRICS_NAMESPACE, "firings_without_new_data")

    def _fire_time(self, window, firing: int):
        if firing == 0:
            return window.max_timestamp()
        return window.end + Duration(self._late_offsets[firing - 1])

    def process(self, element, window=beam.DoFn.WindowParam,
                values=beam.DoFn.StateParam(VALUES),
                next_firing=beam.DoFn.StateParam(NEXT_FIRING),
                pending=beam.DoFn.StateParam(PENDING),
                fire=beam.DoFn.TimerParam(FIRE)):
        firing = next_firing.read()
        if firing == _CLOSED:
            self._dropped.inc()
            yield beam.pvalue.TaggedOutput(DEAD_LETTER, element)
            return
        values.add(element[1])
        if firing is None:
            next_firing.write(0)
            fire.set(self._fire_time(window, 0))
        elif firing > 0:
            self._late.inc()
            pending.write(True)

    @userstate.on_timer(FIRE)
    def on_fire(self, key=beam.DoFn.KeyParam, window=beam.DoFn.WindowParam,
                values=beam.DoFn.StateParam(VALUES),
                next_firing=beam.DoFn.StateParam(NEXT_FIRING),
                panes=beam.DoFn.StateParam(PANES),
                pending=beam.DoFn.StateParam(PENDING),
                fire=beam.DoFn.TimerParam(FIRE)):
        firing = next_firing.read()
        if firing is None or firing == _CLOSED:
            return
        last = firing == len(self._late_offsets)
        if firing == 0 or pending.read():
            index = panes.read() or 0
            timing = PaneInfoTiming.ON_TIME if firing == 0 else PaneInfoTiming.LATE
            pane = PaneInfo(is_first=index == 0, is_last=last, timing=timing, index=index,
                            nonspeculative_index=index)
            if firing > 0:
                self._late_panes.inc()
            panes.write(index + 1)
            pending.write(False)
            out = list(values.read())
            if not self._accumulate:
                values.clear()
            yield WindowedValue((key, out), window.max_timestamp(), [window], pane)
        else:
            self._skipped.inc()
        if last:
            values.clear()
            pending.clear()
            panes.clear()
            next_firing.write(_CLOSED)
        else:
            next_firing.write(firing + 1)
            fire.set(self._fire_time(window, firing + 1))


class StalenessRefire(beam.PTransform):
    """Group a keyed, windowed PCollection with staleness-planned late panes.

    Input: ``(key, value)`` elements in non-merging windows (fixed or
    sliding). Output (tag ``panes``): ``(key, [values])`` for the on-time
    pane, when the watermark reaches the window's end, and for a late pane
    at each offset of ``trigger.late_firing_offsets(T)`` that saw new late
    data, plus a final pane at T if late data is still unreported. Panes
    carry Beam ``PaneInfo`` (first, last, ON_TIME/LATE, index) and the
    timestamp ``window.max_timestamp()``; ``accumulate=True`` re-executes
    over all values so far (Aion's re-execution), ``False`` emits only new
    ones. Elements for a window already closed (more than T late) are
    counted in the ``beam_ext.staleness/events_beyond_allowed_lateness``
    metric and emitted unchanged on the ``dead_letter`` output. Other
    metrics: ``late_events``, ``late_panes``, ``firings_without_new_data``.

    The schedule is planned once, when the pipeline is built, from the
    trigger's history. Runs on any runner with state and timers; it
    re-windows its input with allowed lateness 2T so the runner keeps state
    until the close and can still route too-late elements to the dead
    letter for another T (beyond that, the runner's own late-data policy
    applies).

    Example::

        trigger = StalenessTrigger(0.05, allowed_lateness=600, history=past_offsets)
        panes, too_late = (events
                           | beam.WindowInto(beam.window.FixedWindows(60))
                           | beam.Map(lambda e: (e["user"], e["amount"]))
                           | StalenessRefire(trigger))
    """

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

    def expand(self, pcoll: beam.PCollection) -> Any:
        windowfn = pcoll.windowing.windowfn
        if not isinstance(windowfn, NonMergingWindowFn) or isinstance(windowfn, GlobalWindows):
            raise ValueError(f"StalenessRefire needs non-merging windows that end (fixed, "
                             f"sliding); the input uses {type(windowfn).__name__}")
        offsets = [float(x) for x in self._trigger.late_firing_offsets(self._t)]
        return (pcoll
                | "KeepStateForLateness" >> beam.WindowInto(
                    windowfn, allowed_lateness=Duration(2 * self._t))
                | "Refire" >> beam.ParDo(_RefireFn(offsets, self._t, self._accumulate))
                .with_outputs(DEAD_LETTER, main="panes"))
