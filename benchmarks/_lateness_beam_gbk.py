"""Beam's own streaming GroupByKey, driven in-process like ``_LateEngine``.

The in-memory baseline of benchmarks/lateness.py: the issue asks for "the same
pipeline with Beam's GroupByKey and allowed_lateness". Beam streaming does not
run on our runner, so this runs Beam 2.77's GroupAlsoByWindow machinery the way
the DirectRunner does, with our engine's driving interface
(``element`` / ``advance_watermark`` / ``close``). It mirrors, in
``apache_beam/``:

* ``runners/direct/transform_evaluator.py``, ``_StreamingGroupAlsoByWindowEvaluator``:
  one ``InMemoryUnmergedState`` per key (the DirectRunner's keyed state), the
  driver from ``create_trigger_driver(windowing)`` (a ``GeneralTriggerDriver``),
  ``driver.process_elements(state, values, output_wm, input_wm)`` once per key
  per bundle (here: one bundle per watermark step, handed over at the input
  watermark of the previous step, as pending elements hold it there);
* ``_TransformEvaluator.process_timer_wrapper`` and
  ``runners/direct/watermark_manager.py`` (``extract_all_timers``): when the
  watermark advances, every timer at or before it fires in timestamp order,
  cleared from the keyed state, then ``driver.process_timer(...)``;
  repeated until no timer is due;
* ``transforms/trigger.py``: ``AfterWatermark``, ``OrFinally``, ``TriggerFn``,
  and ``GeneralTriggerDriver._output`` for the ``PaneInfo``.

Windowing: ``Windowing(FixedWindows(size), OrFinally(AfterWatermark(late=
_AtLateOffsets(offsets)), _AtGcTime(allowed_lateness)), ACCUMULATING,
allowed_lateness=allowed_lateness)``. ``_AtLateOffsets`` is a small TriggerFn
firing at ``end + offset``, for the first offset after late data arrived
(event-time timers through ``context.set_timer``), as our engine fires its
late points. Two gaps of Python Beam, filled the way Java Beam fills them:

* ``GeneralTriggerDriver`` has no garbage collection at ``end +
  allowed_lateness`` (Java's ReduceFnRunner fires a final pane there and
  clears the window), and ``AfterWatermark`` never finishes once it has a
  late trigger. ``OrFinally(..., _AtGcTime)`` makes Beam's own driver fire
  and finish the window at that time (``is_last``, state cleared,
  tombstone); as Java's default ``ClosingBehavior.FIRE_IF_NON_EMPTY`` that
  final pane is only emitted if data arrived since the previous pane (here:
  if it holds more values than that pane, the mode being accumulating).
* The driver drops values of expired windows silently, and tests expiry as
  ``input_watermark > window.end + allowed_lateness``, one microsecond
  later than the Beam model (Java's ``LateDataUtils``: expired when
  ``window.max_timestamp() + allowed_lateness < input_watermark``; a value
  arriving exactly at ``end + allowed_lateness`` would be absorbed into a
  finished window and lost). ``element()`` applies the model's rule before
  handing a value over and reports those values to ``dead``.

Known difference from ``_LateEngine``: the first value of a window that
arrives after the watermark passed the window's end fires the first pane
from ``process_elements`` with every value of that window in the bundle, and
the driver labels that pane LATE (``maybe_ontime=False``); our engine fires
an ON_TIME pane on that first value alone.
"""
from __future__ import annotations

import math
from typing import Callable

from apache_beam.transforms import combiners
from apache_beam.transforms.core import Windowing
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.trigger import (
    AccumulationMode,
    AfterWatermark,
    InMemoryUnmergedState,
    OrFinally,
    TriggerFn,
    _CombiningValueStateTag,
    create_trigger_driver,
)
from apache_beam.transforms.window import FixedWindows, IntervalWindow
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Duration, Timestamp
from apache_beam.utils.windowed_value import PaneInfo, WindowedValue

Window = tuple[float, float]
_WATERMARK = TimeDomain.WATERMARK


def _earliest(values):
    return min((v for v in values if v is not None), default=None)


class _Timed(TriggerFn):
    """Event-time-only TriggerFn: no merging, not portable."""

    def on_merge(self, to_be_merged, merge_result, context):
        pass

    def has_ontime_pane(self):
        return False

    def to_runner_api(self, unused_context):
        raise NotImplementedError(f"{type(self).__name__} runs in-process only")

    def get_continuation_trigger(self):
        return self


class _AtLateOffsets(_Timed):
    """Fires at ``window.end + offset``, the first offset after late data arrived.

    Runs under ``AfterWatermark(late=...)`` (so inside ``Repeatedly``, which
    resets it after every firing). The watermark a value arrives at is only
    known in ``should_fire``, which the driver calls after the bundle's values,
    so the timer is armed there.
    """

    COUNT = _CombiningValueStateTag("count", combiners.CountCombineFn())
    DUE = _CombiningValueStateTag("due", _earliest)

    def __init__(self, offsets: list[float]) -> None:
        self.offsets = [Duration.of(o) for o in sorted(offsets)]

    def on_element(self, element, window, context):
        context.add_state(self.COUNT, 1)

    def should_fire(self, time_domain, timestamp, window, context):
        due = context.get_state(self.DUE)
        if due is not None:
            return timestamp >= due
        if context.get_state(self.COUNT):
            due = next((window.end + o for o in self.offsets if window.end + o > timestamp), None)
            if due is not None:
                context.add_state(self.DUE, due)
                context.set_timer("", _WATERMARK, due)
        return False

    def on_fire(self, watermark, window, context):
        return True  # Repeatedly resets it: count and due cleared

    def reset(self, window, context):
        context.clear_state(self.COUNT)
        context.clear_state(self.DUE)
        context.clear_timer("", _WATERMARK)


class _AtGcTime(_Timed):
    """Fires once at ``window.end + allowed_lateness`` and finishes (Java's GC time)."""

    def __init__(self, allowed_lateness: float) -> None:
        self.lateness = Duration.of(allowed_lateness)

    def on_element(self, element, window, context):
        context.set_timer("", _WATERMARK, window.end + self.lateness)

    def should_fire(self, time_domain, timestamp, window, context):
        return timestamp >= window.end + self.lateness

    def on_fire(self, watermark, window, context):
        return True

    def reset(self, window, context):
        context.clear_timer("", _WATERMARK)


class BeamGroupByKeyBaseline:
    """Beam's GeneralTriggerDriver behind ``_LateEngine``'s driving interface."""

    def __init__(self, size: float, allowed_lateness: float, late_offsets: list[float],
                 emit: Callable[[bytes, Window, list[bytes], PaneInfo], None],
                 dead: Callable[[bytes, Window, bytes], None]) -> None:
        offsets = [o for o in late_offsets if 0 < o < allowed_lateness]
        self.windowing = Windowing(
            FixedWindows(size),
            triggerfn=OrFinally(AfterWatermark(late=_AtLateOffsets(offsets)),
                                _AtGcTime(allowed_lateness)),
            accumulation_mode=AccumulationMode.ACCUMULATING,
            allowed_lateness=allowed_lateness)
        self._driver = create_trigger_driver(self.windowing)
        self._lateness = self.windowing.allowed_lateness
        self._emit = emit
        self._dead = dead
        self._states: dict[bytes, InMemoryUnmergedState] = {}
        self._bundle: dict[bytes, list[WindowedValue]] = {}
        self._windows: dict[Window, tuple[IntervalWindow, Timestamp]] = {}  # and its GC time
        self._tuples: dict[IntervalWindow, Window] = {}
        self._emitted: dict[tuple[bytes, IntervalWindow], int] = {}  # values in last pane
        self._watermark = MIN_TIMESTAMP

    def element(self, key: bytes, window: Window, value: bytes) -> None:
        w = self._windows.get(window)
        if w is None:
            iw = IntervalWindow(*window)
            w = self._windows[window] = (iw, iw.max_timestamp() + self._lateness)
            self._tuples[iw] = window
        iw, gc_time = w
        if gc_time < self._watermark:  # expired: Beam drops it
            self._dead(key, window, value)
            return
        bundle = self._bundle.get(key)
        if bundle is None:
            bundle = self._bundle[key] = []
        bundle.append(WindowedValue(value, iw.start, (iw,)))

    def advance_watermark(self, w: float) -> None:
        watermark = MAX_TIMESTAMP if w == math.inf else Timestamp.of(w)
        if watermark < self._watermark:
            raise ValueError(f"watermark cannot go back from {self._watermark} to {watermark}")
        # The step's bundle, one KeyedWorkItem per key, at the old input watermark.
        # The output watermark equals the input one: holds are only set for
        # windows whose end is still ahead of the watermark.
        for key, values in self._bundle.items():
            state = self._states.get(key)
            if state is None:
                state = self._states[key] = InMemoryUnmergedState()
            for wv in self._driver.process_elements(state, values, self._watermark,
                                                    self._watermark):
                self._output(key, wv)
        self._bundle = {}
        self._watermark = watermark
        while True:  # fire due timers, in timestamp order, until none is due
            fired = [(ts, key, wid, name, domain)
                     for key, state in self._states.items()
                     for wid, (name, domain, ts, _) in state.get_timers(watermark=watermark)[0]]
            if not fired:
                break
            fired.sort(key=lambda f: f[0])
            for ts, key, wid, name, domain in fired:
                state = self._states[key]
                state.clear_timer(wid, name, domain)
                for wv in self._driver.process_timer(wid, name, domain, ts, state, watermark):
                    self._output(key, wv)

    def _output(self, key: bytes, wv: WindowedValue) -> None:
        iw, pane, values = wv.windows[0], wv.pane_info, wv.value
        kw = (key, iw)
        if pane.is_last:
            if self._emitted.pop(kw, -1) == len(values):
                return  # FIRE_IF_NON_EMPTY: nothing arrived since the previous pane
        else:
            self._emitted[kw] = len(values)
        self._emit(key, self._tuples[iw], values, pane)

    def close(self) -> None:
        self._states.clear()
        self._bundle.clear()
        self._emitted.clear()
