"""LateWindowedGroupByKey: GroupByKey that keeps past windows open for late data.

Aion (000_4f6b9364720acf91.txt, sections 3-4) re-executes a window whenever
late events change it, keeping the window's whole state until a cleanup
policy closes it. This transform does that over Beam state and timers, so it
runs on any Beam runner; on SparkRunner a native implementation keeps the
window state in a :class:`~beam_ext.state.SpillStore` instead, so memory stays
bounded however many past windows are open.
"""
from __future__ import annotations

import pickle
from typing import Any, Iterable

import apache_beam as beam
from apache_beam import coders
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (
    BagStateSpec,
    ReadModifyWriteStateSpec,
    TimerSpec,
    on_timer,
)
from apache_beam.utils.timestamp import Duration, Timestamp
from apache_beam.utils.windowed_value import PaneInfo, WindowedValue

from beam_ext.transforms._native import native_annotations
from beam_ext.transforms.lateness import _transitions as panes
from beam_ext.transforms.lateness.triggers import (
    Cleanup,
    EveryNLateEvents,
    LateTrigger,
    as_cleanup,
    check_trigger,
)

__all__ = ["LateWindowedGroupByKey"]

NATIVE_URN = "beam_ext:late_windowed_gbk:v1"  # SparkRunner: runner/native/_lateness.py
_NAMESPACE = "beam_ext.lateness"
_DEAD_COUNTER = "dead_letter"
_DEFAULT_POLICY_HORIZON = 30 * 24 * 3600.0


class LateWindowedGroupByKey(beam.PTransform):
    """Group ``(key, value)`` pairs per window, re-firing past windows on late data.

    Emits ``(key, [values])`` panes, each with Beam ``PaneInfo``:

    * an ON_TIME pane when the watermark passes the window's end (index 0,
      ``is_first``);
    * LATE panes (accumulating: all values so far) by ``trigger``:
      :class:`EveryNLateEvents`, :class:`AfterLateDelay`, or any object with
      ``late_firing_offsets(allowed_lateness)`` such as ``StalenessTrigger``;
    * when ``cleanup`` closes the window (a float: fixed allowed lateness in
      seconds; or a policy with ``observe``/``allowed_lateness`` such as
      ``PredictiveCleanup``, asked when the on-time pane fires), a last pane
      (``is_last``) if late data arrived since the previous pane; then the
      window's state is purged.

    Values for a purged window are counted in the ``beam_ext.lateness /
    dead_letter`` counter and, with :meth:`with_dead_letters`, returned.

    Example::

        panes = (events
                 | beam.WindowInto(beam.window.FixedWindows(20))
                 | LateWindowedGroupByKey(trigger=EveryNLateEvents(100),
                                          cleanup=10 * 20))

    ``dead_letter_horizon``: how long (event-time seconds after the window's
    close) purged windows still route values to the dead letters before the
    runner drops them; default: the allowed lateness again, or 30 days for a
    policy. ``memory_budget_bytes`` bounds the spill store's memory per
    Spark task.
    """

    def __init__(self, trigger: LateTrigger | None = None, cleanup: Cleanup = 0.0,
                 memory_budget_bytes: int = 64 << 20,
                 dead_letter_horizon: float | None = None) -> None:
        super().__init__()
        self._trigger = check_trigger(trigger if trigger is not None else EveryNLateEvents(1))
        self._cleanup = as_cleanup(cleanup)
        if not isinstance(memory_budget_bytes, int) or memory_budget_bytes <= 0:
            raise ValueError(f"memory_budget_bytes must be a positive int, got {memory_budget_bytes!r}")
        if dead_letter_horizon is not None and not dead_letter_horizon >= 0:
            raise ValueError(f"dead_letter_horizon must be >= 0 seconds, got {dead_letter_horizon!r}")
        self._budget = memory_budget_bytes
        if dead_letter_horizon is None:
            fixed = isinstance(cleanup, (int, float))
            dead_letter_horizon = float(cleanup) if fixed else _DEFAULT_POLICY_HORIZON
            self._gc_lateness = (2 * float(cleanup) if fixed
                                 else _DEFAULT_POLICY_HORIZON)
        else:
            self._gc_lateness = None
        self._horizon = float(dead_letter_horizon)

    def with_dead_letters(self) -> "_WithDeadLetters":
        """This transform, returning ``(panes, dead_letters)`` instead of ``panes``."""
        return _WithDeadLetters(self)

    def _tagged(self, pcoll: beam.PCollection) -> beam.PCollection:
        windowfn = pcoll.windowing.windowfn
        if windowfn.is_merging():
            raise ValueError(
                f"LateWindowedGroupByKey: merging windows ({type(windowfn).__name__}) "
                "are not supported; use fixed or sliding windows")
        gc = self._gc_lateness
        if gc is None:
            gc = self._cleanup.allowed_lateness() + self._horizon
        key_coder, value_coder = _kv_coders(pcoll)
        # Beam drops values behind a window's allowed lateness before any
        # DoFn sees them; the window must stay open past our own cleanup so
        # that late values reach the dead letters.
        kept = pcoll | "KeepLateData" >> beam.WindowInto(
            windowfn, allowed_lateness=Duration.of(gc))
        return kept | "Panes" >> _LatePanes(self._trigger, self._cleanup, self._budget,
                                            key_coder, value_coder)

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        return self._split(pcoll)[0]

    def _split(self, pcoll: beam.PCollection) -> tuple[beam.PCollection, beam.PCollection]:
        out = self._tagged(pcoll) | "Split" >> beam.ParDo(_SplitDeadLetters()).with_outputs(
            "dead_letter", main="panes")
        return out.panes, out.dead_letter


class _WithDeadLetters(beam.PTransform):
    def __init__(self, inner: LateWindowedGroupByKey) -> None:
        super().__init__()
        self._inner = inner

    def expand(self, pcoll: beam.PCollection) -> tuple[beam.PCollection, beam.PCollection]:
        return self._inner._split(pcoll)


class _SplitDeadLetters(beam.DoFn):
    """Panes to the main output; dead letters to a tagged output, counted.

    Counted here rather than in the stateful step so that both the Beam path
    and the Spark-native path report through one stateless Beam step.
    """

    def __init__(self) -> None:
        self._dead = beam.metrics.Metrics.counter(_NAMESPACE, _DEAD_COUNTER)

    def process(self, tagged: tuple[str, Any]) -> Iterable[Any]:
        tag, payload = tagged
        if tag == "pane":
            yield payload
        else:
            self._dead.inc()
            yield beam.pvalue.TaggedOutput("dead_letter", payload)


def _kv_coders(pcoll: beam.PCollection) -> tuple[coders.Coder, coders.Coder]:
    """Key and value coders of ``(key, value)`` input; the key coder is
    deterministic, as GroupByKey's, because windows are grouped by its bytes."""
    coder = coders.registry.get_coder(pcoll.element_type)
    if not coder.is_kv_coder():
        coder = coders.FastPrimitivesCoder()
    return (coder.key_coder().as_deterministic_coder("LateWindowedGroupByKey key"),
            coder.value_coder())


class _LatePanes(beam.PTransform):
    """The stateful part; outputs ("pane", (k, values)) and ("dead", (k, v)).

    On SparkRunner this is replaced by ``beam_ext.runner.native._lateness``.
    """

    def __init__(self, trigger: LateTrigger, cleanup: Any, budget: int,
                 key_coder: coders.Coder, value_coder: coders.Coder) -> None:
        super().__init__()
        self._config = (trigger, cleanup, budget, key_coder, value_coder)

    def annotations(self) -> dict[str, Any]:
        return {**super().annotations(),
                **native_annotations(NATIVE_URN, pickle.dumps(self._config))}

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        trigger, cleanup = self._config[:2]
        return pcoll | "LatePaneFn" >> beam.ParDo(_LatePaneFn(trigger, cleanup))


def _pane_output(key: Any, values: list, window: Any, pane: PaneInfo) -> WindowedValue:
    return WindowedValue(("pane", (key, values)), window.max_timestamp(), [window], pane)


class _LatePaneFn(beam.DoFn):
    META = ReadModifyWriteStateSpec("meta", coders.PickleCoder())
    VALUES = BagStateSpec("values", coders.FastPrimitivesCoder())
    EVENT = TimerSpec("event", TimeDomain.WATERMARK)
    DELAY = TimerSpec("delay", TimeDomain.REAL_TIME)

    def __init__(self, trigger: LateTrigger, cleanup: Any) -> None:
        self._trigger = trigger
        self._cleanup = cleanup

    def process(self, element: tuple[Any, Any], window=beam.DoFn.WindowParam,
                meta=beam.DoFn.StateParam(META), values=beam.DoFn.StateParam(VALUES),
                event=beam.DoFn.TimerParam(EVENT),
                delay=beam.DoFn.TimerParam(DELAY)) -> Iterable[Any]:
        key, value = element
        st = meta.read() or panes._PaneState()
        action = panes.on_element(st, self._trigger)
        if action == "dead":
            yield ("dead", element)
            return
        values.add(value)
        if action == "buffer":
            event.set(window.max_timestamp())
        elif action == "fire":
            pane = panes.fire_now(st)
            yield _pane_output(key, list(values.read()), window, pane)
        elif action == "delay":
            seconds = self._trigger.seconds  # type: ignore[union-attr]
            delay.set(Timestamp.now() + Duration.of(seconds))
        meta.write(st)

    @on_timer(EVENT)
    def on_event(self, key=beam.DoFn.KeyParam, window=beam.DoFn.WindowParam,
                 meta=beam.DoFn.StateParam(META), values=beam.DoFn.StateParam(VALUES),
                 event=beam.DoFn.TimerParam(EVENT)) -> Iterable[Any]:
        st = meta.read()
        if st is None or st.purged:
            return
        if not st.on_time_fired:
            size = float(window.end - getattr(window, "start", window.end))
            pane, nxt = panes.on_time(st, self._cleanup, self._trigger, size)
        else:
            pane, nxt = panes.on_point(st, self._cleanup, self._trigger)
        if pane is not None:
            yield _pane_output(key, list(values.read()), window, pane)
        if nxt is None:
            values.clear()
        else:
            event.set(window.end + Duration.of(nxt))
        meta.write(st)

    @on_timer(DELAY)
    def on_delay(self, key=beam.DoFn.KeyParam, window=beam.DoFn.WindowParam,
                 meta=beam.DoFn.StateParam(META),
                 values=beam.DoFn.StateParam(VALUES)) -> Iterable[Any]:
        st = meta.read()
        if st is None:
            return
        pane = panes.on_delay(st)
        if pane is not None:
            yield _pane_output(key, list(values.read()), window, pane)
        meta.write(st)
