"""LateWindowedGroupByKey on DirectRunner and the shared pane engine, against a brute-force model."""
from __future__ import annotations

import math
import random
import time

import apache_beam as beam
import hypothesis.strategies as st
import pytest
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import window as beam_window
from apache_beam.utils.windowed_value import PaneInfo, PaneInfoTiming, WindowedValue
from hypothesis import given, settings

from beam_ext.state import SpillStore
from beam_ext.transforms import AfterLateDelay, EveryNLateEvents, LateWindowedGroupByKey
from beam_ext.transforms.lateness import FixedLateness
from beam_ext.transforms.lateness._backends import _MemoryBackend, _SpillBackend
from beam_ext.transforms.lateness._engine import _LateEngine
from tests._late_model import model_panes

SIZE = 10.0


class _Offsets:
    """A scheduled trigger like StalenessTrigger: fires at fixed offsets."""

    def __init__(self, offsets):
        self.offsets = list(offsets)
        self.observed: list[float] = []

    def late_firing_offsets(self, allowed_lateness):
        return [o for o in self.offsets if 0 < o <= allowed_lateness]

    def observe(self, offset):
        self.observed.append(offset)


def _trigger(kind, arg):
    if kind == "delay":
        return AfterLateDelay(arg)
    return EveryNLateEvents(arg) if kind == "every" else _Offsets(arg)


def _pane_row(element, window=beam.DoFn.WindowParam, pane=beam.DoFn.PaneInfoParam):
    key, values = element
    yield (key, (window.start.micros / 1e6, window.end.micros / 1e6), tuple(sorted(values)),
           pane.is_first, pane.is_last, pane.timing_name if hasattr(pane, "timing_name") else
           {0: "EARLY", 1: "ON_TIME", 2: "LATE"}[pane.timing], pane.index)


def _run_direct(transcript, kind, arg, lateness, expected):
    """Runs the transcript through TestStream and asserts panes and dead letters."""
    from apache_beam.testing.util import assert_that, equal_to

    stream = TestStream()
    for step in transcript:
        if step[0] == "watermark":
            stream = stream.advance_watermark_to(step[1])
        elif step[0] == "delay":
            # AfterLateDelay's timer is set at wall-clock now + seconds, and
            # TestStream's processing time starts at 0: jump past the former.
            stream = stream.advance_processing_time(round(time.time()) + 3600)
        else:
            _, key, ts, value = step
            stream = stream.add_elements(
                [beam_window.TimestampedValue((key, value), ts)])
    stream = stream.advance_watermark_to_infinity()
    expected_rows, expected_dead = expected
    with beam.Pipeline(runner="BundleBasedDirectRunner") as p:
        out, dl = (p | stream
                   | beam.WindowInto(beam_window.FixedWindows(SIZE))
                   | LateWindowedGroupByKey(trigger=_trigger(kind, arg),
                                            cleanup=lateness).with_dead_letters())
        assert_that(out | beam.FlatMap(_pane_row), equal_to(expected_rows), label="panes")
        assert_that(dl, equal_to(expected_dead), label="dead")


def _run_engine(transcript, kind, arg, lateness, backend):
    rows, dead = [], []

    def emit(key, w, values, pane):
        rows.append((key.decode(), w, tuple(sorted(v.decode() for v in values)), pane.is_first,
                     pane.is_last, {0: "EARLY", 1: "ON_TIME", 2: "LATE"}[pane.timing],
                     pane.index))

    engine = _LateEngine(_trigger(kind, arg), FixedLateness(lateness), backend, emit,
                         lambda k, w, v: dead.append((k.decode(), v.decode())))
    for step in transcript:
        if step[0] == "watermark":
            engine.advance_watermark(step[1])
        else:
            _, key, ts, value = step
            start = math.floor(ts / SIZE) * SIZE
            engine.element(key.encode(), (float(start), float(start + SIZE)), value.encode())
    engine.advance_watermark(math.inf)
    engine.close()
    return sorted(rows), sorted(dead)


def _transcript(rng: random.Random, n_steps: int):
    steps, watermark, counter = [], 0.0, 0
    for _ in range(n_steps):
        if rng.random() < 0.25:
            watermark += rng.choice([1.0, 5.0, 10.0, 20.0])
            steps.append(("watermark", watermark))
        else:
            lag = rng.lognormvariate(0, 1) * SIZE  # Aion's lateness distribution
            ts = max(0.0, watermark - lag + rng.uniform(0, SIZE))
            steps.append(("add", rng.choice(["a", "b"]), round(ts, 3), f"v{counter}"))
            counter += 1
    return steps


FIXED = [
    ("add", "a", 1.0, "x1"), ("add", "a", 2.0, "x2"), ("add", "b", 12.0, "y1"),
    ("watermark", 10.0),                        # on-time pane for a@[0,10)
    ("add", "a", 3.0, "late1"),                 # late: EveryN(1) fires at once
    ("watermark", 25.0),                        # on-time pane for b@[10,20)
    ("add", "a", 4.0, "late2"), ("add", "b", 11.0, "late3"),
    ("watermark", 40.0),                        # a@[0,10) closes at 10+30
    ("add", "a", 5.0, "too-late"),              # -> dead letter
]


def test_fixed_transcript_matches_model_on_direct_runner():
    expected = model_panes(FIXED, SIZE, "every", 1, 30.0)
    _run_direct(FIXED, "every", 1, 30.0, expected)
    rows, dead = expected
    assert dead == [("a", "too-late")]
    assert ("a", (0.0, 10.0), ("late1", "late2", "x1", "x2"), False, False, "LATE", 2) in rows


def test_after_late_delay_on_direct_runner():
    # Once past wall-clock time, TestStream's processing time fires every
    # later delay timer at once: one delay step, and no late value after it.
    transcript = [
        ("add", "a", 1.0, "x1"), ("add", "b", 12.0, "y1"),
        ("watermark", 25.0),                      # on-time panes for both windows
        ("add", "a", 3.0, "late1"), ("add", "a", 4.0, "late2"), ("add", "b", 11.0, "late3"),
        ("delay",),                               # a late pane for each
        ("watermark", 45.0),                      # a@[0,10) closes, nothing new: no pane
        ("add", "a", 5.0, "too-late"),
    ]
    expected = model_panes(transcript, SIZE, "delay", 5.0, 30.0)
    assert ("a", (0.0, 10.0), ("late1", "late2", "x1"), False, False, "LATE", 1) in expected[0]
    _run_direct(transcript, "delay", 5.0, 30.0, expected)


def test_scheduled_trigger_on_direct_runner():
    expected = model_panes(FIXED, SIZE, "offsets", [5.0, 20.0], 30.0)
    _run_direct(FIXED, "offsets", [5.0, 20.0], 30.0, expected)


@pytest.mark.parametrize("kind,arg", [("offsets", [3.0, 15.0])])
def test_random_transcripts_on_direct_runner(kind, arg):
    transcript = _transcript(random.Random(7), 30)
    _run_direct(transcript, kind, arg, 25.0, model_panes(transcript, SIZE, kind, arg, 25.0))


@settings(max_examples=30, deadline=None, derandomize=True)
@given(seed=st.integers(0, 10**6), kind=st.sampled_from(["every", "offsets"]),
       n=st.integers(1, 3), lateness=st.sampled_from([0.0, 10.0, 25.0, 45.0]),
       spill=st.booleans())
def test_engine_matches_model(tmp_path_factory, seed, kind, n, lateness, spill):
    transcript = _transcript(random.Random(seed), 60)
    arg = n if kind == "every" else [2.0 * n, 7.0, 30.0]
    if spill:
        store = SpillStore(str(tmp_path_factory.mktemp("spill")), memory_budget_bytes=4096,
                           block_bytes=64)
        backend = _SpillBackend(store)
    else:
        backend = _MemoryBackend()
    assert _run_engine(transcript, kind, arg, lateness, backend) == \
        model_panes(transcript, SIZE, kind, arg, lateness)


def test_dead_letters_are_routed_and_counted():
    from apache_beam.testing.util import assert_that, equal_to

    with beam.Pipeline(runner="BundleBasedDirectRunner") as p:
        stream = (TestStream()
                  .add_elements([beam_window.TimestampedValue(("k", 1), 1.0)])
                  .advance_watermark_to(18.0)  # closed at 15, dead letters until 20
                  .add_elements([beam_window.TimestampedValue(("k", 2), 2.0)])
                  .advance_watermark_to_infinity())
        out, dead = (p | stream | beam.WindowInto(beam_window.FixedWindows(SIZE))
                     | LateWindowedGroupByKey(cleanup=5.0).with_dead_letters())
        assert_that(out, equal_to([("k", [1])]), label="panes")
        assert_that(dead, equal_to([("k", 2)]), label="dead")
    # The DirectRunner loses metrics of TestStream bundles after a watermark
    # advance, so the counting step is checked on bounded input.
    p = beam.Pipeline(runner="BundleBasedDirectRunner")
    _ = (p | beam.Create([("pane", ("k", [1]), PaneInfoTiming.ON_TIME),
                          ("pane", ("k", [1, 4]), PaneInfoTiming.LATE),
                          ("dead", ("k", 2), PaneInfoTiming.UNKNOWN),
                          ("dead", ("k", 3), PaneInfoTiming.UNKNOWN)])
         | _GivenStatefulOutput(cleanup=5.0).with_dead_letters())
    result = p.run()
    result.wait_until_finish()
    counters = result.metrics().query(
        beam.metrics.MetricsFilter().with_namespace("beam_ext.lateness"))["counters"]
    assert {c.key.metric.name: c.committed for c in counters} == {"dead_letter": 2,
                                                                 "late_panes": 1}


class _AsStatefulOutput(beam.DoFn):
    """Tagged elements with a pane, as the stateful step emits them."""

    def process(self, element):
        tag, payload, timing = element
        yield WindowedValue((tag, payload), 0, [beam_window.GlobalWindow()],
                            PaneInfo(timing == PaneInfoTiming.ON_TIME, False, timing, 0, 0))


class _GivenStatefulOutput(LateWindowedGroupByKey):
    def _tagged(self, pcoll):
        return pcoll | beam.ParDo(_AsStatefulOutput())


def typed_inputs(p, pairs):
    """The same ``(key, value, timestamp)`` triples as inputs whose element type
    is a known tuple: from ``beam.Create`` (global window) and by type hint
    (fixed windows); with the panes each must give."""

    from apache_beam.transforms.window import GlobalWindow

    created = p | "Typed" >> beam.Create([(k, v) for k, v, _ in pairs])
    hinted = (p | "Triples" >> beam.Create(pairs)
              | beam.Map(lambda e: beam_window.TimestampedValue((e[0], e[1]), e[2]))
              .with_output_types(tuple[str, int])
              | beam.WindowInto(beam_window.FixedWindows(SIZE)))
    assert created.element_type == hinted.element_type == beam.typehints.Tuple[str, int]
    end = GlobalWindow().end.micros / 1e6
    in_global, in_fixed = {}, {}
    for k, v, ts in pairs:
        in_global.setdefault((k, (GlobalWindow().start.micros / 1e6, end)), []).append(v)
        in_fixed.setdefault((k, (ts - ts % SIZE, ts - ts % SIZE + SIZE)), []).append(v)
    return [(created, [(k, w, tuple(sorted(vs)), True, True, "ON_TIME", 0)
                       for (k, w), vs in in_global.items()]),
            (hinted, [(k, w, tuple(sorted(vs)), True, True, "ON_TIME", 0)
                      for (k, w), vs in in_fixed.items()])]


TYPED_PAIRS = [("a", 1, 1.0), ("b", 2, 3.0), ("a", 3, 12.0), ("a", 4, 2.0)]


def test_typed_input_on_the_portable_direct_runner():
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from apache_beam.testing.util import assert_that, equal_to

    # Batch: the portable runner (see _run in test_late_windowed_gbk_spark.py).
    with beam.Pipeline(runner=FnApiRunner()) as p:
        for i, (pcoll, expected) in enumerate(typed_inputs(p, TYPED_PAIRS)):
            out = pcoll | f"Panes{i}" >> LateWindowedGroupByKey(cleanup=0.0)
            assert_that(out | f"Rows{i}" >> beam.FlatMap(_pane_row), equal_to(expected),
                        label=f"Check{i}")


def _real_time_timers(transform) -> bool:
    """Whether the pipeline built with ``transform`` declares a processing-time timer."""
    from apache_beam.transforms.timeutil import TimeDomain
    from apache_beam.transforms.userstate import get_dofn_specs

    p = beam.Pipeline()
    _ = (p | beam.Create([("k", 1)]) | beam.WindowInto(beam_window.FixedWindows(SIZE))
         | transform)
    found = []

    class _Visitor(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            if isinstance(node.transform, beam.ParDo):
                _, timers = get_dofn_specs(node.transform.dofn)
                found.extend(t for t in timers if t.time_domain == TimeDomain.REAL_TIME)

    p.visit(_Visitor())
    return bool(found)


def _late_pane_transforms():
    from beam_ext.transforms import StalenessRefire, StalenessTrigger

    return [LateWindowedGroupByKey(trigger=_Offsets([]), cleanup=0.0),
            StalenessRefire(StalenessTrigger(0.2, allowed_lateness=30.0, history=[[5, 9]] * 3))]


def _values_row(element, window=beam.DoFn.WindowParam):
    key, values = element
    yield key, (window.start.micros / 1e6, window.end.micros / 1e6), tuple(sorted(values))


@pytest.mark.parametrize("index", [0, 1], ids=["LateWindowedGroupByKey", "StalenessRefire"])
def test_each_value_once_per_window_it_is_in(index):
    # An element in several (sliding) windows belongs to each once, as in
    # GroupByKey: keeping late data must not assign it to windows again.
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from apache_beam.testing.util import assert_that, equal_to

    with beam.Pipeline(runner=FnApiRunner()) as p:
        out = (p | beam.Create([("k", 1.0), ("k", 7.0)])
               | beam.Map(lambda kv: beam_window.TimestampedValue(kv, kv[1]))
               | beam.WindowInto(beam_window.SlidingWindows(10, 5))
               | _late_pane_transforms()[index])
        assert_that(out | beam.FlatMap(_values_row), equal_to([
            ("k", (-5.0, 5.0), (1.0,)), ("k", (0.0, 10.0), (1.0, 7.0)), ("k", (5.0, 15.0), (7.0,))]))


@pytest.mark.parametrize("index", [0, 1], ids=["LateWindowedGroupByKey", "StalenessRefire"])
def test_keys_equal_in_python_but_encoded_apart_are_apart_on_the_portable_runner(index):
    # GroupByKey groups by encoding: 0.0 and -0.0, 1 and True are apart.
    # The portable runner merges timers of keys equal in Python, so the
    # stateful step keys by the encoding itself, or panes would be lost.
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from apache_beam.testing.util import assert_that, equal_to

    keys = [(None, 0.0), (None, -0.0), 1, True, 1.0]
    with beam.Pipeline(runner=FnApiRunner()) as p:
        out = (p | beam.Create([(i, float(i)) for i in range(20)])
               | beam.Map(lambda e: beam_window.TimestampedValue((keys[e[0] % 5], e[0]), e[1]))
               | beam.WindowInto(beam_window.FixedWindows(10))
               | _late_pane_transforms()[index])
        assert_that(out | beam.FlatMap(_values_row) | beam.Map(repr), equal_to(
            [repr((key, (w, w + 10.0), tuple(i for i in range(int(w), int(w) + 10) if i % 5 == k)))
             for k, key in enumerate(keys) for w in (0.0, 10.0)]))


def test_only_event_driven_triggers_declare_a_processing_time_timer():
    # A processing-time timer sends the DirectRunner to its bundle-based runner.
    from beam_ext.transforms.staleness import StalenessRefire, StalenessTrigger

    assert _real_time_timers(LateWindowedGroupByKey(trigger=AfterLateDelay(1.0)))
    assert _real_time_timers(LateWindowedGroupByKey(trigger=EveryNLateEvents(2)))
    assert not _real_time_timers(LateWindowedGroupByKey(trigger=_Offsets([5.0]), cleanup=10.0))
    assert not _real_time_timers(
        StalenessRefire(StalenessTrigger(0.1, allowed_lateness=10.0)))


def test_bad_arguments_are_named():
    with pytest.raises(TypeError, match="trigger"):
        LateWindowedGroupByKey(trigger="often")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cleanup"):
        LateWindowedGroupByKey(cleanup="forever")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="allowed lateness"):
        LateWindowedGroupByKey(cleanup=-1.0)
    with pytest.raises(ValueError, match="memory_budget_bytes"):
        LateWindowedGroupByKey(memory_budget_bytes=0)
