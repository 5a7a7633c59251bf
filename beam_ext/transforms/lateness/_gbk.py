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
from typing import Any

import apache_beam as beam
from apache_beam import coders
from apache_beam.utils.timestamp import Duration

from beam_ext.transforms._native import native_annotations
from beam_ext.transforms.lateness._beam_panes import (
    _ByEncodedKey,
    _EventPaneFn,
    _keep_late_data,
    _kv_coders,
    _LatePaneTransform,
    _PaneFn,
)
from beam_ext.transforms.lateness.triggers import (
    Cleanup,
    EveryNLateEvents,
    LateTrigger,
    ScheduledLateTrigger,
    as_cleanup,
    check_trigger,
)

__all__ = ["LateWindowedGroupByKey"]

NATIVE_URN = "beam_ext:late_windowed_gbk:v1"  # SparkRunner: runner/native/_lateness.py
METRICS_NAMESPACE = "beam_ext.lateness"
_DEFAULT_POLICY_HORIZON = 30 * 24 * 3600.0


class LateWindowedGroupByKey(_LatePaneTransform):
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

    Values for a purged window are dead letters: counted and, with
    :meth:`with_dead_letters`, returned unchanged as ``(key, value)``; the
    transform then returns ``(panes, dead_letters)``. The output shape is
    ``StalenessRefire``'s. Counters, namespace ``beam_ext.lateness``:
    ``dead_letter``, ``late_panes``, ``late_events``,
    ``firings_without_new_data``; SparkRunner's native path counts them too.

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

    _NAMESPACE = METRICS_NAMESPACE

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

    def _tagged(self, pcoll: beam.PCollection) -> beam.PCollection:
        windowfn = pcoll.windowing.windowfn
        if windowfn.is_merging():
            raise ValueError(
                f"LateWindowedGroupByKey: merging windows ({type(windowfn).__name__}) "
                "are not supported; use fixed or sliding windows")
        gc = self._gc_lateness
        if gc is None:
            gc = self._cleanup.allowed_lateness() + self._horizon
        key_coder, value_coder = _kv_coders(pcoll, self.label)
        # Open past our own cleanup, so that late values reach the dead letters.
        kept = pcoll | "KeepLateData" >> _keep_late_data(pcoll, Duration.of(gc))
        return kept | "Panes" >> _LatePanes(self._trigger, self._cleanup, self._budget,
                                            key_coder, value_coder)


class _LatePanes(beam.PTransform):
    """The stateful step; outputs ("pane", (k, values)) and ("dead", (k, v)).

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
        trigger, cleanup, _, key_coder, _ = self._config
        # Only event-driven triggers need _EventPaneFn's processing-time
        # timer, which sends the DirectRunner to its bundle-based runner.
        fn = _PaneFn if isinstance(trigger, ScheduledLateTrigger) else _EventPaneFn
        return pcoll | "LatePaneFn" >> _ByEncodedKey(
            fn(trigger, cleanup, accumulate=True, namespace=METRICS_NAMESPACE), key_coder)
