"""Late panes over Beam state and timers, and the output shape of the late-pane transforms.

A late-pane transform (:class:`_LatePaneTransform`) keeps past windows open
for late data and re-fires them. Its stateful step emits tagged elements,
``("pane", (key, values))`` carrying Beam ``PaneInfo`` and ``("dead", (key,
value))`` for values of a closed window; one stateless step splits them into
the transform's outputs and counts them. Every late-pane transform therefore
has one output shape:

* ``pcoll | transform`` is the panes: ``(key, [values])`` in the window they
  belong to, with timestamp ``window.max_timestamp()`` and ``PaneInfo``
  (ON_TIME index 0 ``is_first``, then LATE, the last one ``is_last``);
* ``pcoll | transform.with_dead_letters()`` is ``(panes, dead_letters)``,
  the dead letters being the ``(key, value)`` elements unchanged;

and one metric style: counters in the transform's namespace
(``beam_ext.<capability>``) named ``dead_letter``, ``late_panes``,
``late_events`` and ``firings_without_new_data``.

:class:`_PaneFn` is the stateful step for scheduled triggers: it keeps a
:class:`~beam_ext.transforms.lateness._transitions._PaneState` and the
window's values in Beam state and runs the pane transitions at each value and
event-time timer, so it runs on every Beam runner. :class:`_EventPaneFn`
extends it with the event-driven triggers (``EveryNLateEvents``,
``AfterLateDelay``). A runner's own implementation of the stateful step (the
Spark-native path) emits the same tagged elements (:func:`_pane_output`,
:func:`_dead_output`) and counts the same counters.
"""
from __future__ import annotations

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
from apache_beam.transforms.window import NonMergingWindowFn, WindowFn
from apache_beam.utils.timestamp import Duration, Timestamp
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue

from beam_ext.transforms.lateness._transitions import (
    _PaneState,
    fire_now,
    on_delay,
    on_element,
    on_point,
    on_time,
)
from beam_ext.transforms.lateness.triggers import (
    CleanupPolicy,
    LateTrigger,
    ScheduledLateTrigger,
    check_trigger,
)

PANE, DEAD = "pane", "dead"  # tags of the stateful step's output
DEAD_LETTER = "dead_letter"  # the dead-letter output, and its counter
LATE_PANES = "late_panes"
LATE_EVENTS = "late_events"
FIRINGS_WITHOUT_NEW_DATA = "firings_without_new_data"


class _LatePaneTransform(beam.PTransform):
    """Base of the late-pane transforms: gives them their output shape (module docstring).

    A subclass sets ``_NAMESPACE`` and implements :meth:`_tagged`, which
    turns the input into the tagged elements of its stateful step.
    """

    _NAMESPACE: str

    def _tagged(self, pcoll: beam.PCollection) -> beam.PCollection:
        raise NotImplementedError

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        return self._split(pcoll)[0]

    def with_dead_letters(self) -> _WithDeadLetters:
        """This transform, returning ``(panes, dead_letters)`` instead of ``panes``."""
        return _WithDeadLetters(self)

    def _split(self, pcoll: beam.PCollection) -> tuple[beam.PCollection, beam.PCollection]:
        out = self._tagged(pcoll) | "Split" >> beam.ParDo(
            _SplitPanes(self._NAMESPACE)).with_outputs(DEAD_LETTER, main="panes")
        return out.panes, out[DEAD_LETTER]


class _WithDeadLetters(beam.PTransform):
    def __init__(self, inner: _LatePaneTransform) -> None:
        super().__init__(inner.label)
        self._inner = inner

    def expand(self, pcoll: beam.PCollection) -> tuple[beam.PCollection, beam.PCollection]:
        return self._inner._split(pcoll)


class _SplitPanes(beam.DoFn):
    """Panes to the main output, dead letters to a tagged output; both counted.

    Counted here, in a stateless step, rather than in the stateful one:
    whatever produced the tagged elements, the counts are the same.
    """

    def __init__(self, namespace: str) -> None:
        self._dead = beam.metrics.Metrics.counter(namespace, DEAD_LETTER)
        self._late_panes = beam.metrics.Metrics.counter(namespace, LATE_PANES)

    def process(self, tagged: tuple[str, Any],
                pane: PaneInfo = beam.DoFn.PaneInfoParam) -> Iterable[Any]:
        tag, payload = tagged
        if tag == PANE:
            if pane.timing == PaneInfoTiming.LATE:
                self._late_panes.inc()
            yield payload
        else:
            self._dead.inc()
            yield beam.pvalue.TaggedOutput(DEAD_LETTER, payload)


class _KeepWindows(NonMergingWindowFn):
    """``windowfn``, except that an element already in a window stays in it.

    Re-windowing an element of several (sliding) windows with ``windowfn``
    itself would put it in each of them once per window it is in already.
    """

    def __init__(self, windowfn: WindowFn) -> None:
        self._windowfn = windowfn

    def assign(self, context: WindowFn.AssignContext) -> list:
        # No window: an output timestamped anew downstream, assigned as usual.
        return [context.window] if context.window is not None else self._windowfn.assign(context)

    def get_window_coder(self) -> coders.Coder:
        return self._windowfn.get_window_coder()

    def __eq__(self, other: object) -> bool:
        return type(other) is _KeepWindows and self._windowfn == other._windowfn

    def __hash__(self) -> int:
        return hash(self._windowfn)


def _keep_late_data(pcoll: beam.PCollection, lateness: Duration) -> beam.WindowInto:
    """``pcoll``'s windows, kept open ``lateness`` past their end: Beam drops
    values behind a window's allowed lateness before any DoFn sees them."""
    return beam.WindowInto(_KeepWindows(pcoll.windowing.windowfn), allowed_lateness=lateness)


def _kv_coders(pcoll: beam.PCollection, step_label: str) -> tuple[coders.Coder, coders.Coder]:
    """Key and value coders of ``(key, value)`` input; the key coder is
    deterministic, as GroupByKey's, because windows are grouped by its bytes.
    A key it cannot encode so raises ``TypeError`` naming ``step_label``."""
    coder = coders.registry.get_coder(pcoll.element_type)
    if not coder.is_kv_coder():
        coder = coders.FastPrimitivesCoder()
    return coder.key_coder().as_deterministic_coder(step_label), coder.value_coder()


class _ByEncodedKey(beam.PTransform):
    """A stateful late-pane DoFn run with the key's encoding as its key.

    State and timers keyed by the bytes GroupByKey groups by (and the native
    path partitions by): runners may merge the timers of keys equal in
    Python but encoded apart (0.0 and -0.0, 1 and True), losing panes.
    """

    def __init__(self, fn: beam.DoFn, key_coder: coders.Coder) -> None:
        super().__init__()
        self._fn = fn
        self._key_coder = key_coder

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        return (pcoll
                | "EncodeKey" >> beam.Map(_encode_key, self._key_coder).with_output_types(
                    tuple[bytes, Any])
                | "Panes" >> beam.ParDo(self._fn)
                | "DecodeKey" >> beam.Map(_decode_key, self._key_coder))


def _encode_key(element: tuple[Any, Any], key_coder: coders.Coder) -> tuple[bytes, Any]:
    return key_coder.encode(element[0]), element[1]


def _decode_key(tagged: tuple[str, tuple[bytes, Any]],
                key_coder: coders.Coder) -> tuple[str, tuple[Any, Any]]:
    """A tagged pane or dead letter with its key as it came in."""
    tag, (key, payload) = tagged
    return tag, (key_coder.decode(key), payload)


def _pane_output(key: Any, values: list, window: Any, pane: PaneInfo) -> WindowedValue:
    """A pane as the stateful step emits it."""
    return WindowedValue((PANE, (key, values)), window.max_timestamp(), [window], pane)


def _dead_output(key: Any, value: Any, window: Any) -> WindowedValue:
    """A value of a closed window as a runner's own stateful step emits it."""
    return WindowedValue((DEAD, (key, value)), window.max_timestamp(), [window])


class _PaneFn(beam.DoFn):
    """Per key and window: collect values, fire the panes the transitions decide.

    ``trigger`` fires late panes at event-time offsets (it needs no
    processing-time timer, which would make the DirectRunner fall back to
    its bundle-based runner). ``accumulate``: each pane holds every value so
    far (Aion's re-execution), else only the values since the previous pane.
    Counts ``late_events`` and ``firings_without_new_data`` in ``namespace``.
    """

    META = ReadModifyWriteStateSpec("meta", coders.PickleCoder())
    VALUES = BagStateSpec("values", coders.FastPrimitivesCoder())
    EVENT = TimerSpec("event", TimeDomain.WATERMARK)

    def __init__(self, trigger: LateTrigger, cleanup: CleanupPolicy, accumulate: bool,
                 namespace: str) -> None:
        self._check_trigger(trigger)
        self._trigger = trigger
        self._cleanup = cleanup
        self._accumulate = accumulate
        self._late = beam.metrics.Metrics.counter(namespace, LATE_EVENTS)
        self._skipped = beam.metrics.Metrics.counter(namespace, FIRINGS_WITHOUT_NEW_DATA)

    @staticmethod
    def _check_trigger(trigger: LateTrigger) -> None:
        if not isinstance(trigger, ScheduledLateTrigger):
            raise TypeError(f"trigger must have late_firing_offsets(allowed_lateness), "
                            f"got {trigger!r}")

    def process(self, element: tuple[Any, Any], window=beam.DoFn.WindowParam,
                meta=beam.DoFn.StateParam(META), values=beam.DoFn.StateParam(VALUES),
                event=beam.DoFn.TimerParam(EVENT)) -> Iterable[Any]:
        return self._on_value(element, window, meta, values, event, None)

    def _on_value(self, element: tuple[Any, Any], window: Any, meta: Any, values: Any,
                  event: Any, delay: Any) -> Iterable[Any]:
        """``process``'s body; ``delay``: the processing-time timer, if declared."""
        st = meta.read() or _PaneState()
        action = on_element(st, self._trigger)
        if action == "dead":
            yield (DEAD, element)
            return
        values.add(element[1])
        if action == "buffer":
            event.set(window.max_timestamp())
        else:
            self._late.inc()
            yield from self._on_late_value(action, st, element[0], window, values, delay)
        meta.write(st)

    def _on_late_value(self, action: str, st: _PaneState, key: Any, window: Any, values: Any,
                       delay: Any) -> Iterable[Any]:
        """A scheduled trigger fires from the event-time timer only."""
        return ()

    def _pane(self, key: Any, window: Any, values: Any, pane: PaneInfo) -> WindowedValue:
        """The pane's output; not accumulating, its values leave the state."""
        out = list(values.read())
        if not self._accumulate:
            values.clear()
        return _pane_output(key, out, window, pane)

    @on_timer(EVENT)
    def on_event(self, key=beam.DoFn.KeyParam, window=beam.DoFn.WindowParam,
                 meta=beam.DoFn.StateParam(META), values=beam.DoFn.StateParam(VALUES),
                 event=beam.DoFn.TimerParam(EVENT)) -> Iterable[Any]:
        st = meta.read()
        if st is None or st.purged:
            return
        if not st.on_time_fired:
            size = float(window.end - getattr(window, "start", window.end))
            pane, nxt = on_time(st, self._cleanup, self._trigger, size)
        else:
            pane, nxt, empty = on_point(st, self._cleanup, self._trigger)
            if empty:
                self._skipped.inc()
        if pane is not None:
            yield self._pane(key, window, values, pane)
        if nxt is None:
            values.clear()
        else:
            event.set(window.end + Duration.of(nxt))
        meta.write(st)


class _EventPaneFn(_PaneFn):
    """:class:`_PaneFn` for any late trigger, event-driven ones included.

    ``EveryNLateEvents`` fires as its n-th late value arrives;
    ``AfterLateDelay`` sets a processing-time timer at the first late value
    since the previous pane. Only this class declares that timer, so that
    :class:`_PaneFn` keeps the DirectRunner on its portable runner.
    """

    DELAY = TimerSpec("delay", TimeDomain.REAL_TIME)

    @staticmethod
    def _check_trigger(trigger: LateTrigger) -> None:
        check_trigger(trigger)

    def process(self, element: tuple[Any, Any], window=beam.DoFn.WindowParam,
                meta=beam.DoFn.StateParam(_PaneFn.META),
                values=beam.DoFn.StateParam(_PaneFn.VALUES),
                event=beam.DoFn.TimerParam(_PaneFn.EVENT),
                delay=beam.DoFn.TimerParam(DELAY)) -> Iterable[Any]:
        return self._on_value(element, window, meta, values, event, delay)

    def _on_late_value(self, action: str, st: _PaneState, key: Any, window: Any, values: Any,
                       delay: Any) -> Iterable[Any]:
        if action == "fire":
            yield self._pane(key, window, values, fire_now(st))
        elif action == "delay":
            seconds = self._trigger.seconds  # type: ignore[union-attr]
            delay.set(Timestamp.now() + Duration.of(seconds))

    @on_timer(DELAY)
    def on_delay_timer(self, key=beam.DoFn.KeyParam, window=beam.DoFn.WindowParam,
                       meta=beam.DoFn.StateParam(_PaneFn.META),
                       values=beam.DoFn.StateParam(_PaneFn.VALUES)) -> Iterable[Any]:
        st = meta.read()
        if st is None:
            return
        pane = on_delay(st)
        if pane is not None:
            yield self._pane(key, window, values, pane)
        meta.write(st)
