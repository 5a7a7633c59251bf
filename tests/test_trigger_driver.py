"""Our trigger driver gives Beam's GeneralTriggerDriver's panes and state, call by call.

Both drivers run the same micro-batches of one key, as a streaming
GroupByKey task runs them (``worker/_streaming_group.py``): new elements
under the watermarks the group had before the batch, then every timer due
under the new input watermark. After each batch the panes emitted and the
whole per-key state (elements, holds, tombstones, pane indices, timers)
must be equal.
"""
from __future__ import annotations

import pickle

import pytest
from apache_beam.transforms import trigger, window
from apache_beam.transforms.core import Windowing
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp
from apache_beam.utils.windowed_value import PaneInfoTiming, WindowedValue
from hypothesis import example, given, settings
from hypothesis import strategies as st

from beam_ext.runner.worker._streaming_group import _forget_unreachable, _freeze, _reach, _thaw, _Windows
from beam_ext.runner.worker._trigger_driver import MergingTriggerDriver, NonMergingTriggerDriver, trigger_driver

_WINDOW_FNS = [window.GlobalWindows(), window.FixedWindows(10), window.SlidingWindows(10, 5)]
_COMBINERS = [window.TimestampCombiner.OUTPUT_AT_EOW, window.TimestampCombiner.OUTPUT_AT_EARLIEST,
              window.TimestampCombiner.OUTPUT_AT_LATEST]


# The default trigger, and triggers whose state is nested or counted per element.
_TRIGGERS = [
    lambda n: trigger.DefaultTrigger(),
    lambda n: trigger.AfterWatermark(early=trigger.AfterCount(n)),
    lambda n: trigger.AfterWatermark(early=trigger.AfterCount(n), late=trigger.AfterCount(1)),
    lambda n: trigger.AfterWatermark(early=trigger.AfterProcessingTime(5), late=trigger.AfterCount(n)),
    lambda n: trigger.Repeatedly(trigger.AfterCount(n)),
    lambda n: trigger.AfterCount(n),
    lambda n: trigger.Repeatedly(trigger.AfterAny(trigger.AfterCount(n), trigger.AfterWatermark())),
    lambda n: trigger.AfterEach(trigger.AfterCount(n), trigger.AfterCount(1)),
    lambda n: trigger.OrFinally(trigger.Repeatedly(trigger.AfterCount(1)), trigger.AfterCount(n + 2)),
]


class _Clock:
    def time(self) -> float:
        return 0.0


@st.composite
def runs(draw):
    """A windowing strategy with one of the triggers, and micro-batches of
    (elements as (value, timestamp), watermark after the batch)."""
    make_trigger = draw(st.sampled_from(_TRIGGERS))
    windowing = Windowing(draw(st.sampled_from(_WINDOW_FNS)), triggerfn=make_trigger(draw(st.integers(1, 3))),
                          accumulation_mode=draw(st.sampled_from([trigger.AccumulationMode.DISCARDING,
                                                                  trigger.AccumulationMode.ACCUMULATING])),
                          timestamp_combiner=draw(st.sampled_from(_COMBINERS)),
                          allowed_lateness=draw(st.sampled_from([0, 5, 20])))
    batches, value, watermark = [], 0, -5
    for _ in range(draw(st.integers(1, 6))):
        stamps = draw(st.lists(st.integers(0, 50), max_size=8))
        elements = [(value + i, ts) for i, ts in enumerate(stamps)]
        value += len(stamps)
        watermark = draw(st.sampled_from([watermark, watermark + draw(st.integers(1, 25))]))
        batches.append((elements, watermark))
    return windowing, batches


def _snapshot(state: trigger.InMemoryUnmergedState) -> tuple:
    return ({w: dict(t) for w, t in state.timers.items() if t},
            {w: {tag: list(v) for tag, v in tags.items()} for w, tags in state.state.items() if tags},
            {tag: dict(value) if isinstance(value, dict) else value  # window ids, changed in place later
             for tag, value in state.global_state.items()})


def _pane(wv) -> tuple:
    return wv.value, wv.timestamp, wv.windows, wv.pane_info


def _run(driver, windowing, batches, task_windows: bool = False, gathered: bool = False,
         forget: bool = False) -> list:
    """Each batch's panes and the state after it, as ``run_streaming_group`` drives a key.

    With ``task_windows``, as the group task does it: the state is saved and
    read back between batches, and each batch's windows, the read state's
    included, are one object per window (``_Windows``). With ``gathered``
    too, the elements come as the task reads them from a shuffle gathered
    by windows: ``(windows, values)`` records, no timestamps. With
    ``forget``, after each batch the windows no element can reach are
    dropped, as the group task drops them (``_forget_unreachable``)."""
    state = trigger.InMemoryUnmergedState()
    output_watermark = input_watermark = MIN_TIMESTAMP
    seen = []
    for elements, after in batches:
        objects = _Windows()
        if task_windows:
            state = _thaw(pickle.loads(pickle.dumps(_freeze(state))), objects)
        values = []
        for value, ts in elements:
            stamp = Timestamp(ts)
            windows = windowing.windowfn.assign(window.WindowFn.AssignContext(stamp, element=value))
            values.append(WindowedValue(value, stamp, objects.of(tuple(windows)) if task_windows else windows))
        if gathered:
            records: dict[tuple, list] = {}
            for wv in values:
                records.setdefault(wv.windows, []).append(wv.value)
            called = driver.process_elements(state, (), output_watermark, input_watermark,
                                             gathered=list(records.items()))
        else:
            called = driver.process_elements(state, values, output_watermark, input_watermark)
        panes = [_pane(p) for p in called]
        input_watermark = Timestamp(after)
        while True:
            fired, _ = state.get_timers(clear=True, watermark=input_watermark, processing_time=0.0)
            if not fired:
                break
            for fired_window, (name, domain, timestamp, _tag) in fired:
                panes += [_pane(p) for p in driver.process_timer(
                    fired_window, name, domain, timestamp, state, input_watermark)]
        output_watermark = input_watermark
        if forget:
            _forget_unreachable(state, input_watermark, _reach(windowing))
        seen.append((panes, _snapshot(state)))
    return seen


def _equals_beams(driver_class, windowing, batches) -> list:
    """Asserts a driver of ``driver_class`` runs ``batches`` as Beam's driver does,
    also with the state saved and read back between batches; returns Beam's run."""
    beams = _run(trigger.GeneralTriggerDriver(windowing, _Clock()), windowing, batches)
    driver = driver_class(windowing, _Clock())
    assert _run(driver, windowing, batches) == beams
    assert _run(driver_class(windowing, _Clock()), windowing, batches, task_windows=True) == beams
    # Nested triggers make a new state tag at every access: the views made stay few.
    assert len(driver._views) <= 8
    return beams


@settings(max_examples=400, deadline=None)
@given(runs())
def test_our_driver_equals_beams_driver(run):
    windowing, batches = run
    beams = _equals_beams(NonMergingTriggerDriver, windowing, batches)
    if windowing.timestamp_combiner == window.TimestampCombiner.OUTPUT_AT_EOW:
        # Gathered by windows, a window's values come in another order, which a pane leaves unspecified.
        gathered = _run(NonMergingTriggerDriver(windowing, _Clock()), windowing, batches, task_windows=True,
                        gathered=True)
        assert _unordered(gathered) == _unordered(beams)


# Triggers that merge with their windows (Beam's AfterCount keeps a count per window, merged by adding).
_MERGING_TRIGGERS = [
    lambda n: trigger.DefaultTrigger(),
    lambda n: trigger.AfterWatermark(early=trigger.AfterCount(n)),
    lambda n: trigger.AfterWatermark(early=trigger.AfterCount(n), late=trigger.AfterCount(1)),
    lambda n: trigger.Repeatedly(trigger.AfterCount(n)),
]


@st.composite
def session_runs(draw):
    """As :func:`runs`, in sessions, with elements of one batch far enough apart to start several."""
    windowing, batches = draw(runs())
    return Windowing(window.Sessions(draw(st.sampled_from([1, 3, 8]))),
                     triggerfn=draw(st.sampled_from(_MERGING_TRIGGERS))(draw(st.integers(1, 3))),
                     accumulation_mode=windowing.accumulation_mode, timestamp_combiner=windowing.timestamp_combiner,
                     allowed_lateness=windowing.allowed_lateness), batches


@settings(max_examples=300, deadline=None)
@given(session_runs())
def test_our_merging_driver_equals_beams_driver(run):
    _equals_beams(MergingTriggerDriver, *run)


def _pending(snapshot: tuple) -> list:
    """A state snapshot's pending timers, whatever the ids of their windows."""
    return sorted(repr(item) for timers in snapshot[0].values() for item in timers.items())


@settings(max_examples=300, deadline=None)
@given(st.one_of(runs(), session_runs()))
# A session past its lateness that a later element's session still merges with.
@example((Windowing(window.Sessions(3), accumulation_mode=trigger.AccumulationMode.ACCUMULATING),
          [([(1, 10)], 14), ([(2, 12)], 30)]))
def test_windows_no_element_can_reach_are_dropped_and_the_panes_stay_beams(run):
    """The group task drops a key's windows that ended more than the allowed
    lateness (and the gap, for sessions) before the watermark, without timers
    or holds: Beam's driver, which keeps them, fires the same panes and keeps
    the same timers."""
    windowing, batches = run
    beams = _run(trigger.GeneralTriggerDriver(windowing, _Clock()), windowing, batches)
    driver = trigger_driver(windowing, _Clock())
    ours = _run(driver, windowing, batches, task_windows=True, forget=True)
    assert [panes for panes, _ in ours] == [panes for panes, _ in beams]
    assert [_pending(state) for _, state in ours] == [_pending(state) for _, state in beams]
    reach = _reach(windowing)
    for (_, (timers, tagged, global_state)), (_, after) in zip(ours, batches):
        for w, ids in global_state.get(trigger.MergeableStateAdapter.WINDOW_IDS.tag, {}).items():
            kept_for = any(i in timers or tagged.get(i, {}).get("watermark") for i in ids)
            assert kept_for or not Timestamp(after) > w.end + reach, (w, after)


def test_a_late_element_merging_into_a_fired_session_equals_beams_driver():
    # The session [1, 7) fires; a late element (within the lateness) merges it
    # into [1, 11), whose timer carries the fired session's first id: that id's
    # window, looked up again, is the merged one.
    windowing = Windowing(window.Sessions(5), triggerfn=trigger.AfterWatermark(late=trigger.AfterCount(1)),
                          accumulation_mode=trigger.AccumulationMode.ACCUMULATING, allowed_lateness=20)
    batches = [([(1, 1), (2, 2)], 10), ([(3, 6)], 12), ([(4, 9), (5, 30)], 40)]
    beams = _run(trigger.GeneralTriggerDriver(windowing, _Clock()), windowing, batches)
    assert _run(MergingTriggerDriver(windowing, _Clock()), windowing, batches) == beams
    assert [sorted(value) for panes, _ in beams for value, *_ in panes] == [[1, 2], [1, 2, 3], [1, 2, 3, 4], [5]]


def test_a_window_found_by_id_follows_merges():
    from apache_beam.transforms.window import IntervalWindow

    from beam_ext.runner.worker._trigger_driver import _MergingStateAdapter

    state, by_ids = trigger.InMemoryUnmergedState(), {}
    adapter = _MergingStateAdapter(state, {}, by_ids)
    first, second, merged = IntervalWindow(0, 5), IntervalWindow(3, 9), IntervalWindow(0, 9)
    ids = adapter._get_id(first), adapter._get_id(second)
    assert [adapter.get_window(i) for i in ids] == [first, second]
    adapter.merge([first, second], merged)
    # A new adapter per timer, as the driver makes, over the same index.
    again = _MergingStateAdapter(state, {}, by_ids)
    assert [again.get_window(i) for i in ids] == [merged, merged]
    with pytest.raises(ValueError, match="No window"):
        again.get_window(max(ids) + 1)


def _unordered(seen: list) -> list:
    """Panes and states with each list of values sorted."""
    def values(v):
        return sorted(v) if isinstance(v, list) else v
    return [([(values(value), *rest) for value, *rest in panes],
             (timers, {w: {tag: values(v) for tag, v in tags.items()} for w, tags in state.items()}, other))
            for panes, (timers, state, other) in seen]


def test_driver_is_chosen_for_windows_that_do_not_merge():
    default = Windowing(window.FixedWindows(10))
    assert isinstance(trigger_driver(default, _Clock()), NonMergingTriggerDriver)
    early = Windowing(window.FixedWindows(10), triggerfn=trigger.AfterWatermark(early=trigger.AfterCount(2)),
                      accumulation_mode=trigger.AccumulationMode.DISCARDING)
    assert isinstance(trigger_driver(early, _Clock()), NonMergingTriggerDriver)
    sessions = Windowing(window.Sessions(10))
    assert type(trigger_driver(sessions, _Clock())) is MergingTriggerDriver


def test_late_elements_within_lateness_fire_late_panes_and_past_it_are_dropped():
    """The oracle by hand: one on-time pane, one late pane, a dropped element."""
    windowing = Windowing(window.FixedWindows(10), triggerfn=trigger.DefaultTrigger(),
                          accumulation_mode=trigger.AccumulationMode.DISCARDING, allowed_lateness=5)
    # 3 comes behind the watermark (12) but within the lateness (10 + 5); at 16 the window is gone, and 4 with it.
    batches = [([(1, 2), (2, 3)], 12), ([(3, 4)], 16), ([(4, 5)], 30)]
    panes = [p for ps, _ in _run(NonMergingTriggerDriver(windowing, _Clock()), windowing, batches) for p in ps]
    assert [(sorted(value), pane.timing) for value, _, _, pane in panes] == [
        ([1, 2], PaneInfoTiming.ON_TIME), ([3], PaneInfoTiming.LATE)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(-5, 50)), max_size=40))
def test_a_reshuffles_values_pass_through_as_the_pane_beams_driver_fires(elements):
    """A Reshuffle's grouping in streaming (``GroupSpec.passes_through``) hands
    each key's values of a batch on as the pane Beam's driver fires for a key
    it has not seen, under the Reshuffle's windowing; the key keeps no state."""
    from types import SimpleNamespace

    from apache_beam import coders

    from beam_ext.runner._shuffle import Buckets, ShuffleWriter
    from beam_ext.runner.worker._streaming_group import _passed_through

    windowing = Windowing(window.GlobalWindows(), triggerfn=trigger.Always(),
                          accumulation_mode=trigger.AccumulationMode.DISCARDING,
                          timestamp_combiner=window.TimestampCombiner.OUTPUT_AT_EARLIEST)
    pre = coders.WindowedValueCoder(coders.TupleCoder([coders.VarIntCoder(), coders.VarIntCoder()]),
                                    coders.coders.GlobalWindowCoder())
    values = [WindowedValue((key, i), Timestamp(ts), (window.GlobalWindow(),))
              for i, (key, ts) in enumerate(elements)]
    buckets = Buckets(1, blob_bytes=64)
    pairs = ShuffleWriter(pre, False).split(b"".join(pre.get_impl().encode_nested(wv) for wv in values))
    blobs = [blob for _, blob in [*buckets.add(pairs), *buckets.flush()]]
    got = [(key, [_pane(p) for p in panes])
           for key, panes in _passed_through(SimpleNamespace(pre_coder=pre, step="Reshuffle"), blobs)]

    beams = []
    for key in dict.fromkeys(key for key, _ in elements):
        driver = trigger.GeneralTriggerDriver(windowing, _Clock())
        mine = [wv.with_value(wv.value[1]) for wv in values if wv.value[0] == key]
        beams.append((key, [_pane(p) for p in driver.process_elements(
            trigger.InMemoryUnmergedState(), mine, MIN_TIMESTAMP, MIN_TIMESTAMP)]))
    assert got == beams


@st.composite
def closing_keys(draw):
    """A windowing under the default trigger, a new key's elements as (value,
    timestamp) and the watermarks of its batch: output and input before it,
    input after it, so that its windows close in it or not."""
    windowing = Windowing(draw(st.sampled_from([*_WINDOW_FNS, window.Sessions(3), window.Sessions(8)])),
                          triggerfn=trigger.DefaultTrigger(),
                          accumulation_mode=draw(st.sampled_from([trigger.AccumulationMode.DISCARDING,
                                                                  trigger.AccumulationMode.ACCUMULATING])),
                          timestamp_combiner=draw(st.sampled_from(_COMBINERS)),
                          allowed_lateness=draw(st.sampled_from([0, 5, 20])))
    stamps = draw(st.lists(st.integers(0, 50), min_size=1, max_size=10))
    previous = draw(st.sampled_from([MIN_TIMESTAMP, *(Timestamp(t) for t in range(-5, 45, 7))]))
    output = draw(st.sampled_from([MIN_TIMESTAMP, *(Timestamp(t) for t in range(-5, 45, 7)
                                                    if Timestamp(t) <= previous)]))
    # The end of the stream half the time: every window not yet ended closes.
    after = draw(st.one_of(st.just(MAX_TIMESTAMP), st.sampled_from(
        [previous, *(Timestamp(t) for t in range(0, 100, 9) if Timestamp(t) > previous)])))
    return windowing, [(i, ts) for i, ts in enumerate(stamps)], (output, previous, after)


@settings(max_examples=500, deadline=None)
@given(closing_keys(), st.booleans())
@example((Windowing(window.FixedWindows(10), timestamp_combiner=window.TimestampCombiner.OUTPUT_AT_EARLIEST),
          [(0, 3), (1, 1), (2, 14)], (Timestamp(2), Timestamp(2), Timestamp(40))), False)
# Two sessions, one of two values merged, closing at the end of the stream.
@example((Windowing(window.Sessions(3)), [(0, 1), (1, 10), (2, 3)], (MIN_TIMESTAMP, MIN_TIMESTAMP, MAX_TIMESTAMP)),
         False)
# A value whose own session expired before the batch, which a later value's session would take in.
@example((Windowing(window.Sessions(3)), [(0, 1), (1, 3)], (MIN_TIMESTAMP, Timestamp(5), MAX_TIMESTAMP)), False)
# A session past its end, not yet by the gap: a later value could still merge with it.
@example((Windowing(window.Sessions(8)), [(0, 1)], (MIN_TIMESTAMP, MIN_TIMESTAMP, Timestamp(12))), False)
def test_a_new_keys_windows_closing_in_its_batch_get_beams_panes_without_its_driver(run, gathered):
    """A streaming grouping gives a key it keeps no state for, whose windows
    (sessions merged) all close in the batch, its panes directly (``_ClosingKeys``): those Beam's
    driver fires for it in the batch, elements then timers, after which the
    key keeps nothing. Where it declines, the driver's run does not fit that
    shape: a pane other than the on-time one, a value dropped, or state kept."""
    from beam_ext.runner._batch_panes import ON_TIME
    from beam_ext.runner.worker._streaming_group import _ClosingKeys

    windowing, elements, (output, previous, after) = run
    # Gathered as the shuffle gathers them: windows that do not merge, the end-of-window hold.
    gathered = (gathered and windowing.timestamp_combiner == window.TimestampCombiner.OUTPUT_AT_EOW
                and not windowing.windowfn.is_merging())
    objects = _Windows()
    values = []
    for value, ts in elements:
        stamp = Timestamp(ts)
        windows = windowing.windowfn.assign(window.WindowFn.AssignContext(stamp, element=value))
        values.append(WindowedValue(value, stamp, objects.of(tuple(windows))))
    records: dict[tuple, list] = {}
    if gathered:
        for wv in values:
            records.setdefault(wv.windows, []).append(wv.value)
    closing = _ClosingKeys.of(windowing, previous, after, output)
    if closing is None:  # sessions under another timestamp combiner: the driver's
        assert windowing.windowfn.is_merging() and windowing.timestamp_combiner != window.TimestampCombiner.OUTPUT_AT_EOW
        return
    direct = closing.panes([] if gathered else values, list(records.items()))

    state = trigger.InMemoryUnmergedState()
    driver = trigger.GeneralTriggerDriver(windowing, _Clock())
    beams = [_pane(p) for p in driver.process_elements(state, values, output, previous)]
    while True:
        fired, _ = state.get_timers(clear=True, watermark=after, processing_time=0.0)
        if not fired:
            break
        for fired_window, (name, domain, timestamp, _tag) in fired:
            beams += [_pane(p) for p in driver.process_timer(fired_window, name, domain, timestamp, state, after)]
    _forget_unreachable(state, after, _reach(windowing))
    kept = bool(state.state or any(state.timers.values()) or state.global_state)
    if direct is not None:
        got = [_pane(p) for p in direct]
        if gathered:  # a window's values come in another order, which a pane leaves unspecified
            got, beams = ([(sorted(value), *rest) for value, *rest in panes] for panes in (got, beams))
        assert got == beams
        assert not kept
    else:
        # A value's own window: sessions drop before they merge.
        dropped = sum(1 for wv in values for w in wv.windows if previous > w.end + windowing.allowed_lateness)
        assert kept or dropped or any(pane != ON_TIME for *_, pane in beams)


def test_a_new_key_closing_in_its_batch_takes_the_direct_panes():
    from beam_ext.runner.worker._streaming_group import _ClosingKeys

    windowing = Windowing(window.FixedWindows(10), allowed_lateness=5)
    values = [WindowedValue(v, Timestamp(v), (window.IntervalWindow(0, 10),)) for v in (1, 2)]
    assert _ClosingKeys.of(windowing, MIN_TIMESTAMP, Timestamp(16), MIN_TIMESTAMP).panes(values, ()) is not None
    # Not past the lateness yet: the window is kept for late values.
    assert _ClosingKeys.of(windowing, MIN_TIMESTAMP, Timestamp(15), MIN_TIMESTAMP).panes(values, ()) is None
    # The window ended before the batch: its values are late, their pane is not the on-time one.
    assert _ClosingKeys.of(windowing, Timestamp(10), Timestamp(30), MIN_TIMESTAMP).panes(values, ()) is None
    # Other triggers fire other panes.
    early = Windowing(window.FixedWindows(10), triggerfn=trigger.AfterWatermark(early=trigger.AfterCount(1)),
                      accumulation_mode=trigger.AccumulationMode.DISCARDING)
    assert _ClosingKeys.of(early, MIN_TIMESTAMP, Timestamp(16), MIN_TIMESTAMP) is None
