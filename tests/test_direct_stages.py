"""Fused stages of Map-like steps, side inputs and a partial combine run on element objects, with Beam's results.

Oracle: Beam's FnApiRunner (what DirectRunner runs in batch) on the same
pipeline, written out with each element's window and timestamp, so a
window, timestamp or pane that differs shows. Also checked: the stages take
the object path, a GroupByKey fed by an object stage and a bundle-processor
stage groups their keys together, the partial combine's eviction, metrics
and errors of a CombineFn, side inputs of every kind read whole.
"""
from __future__ import annotations

import functools
import logging
import pickle

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import combiners, core, trigger, window
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pipeline_outputs import spark_equals_direct

from beam_ext.runner import PipelineError, SparkRunner
from beam_ext.runner.planning import plan_pipeline
from beam_ext.runner.worker._plain_accumulators import plain_accumulators

pytestmark = pytest.mark.usefixtures("spark")

OBJECTS = "runs its steps on element objects"


class _Stamped(beam.DoFn):
    """Each element with its window and timestamp (the oracle compares them too)."""

    def process(self, element, w=beam.DoFn.WindowParam, t=beam.DoFn.TimestampParam):
        yield [element, repr(w), float(t)]


def _timestamped(p, events, case: str = ""):
    return (p | f"Create{case}" >> beam.Create(events)
            | f"Stamp{case}" >> beam.MapTuple(lambda k, v, ts: window.TimestampedValue((k, v), ts)))


def _cases_equal_beam(build, cases: list, tmp_path, options: list[str] | None = None) -> None:
    """``build(p, case, *args)`` for each ``args`` of ``cases``, as branches of
    one pipeline; asserts SparkRunner writes what Beam writes, case by case.

    Several hypothesis cases in one pipeline pay a run's fixed costs (its
    Spark jobs, Beam's pipeline construction) once. Steps are labelled with
    their case's number, which the stage logs show.
    """
    def build_all(p):
        return [build(p, str(i), *args)
                | f"Case{i}" >> beam.Map(lambda e, i=i: [i, e])
                | f"Global{i}" >> beam.WindowInto(window.GlobalWindows())  # for the Flatten
                for i, args in enumerate(cases)] | beam.Flatten()
    spark_equals_direct(build_all, tmp_path, options)


WINDOWS = {
    "global": window.GlobalWindows(),
    "fixed": window.FixedWindows(5),
    "sliding": window.SlidingWindows(6, 2),  # three windows per element
}
COMBINERS = {
    "earliest": window.TimestampCombiner.OUTPUT_AT_EARLIEST,
    "latest": window.TimestampCombiner.OUTPUT_AT_LATEST,
    "end_of_window": window.TimestampCombiner.OUTPUT_AT_EOW,
}
COMBINE_FNS = {
    "sum": sum,
    "count": combiners.CountCombineFn(),
    "mean": combiners.MeanCombineFn(),
    "top": combiners.TopCombineFn(2),
}


_EVENTS = st.lists(st.tuples(st.sampled_from("abcde"), st.integers(-5, 20), st.integers(0, 30)), max_size=60)
_COMBINE_CASES = st.lists(st.tuples(_EVENTS, st.sampled_from(sorted(WINDOWS)), st.sampled_from(sorted(COMBINERS)),
                                    st.sampled_from(sorted(COMBINE_FNS))), min_size=1, max_size=4)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases=_COMBINE_CASES)
def test_a_partial_combine_under_any_windowing_equals_beam(tmp_path_factory, caplog, cases):
    def build(p, case, events, windows, timestamps, fn):
        # The grouping puts the combine in a stage of its own, its elements
        # in their windows with the timestamps the grouping gave.
        return (_timestamped(p, events, case)
                | f"Window{case}" >> beam.WindowInto(WINDOWS[windows], timestamp_combiner=COMBINERS[timestamps])
                | f"Group{case}" >> beam.GroupByKey()
                | f"Ungroup{case}" >> beam.FlatMapTuple(lambda k, vs: [(k, v * 2) for v in vs])
                | f"Combine{case}" >> beam.CombinePerKey(COMBINE_FNS[fn])
                | f"Stamped{case}" >> beam.ParDo(_Stamped()))
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="beam_ext.runner"):
        _cases_equal_beam(build, cases, tmp_path_factory.mktemp("combine"))
    for case in map(str, range(len(cases))):
        assert any(OBJECTS in r.getMessage() and f"Ungroup{case}+Combine{case}" in r.getMessage()
                   for r in caplog.records)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases=st.lists(st.tuples(_EVENTS, st.sampled_from(sorted(WINDOWS)), st.sampled_from(sorted(COMBINERS)),
                                st.sampled_from(sorted(COMBINE_FNS)), st.sampled_from(["lifted", "values", "early"])),
                      min_size=1, max_size=4))
def test_a_combine_after_its_grouping_equals_beam(tmp_path_factory, caplog, cases):
    def build(p, case, events, windows, timestamps, fn, how):
        # The combine's steps after its grouping (merge and extract; or the
        # whole combine, where early firings keep Beam from lifting it) and a
        # Map run on objects and feed a second grouping; its groups' windows
        # and timestamps, which _Stamped shows, follow from theirs.
        early = {} if how != "early" else dict(
            trigger=trigger.AfterWatermark(early=trigger.AfterCount(2)),
            accumulation_mode=trigger.AccumulationMode.ACCUMULATING)
        windowed = (_timestamped(p, events, case)
                    | f"Window{case}" >> beam.WindowInto(WINDOWS[windows], timestamp_combiner=COMBINERS[timestamps],
                                                         **early))
        if how != "values":
            combined = windowed | f"Combine{case}" >> beam.CombinePerKey(COMBINE_FNS[fn])
        else:
            combined = (windowed | f"Group{case}" >> beam.GroupByKey()
                        | f"Combine{case}" >> beam.CombineValues(COMBINE_FNS[fn]))
        return (combined
                | f"Rekey{case}" >> beam.Map(lambda kv: (len(kv[0]), kv))
                | f"Regroup{case}" >> beam.GroupByKey()
                | f"Sort{case}" >> beam.MapTuple(lambda k, kvs: (k, sorted(map(repr, kvs))))
                | f"Stamped{case}" >> beam.ParDo(_Stamped()))
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="beam_ext.runner"):
        _cases_equal_beam(build, cases, tmp_path_factory.mktemp("combine"))
    # Lifted or not (Beam's CombineValues is a ParDo of a DoFn with setup), on objects.
    for case in map(str, range(len(cases))):
        assert any(OBJECTS in r.getMessage() and f"Combine{case}" in r.getMessage()
                   and f"Rekey{case}" in r.getMessage() for r in caplog.records)


def test_the_object_path_is_taken_for_a_combine_and_a_grouping(tmp_path, caplog):
    def build(p):
        def words(label):
            # A source per branch: branches of one source fuse into one stage of three outputs.
            return p | f"{label}Lines" >> beam.Create(["a b", "b c c", ""]) | f"{label}Split" >> beam.FlatMap(str.split)
        counted = words("C") | "Count" >> beam.combiners.Count.PerElement()
        grouped = words("G") | "Pair" >> beam.Map(lambda w: (w, 1)) | beam.GroupByKey() | beam.MapTuple(
            lambda w, ones: (w, len(ones)))
        total = words("L") | "Len" >> beam.Map(len) | beam.CombineGlobally(sum)
        return (counted, grouped, total | beam.Map(lambda n: ("total", n))) | beam.Flatten()
    with caplog.at_level(logging.DEBUG, logger="beam_ext.runner"):
        got = spark_equals_direct(build, tmp_path)
    assert sorted(map(tuple, got)) == [("a", 1), ("a", 1), ("b", 2), ("b", 2), ("c", 2), ("c", 2), ("total", 5)]
    taken = [r.getMessage() for r in caplog.records if OBJECTS in r.getMessage()]
    assert any("Count" in m for m in taken) and any("Pair" in m for m in taken) and any("Len" in m for m in taken)


class _Key:
    """A key type of its own, with a deterministic coder: its bytes are length-prefixed on the wire."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __eq__(self, other):
        return isinstance(other, _Key) and other.name == self.name

    def __hash__(self):
        return hash(self.name)


class _KeyCoder(beam.coders.Coder):
    def encode(self, value):
        return value.name.encode()

    def decode(self, encoded):
        return _Key(encoded.decode())

    def is_deterministic(self):
        return True


beam.coders.registry.register_coder(_Key, _KeyCoder)


class _KeyedWithSetup(beam.DoFn):
    """A DoFn with ``setup``: its stage stays on Beam's bundle processor."""

    def setup(self):
        self.prefix = "k"

    def process(self, n):
        yield _Key(f"{self.prefix}{n % 3}"), n


def test_a_grouping_fed_by_both_paths_groups_their_keys_together(tmp_path):
    def build(p):
        objects = p | "Objects" >> beam.Create(range(9)) | "ByMap" >> beam.Map(lambda n: (_Key(f"k{n % 3}"), n))
        processor = p | "Processor" >> beam.Create(range(9, 15)) | "BySetup" >> beam.ParDo(_KeyedWithSetup())
        return ((objects, processor) | beam.Flatten() | beam.GroupByKey()
                | beam.MapTuple(lambda k, vs: (k.name, sorted(vs))))
    got = spark_equals_direct(build, tmp_path)
    assert got == [["k0", [0, 3, 6, 9, 12]], ["k1", [1, 4, 7, 10, 13]], ["k2", [2, 5, 8, 11, 14]]]


def _side_inputs(p):
    weights = p | "Weights" >> beam.Create([("a", 2), ("b", 3)])
    numbers = p | "Numbers" >> beam.Create([10, 20])
    empty = p | "Empty" >> beam.Create([]) | "AsInt" >> beam.Map(int)
    return (p | beam.Create(["a", "b", "a", "c"])
            | beam.Map(lambda w, d, xs, it, one, none: (w, d.get(w, 0), sorted(xs), sum(it), one, none),
                       beam.pvalue.AsDict(weights), beam.pvalue.AsList(numbers), beam.pvalue.AsIter(numbers),
                       one=beam.pvalue.AsSingleton(numbers | beam.CombineGlobally(max)),
                       none=beam.pvalue.AsSingleton(empty, default_value="none"))
            | beam.Map(lambda t: (t[0], t))
            | beam.CombinePerKey(combiners.ToListCombineFn())
            | beam.MapTuple(lambda k, ts: (k, sorted(ts))))


def test_side_inputs_of_every_kind_are_read_whole(tmp_path, caplog):
    with caplog.at_level(logging.DEBUG, logger="beam_ext.runner"):
        got = spark_equals_direct(_side_inputs, tmp_path)
    assert got[0] == ["a", [["a", 2, [10, 20], 30, 20, "none"]] * 2]
    assert sum(OBJECTS in r.getMessage() and "Map(<lambda" in r.getMessage() for r in caplog.records) >= 1
    # The three read straight from a Create (the dict, the list, the
    # iterable) are listed on the driver, without a Spark job.
    assert sum("listed on the driver" in r.getMessage() for r in caplog.records) == 3


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases=st.lists(st.tuples(_EVENTS, st.sampled_from([*sorted(WINDOWS), "sessions"]), _EVENTS,
                                st.sampled_from(sorted(WINDOWS))), min_size=1, max_size=2))
def test_windowed_elements_read_side_inputs_on_objects_as_beam(tmp_path_factory, cases):
    def build(p, case, events, windows, side_events, side_windows):
        # Beam maps every window to a global side input's one window: each
        # element, once per window it is in, reads the whole views; and to
        # the window of a windowed side input holding its window's end.
        table = p | f"Table{case}" >> beam.Create([("a", 2), ("c", -1)])
        numbers = p | f"Numbers{case}" >> beam.Create([10, 20])
        side = (_timestamped(p, side_events, f"Side{case}") | f"SideValues{case}" >> beam.Values()
                | f"SideWindow{case}" >> beam.WindowInto(WINDOWS[side_windows]))
        return (_timestamped(p, events, case)
                | f"Window{case}" >> beam.WindowInto(WINDOWS.get(windows) or window.Sessions(3))
                | f"Enrich{case}" >> beam.Map(
                    lambda kv, d, xs, one, near: (kv[0], kv[1] * d.get(kv[0], 1), sorted(xs), one, sorted(near)),
                    beam.pvalue.AsDict(table), beam.pvalue.AsList(numbers),
                    one=beam.pvalue.AsSingleton(p | f"One{case}" >> beam.Create([7])),
                    near=beam.pvalue.AsList(side))
                | f"Stamped{case}" >> beam.ParDo(_Stamped()))
    _cases_equal_beam(build, cases, tmp_path_factory.mktemp("side"))
    assert set(_enriching_on_objects(lambda p: [build(p, str(i), *args) for i, args in enumerate(cases)])) == {True}


def _windowed_side_inputs(p):
    side = (p | "Side" >> beam.Create([("a", 2, 1), ("a", 5, 8), ("b", 7, 3), ("a", 11, 21)])
            | "StampSide" >> beam.MapTuple(lambda k, v, ts: window.TimestampedValue((k, v), ts)))
    rates = side | "WindowRates" >> beam.WindowInto(window.FixedWindows(5))
    totals = (side | "WindowTotals" >> beam.WindowInto(window.FixedWindows(10))
              | "Values" >> beam.Values() | "Total" >> beam.CombineGlobally(sum).without_defaults())
    events = (p | beam.Create([("a", 1, 0), ("b", 2, 4), ("a", 3, 7), ("a", 4, 13), ("b", 6, 22)])
              | beam.MapTuple(lambda k, v, ts: window.TimestampedValue((k, v), ts)))
    fixed = (events | "Fixed" >> beam.WindowInto(window.FixedWindows(5))
             | "EnrichFixed" >> beam.Map(lambda kv, rate, total, listed: (kv[0], kv[1] * rate.get(kv[0], 0), total,
                                                                          sorted(listed)),
                                         beam.pvalue.AsDict(rates), beam.pvalue.AsSingleton(totals, default_value=-1),
                                         listed=beam.pvalue.AsList(rates | "RateValues" >> beam.Values())))
    # Three windows per element, each mapped to the fixed window holding its end.
    sliding = (events | "Sliding" >> beam.WindowInto(window.SlidingWindows(6, 2))
               | "EnrichSliding" >> beam.ParDo(_RatedInWindow(), beam.pvalue.AsDict(rates)))
    return [pcoll | f"Stamp{name}" >> beam.ParDo(_Stamped()) | f"Global{name}" >> beam.WindowInto(window.GlobalWindows())
            for name, pcoll in [("fixed", fixed), ("sliding", sliding)]] | "Both" >> beam.Flatten()


class _RatedInWindow(beam.DoFn):
    def process(self, kv, rates, w=beam.DoFn.WindowParam, t=beam.DoFn.TimestampParam):
        yield kv[0], kv[1] * rates.get(kv[0], 0), repr(w), float(t)


def test_side_inputs_in_windows_of_their_own_are_read_per_window_on_objects_as_beam(tmp_path):
    got = spark_equals_direct(_windowed_side_inputs, tmp_path)
    fixed = sorted(row[0] for row in got if len(row[0]) == 4 and isinstance(row[0][3], list))
    # Each element reads the rates of its own five seconds, and the total of the
    # ten seconds holding them (none for 10-20 s: the default).
    assert fixed == [["a", 0, -1, []], ["a", 2, 14, [2, 7]], ["a", 15, 14, [5]], ["b", 0, 11, [11]],
                     ["b", 14, 14, [2, 7]]]
    assert len(got) == 5 + 5 * 3
    assert _enriching_on_objects(_windowed_side_inputs) == [True]


class _WeighedInWindows(beam.DoFn):
    TOTAL = ReadModifyWriteStateSpec("total", VarIntCoder())

    def process(self, kv, rates, total=beam.DoFn.StateParam(TOTAL)):
        yield kv[0], (total.read() or 0) + kv[1] * rates.get(kv[0], 1)


def _stateful_windowed_side_input(p):
    rates = (p | "Rates" >> beam.Create([("a", 2, 1), ("a", 5, 8)])
             | "StampRates" >> beam.MapTuple(lambda k, v, ts: window.TimestampedValue((k, v), ts))
             | "WindowRates" >> beam.WindowInto(window.FixedWindows(5)))
    return (p | beam.Create([("a", 1, 0), ("a", 3, 7), ("a", 4, 8)])
            | beam.MapTuple(lambda k, v, ts: window.TimestampedValue((k, v), ts))
            | beam.WindowInto(window.FixedWindows(5))
            | "Enrich" >> beam.ParDo(_WeighedInWindows(), beam.pvalue.AsDict(rates)))


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases=st.lists(st.tuples(_EVENTS, _EVENTS, st.sampled_from(sorted(WINDOWS))), min_size=1, max_size=2))
def test_a_multimap_side_input_is_read_on_objects_as_beam(tmp_path_factory, cases):
    def build(p, case, events, side_events, windows):
        side = _timestamped(p, side_events, f"Side{case}") | f"SideWindow{case}" >> beam.WindowInto(WINDOWS[windows])
        return (_timestamped(p, events, case)
                | f"Window{case}" >> beam.WindowInto(WINDOWS[windows])
                # A key the side input has or lacks, and a tuple key it never has.
                | f"Enrich{case}" >> beam.Map(lambda kv, m: (kv[0], sorted(m[kv[0]]), list(m[(kv[0], kv[1])])),
                                              m=beam.pvalue.AsMultiMap(side))
                | f"Stamped{case}" >> beam.ParDo(_Stamped()))
    _cases_equal_beam(build, cases, tmp_path_factory.mktemp("multimap"))
    assert set(_enriching_on_objects(lambda p: [build(p, str(i), *args) for i, args in enumerate(cases)])) == {True}


def _many_keys_multimap(p):
    # Past 100 keys Beam reads a key's values lazily; a tuple key, and a list
    # one that no lookup can reach.
    side = p | "Side" >> beam.Create([(k % 150, k) for k in range(450)] + [([1, 2], "list"), ((1, 2), "tuple")])
    return (p | beam.Create([0, 7, 149, 150, 449])
            | "Enrich" >> beam.Map(lambda k, m: (k, sum(m[k]), len(list(m[k])), list(m[(1, 2)])),
                                   m=beam.pvalue.AsMultiMap(side)))


def test_a_multimap_side_input_of_many_keys_and_unhashable_ones_equals_beam(tmp_path):
    got = spark_equals_direct(_many_keys_multimap, tmp_path)
    assert sorted(got) == [[0, 450, 3, ["tuple"]], [7, 471, 3, ["tuple"]], [149, 897, 3, ["tuple"]],
                           [150, 0, 0, ["tuple"]], [449, 0, 0, ["tuple"]]]
    assert _enriching_on_objects(_many_keys_multimap) == [True]


def test_a_multimap_view_groups_values_by_key_and_is_never_shipped():
    from beam_ext.runner.worker._multimap_view import MultiMap

    view = MultiMap([(1, "a"), ([1], "x"), (2, "b"), (1, "c"), ((1,), "d")])
    assert (view[1], view[2], view[3], view[(1,)]) == (["a", "c"], ["b"], [], ["d"])
    with pytest.raises(TypeError, match="unhashable"):  # as Beam's MultiMap
        view[[1]]
    with pytest.raises(TypeError, match="AsMultiMap"):
        pickle.dumps(view)


def test_a_stateful_dofn_reading_a_side_input_per_window_keeps_the_bundle_processor():
    assert _enriching_on_objects(_stateful_windowed_side_input) == [False]


def _enriching_on_objects(build) -> list[bool]:
    """Of each planned stage with an ``Enrich`` step: whether it runs on element objects."""
    p = beam.Pipeline()
    build(p)
    plan = plan_pipeline(p.to_runner_api(), 1 << 20, 2)
    return [stage.direct is not None for stage in plan.stages if any("Enrich" in step for step in stage.steps)]


def _weighted(word, table, scale=1, *, suffix):
    return f"{word}:{table.get(word, 0) * scale}{suffix}"


def _keyword_arguments(p):
    table = p | "Table" >> beam.Create([("a", 2), ("b", 3)])
    words = p | beam.Create(["a", "b", "c"])
    return (words
            # Keywords out of the parameters' order, one keyword-only: as Python binds them.
            | "Keywords" >> beam.Map(_weighted, suffix="!", scale=10, table=beam.pvalue.AsDict(table))
            | "Lambda" >> beam.Map(lambda s, n, *, sep: f"{s}{sep}{n}", 7, sep="/")
            | "Partial" >> beam.Map(lambda s, d, scale=1: (s, scale * len(d)), scale=3, d=beam.pvalue.AsDict(table)))


def test_keyword_arguments_and_side_inputs_bind_as_in_beam(tmp_path):
    got = spark_equals_direct(_keyword_arguments, tmp_path)
    assert sorted(got) == [["a:20!/7", 6], ["b:30!/7", 6], ["c:0!/7", 6]]


class _CountingSum(beam.CombineFn):
    def __init__(self):
        self.added = Metrics.counter("combine", "added")

    def create_accumulator(self):
        return 0

    def add_input(self, acc, x):
        if x < 0:
            raise ValueError(f"negative input {x}")
        self.added.inc()
        return acc + x

    def merge_accumulators(self, accs):
        return sum(accs)

    def extract_output(self, acc):
        return acc


def test_a_combine_fns_metrics_count_under_its_step_as_in_beam():
    def run(runner):
        p = beam.Pipeline(runner=runner)
        _ = (p | beam.Create([(k % 4, k) for k in range(40)]) | "Total" >> beam.CombinePerKey(_CountingSum()))
        result = p.run()
        result.wait_until_finish()
        [added] = result.metrics().query(MetricsFilter().with_name("added").with_step("Total"))["counters"]
        return added.committed
    assert run(SparkRunner()) == run("DirectRunner") == 40


def test_a_failing_combine_fn_names_its_step():
    with pytest.raises(PipelineError) as info:
        with beam.Pipeline(runner=SparkRunner()) as p:
            _ = p | beam.Create([(1, 1), (1, -1)]) | "Total" >> beam.CombinePerKey(_CountingSum())
    assert "Total" in str(info.value) and "negative input -1" in str(info.value)


def _seed_pairs(seed: int):
    # 40,000 pairs a seed over 280,000 keys: seeds 0 and 7 share theirs.
    return [((seed * 40_000 + i) % 280_000, 1) for i in range(40_000)]


def test_a_combine_per_key_over_keys_that_hardly_repeat_counts_every_value(spark):
    # A task takes at least 160,000 of the 320,000 pairs: past the 100,000
    # its partial combine probes, its keys have not repeated, and it passes
    # the rest of its values on alone; their sums are still whole.
    with beam.Pipeline(runner=SparkRunner()) as p:
        sums = (p | beam.Create(range(8)) | beam.Reshuffle() | beam.FlatMap(_seed_pairs)
                | beam.CombinePerKey(sum) | beam.Values() | beam.combiners.Count.PerElement())
        assert_that(sums, equal_to([(1, 240_000), (2, 40_000)]))


def test_the_partial_combine_evicts_its_oldest_keys_and_loses_none():
    # Beam's bound is 100,000 keys (1,000,000 for small accumulators); a
    # small one shows the eviction on a few elements.
    from apache_beam.internal import pickler
    from apache_beam.metrics.execution import MetricsContainer

    from beam_ext.runner import _element_batches as element_batches
    from beam_ext.runner.worker import _direct

    combine = _direct.DirectCombine("Total/Precombine", pickler.dumps((_CountingSum(), [], {})),
                                    core.Windowing(window.GlobalWindows()))
    values = [window.GlobalWindows.windowed_value((k % 50, k)) for k in range(1000)]
    seen: list[list] = []
    for batch in _direct._precombine(combine, _direct._Tracker(), _direct._State(MetricsContainer("t")),
                                     element_batches.batched(iter(values)), max_keys=10):
        seen.append(batch)
    outputs = [wv.value for batch in seen for wv in element_batches.windowed(batch)]
    assert len(seen) > 1 and len(outputs) > 50  # keys left and came back
    totals: dict = {}
    for key, partial in outputs:
        totals[key] = totals.get(key, 0) + partial
    assert totals == {k: sum(range(k, 1000, 50)) for k in range(50)}


PLAIN_FNS = [combiners.CountCombineFn(), combiners.MeanCombineFn(), core.CombineFn.maybe_from_callable(sum),
             core.CombineFn.maybe_from_callable(min), core.CombineFn.maybe_from_callable(max),
             # What a pipeline's CombinePerKey(sum) carries once it is a proto.
             core.NoSideInputsCallableWrapperCombineFn(sum),
             combiners.SingleInputTupleCombineFn(sum, max, min, combiners.CountCombineFn(), combiners.MeanCombineFn())]
PLAIN_IDS = ["count", "mean", "sum", "min", "max", "sum-no-side-inputs", "single-input-tuple"]


def _partial_combine(fn, kvs: list, max_keys: int | None = None, probe_rows: int | None = None,
                     batch_size: int | None = None) -> list:
    from apache_beam.internal import pickler
    from apache_beam.metrics.execution import MetricsContainer

    from beam_ext.runner import _element_batches as element_batches
    from beam_ext.runner.worker import _direct

    combine = _direct.DirectCombine("Fn/Precombine", pickler.dumps((fn, [], {})),
                                    core.Windowing(window.GlobalWindows()))
    values = [window.GlobalWindows.windowed_value(kv) for kv in kvs]
    batches = element_batches.batched(iter(values), *(() if batch_size is None else (batch_size,)))
    probe = {} if probe_rows is None else {"probe_rows": probe_rows}
    return [wv.value for batch in _direct._precombine(
        combine, _direct._Tracker(), _direct._State(MetricsContainer("t")),
        map(element_batches.as_batch, batches), max_keys=max_keys, **probe) for wv in element_batches.windowed(batch)]


class _SortedValues(beam.CombineFn):
    """A key's values, sorted; its accumulator compacts into a tuple."""

    def create_accumulator(self):
        return []

    def add_input(self, accumulator, value):
        return [*accumulator, value]

    def merge_accumulators(self, accumulators):
        return [value for accumulator in accumulators for value in accumulator]

    def compact(self, accumulator):
        return tuple(sorted(accumulator))

    def extract_output(self, accumulator):
        return sorted(accumulator)


# CombineFns the partial combine runs by their own methods, not as plain accumulators.
OTHER_FNS = [combiners.ToListCombineFn(), combiners.TopCombineFn(2), _SortedValues()]
OTHER_IDS = ["to-list", "top", "sorted-values"]


@pytest.mark.parametrize("fn", PLAIN_FNS + OTHER_FNS, ids=PLAIN_IDS + OTHER_IDS)
def test_a_partial_combine_whose_keys_do_not_repeat_passes_each_value_on_as_beams_accumulator(fn):
    # Keys that do not repeat in the first elements taken (7 here, 100,000
    # by default): the table's keys are emitted, and every next value passes
    # on alone, as the compacted accumulator Beam's add_input makes of it
    # (to the bit), in the order taken.
    kvs = [(k, k * 0.5 - 7) for k in range(40)] + [(3, -0.0), (3, 2.5)]
    got = _partial_combine(fn, kvs, probe_rows=7, batch_size=7)
    assert repr(got) == repr([(k, fn.compact(fn.add_input(fn.create_accumulator(), v))) for k, v in kvs])


@pytest.mark.parametrize("fn", PLAIN_FNS[:3] + OTHER_FNS[:1], ids=PLAIN_IDS[:3] + OTHER_IDS[:1])
def test_a_partial_combine_whose_keys_repeat_keeps_combining(fn):
    # 7 elements of 3 keys: 0.43 keys an element, under the 0.8 it passes at.
    kvs = [(k % 3, k) for k in range(40)]
    got = _partial_combine(fn, kvs, probe_rows=7, batch_size=7)
    assert sorted(key for key, _ in got) == [0, 1, 2]


@pytest.mark.parametrize("fn", PLAIN_FNS + OTHER_FNS, ids=PLAIN_IDS + OTHER_IDS)
@settings(max_examples=30, deadline=None)
@given(kvs=st.lists(st.tuples(st.integers(0, 40), st.integers(-10**20, 10**20)), max_size=80),
       probe_rows=st.integers(1, 30), batch_size=st.integers(1, 9))
def test_a_partial_combine_probing_its_keys_loses_nothing(fn, kvs, probe_rows, batch_size):
    # Whether it passes values on or keeps combining, nothing is lost.
    _assert_partials_merge_as_beams(fn, kvs, _partial_combine(fn, kvs, probe_rows=probe_rows, batch_size=batch_size))


def _assert_partials_merge_as_beams(fn, kvs: list, outputs: list) -> None:
    """Each key's partial accumulators in ``outputs`` merge into Beam's result
    of adding the key's values of ``kvs`` one at a time."""
    partials: dict = {}
    for key, partial in outputs:
        partials.setdefault(key, []).append(partial)
    want: dict = {}
    for key, value in kvs:
        want[key] = fn.add_input(want.get(key, fn.create_accumulator()), value)
    assert ({key: fn.extract_output(fn.merge_accumulators(accs)) for key, accs in partials.items()}
            == {key: fn.extract_output(acc) for key, acc in want.items()})


@pytest.mark.parametrize("fn", PLAIN_FNS, ids=PLAIN_IDS)
@settings(max_examples=40, deadline=None)
@given(kvs=st.lists(st.tuples(st.integers(0, 2), st.one_of(
    st.integers(-10**20, 10**20), st.floats(allow_nan=False, allow_infinity=False))), max_size=60))
def test_plain_partial_combines_equal_beams_accumulators_to_the_bit(fn, kvs):
    # Count, Mean, sum, min and max keep plain accumulators updated in place;
    # each key's must equal Beam's own add_input one value at a time, then
    # compact (a float's sign of zero and rounding included).
    assert plain_accumulators(fn) is not None
    want: dict = {}
    for key, value in kvs:
        want[key] = fn.add_input(want.get(key, fn.create_accumulator()), value)
    got = dict(_partial_combine(fn, kvs))
    assert repr(got) == repr({key: fn.compact(acc) for key, acc in want.items()})


@pytest.mark.parametrize("fn", PLAIN_FNS, ids=PLAIN_IDS)
def test_plain_partial_combines_evict_their_oldest_keys_and_lose_none(fn):
    # Their eviction too loses nothing.
    kvs = [(k % 50, k * 0.5) for k in range(3000)]
    outputs = _partial_combine(fn, kvs, max_keys=10)
    assert len(outputs) > 50  # keys left and came back
    _assert_partials_merge_as_beams(fn, kvs, outputs)


def _partials_per_key_and_window(combine, values: list, max_keys: int | None, folded=None) -> dict:
    """(key, window) -> the partial combine's accumulators for it, each output
    checked to be in one window and stamped at its end."""
    from apache_beam.metrics.execution import MetricsContainer

    from beam_ext.runner import _element_batches as element_batches
    from beam_ext.runner.worker import _direct

    out = [wv for batch in _direct._precombine(
        combine, _direct._Tracker(), _direct._State(MetricsContainer("t")),
        map(element_batches.as_batch, element_batches.batched(iter(values), 7)), max_keys=max_keys, folded=folded)
        for wv in element_batches.windowed(batch)]
    assert all(len(wv.windows) == 1 and wv.timestamp == wv.windows[0].max_timestamp() for wv in out)
    partials: dict = {}
    for wv in out:
        partials.setdefault((wv.value[0], wv.windows[0]), []).append(wv.value[1])
    return partials


def _runs_of_beams_accumulators(fn, values: list, accumulators: list) -> bool:
    """Whether ``accumulators``, in order, are Beam's compacted accumulators of
    consecutive runs of ``values`` (``add_input`` one value at a time), covering them all."""
    wanted = [repr(a) for a in accumulators]

    @functools.cache
    def covers(start: int, run: int) -> bool:
        if run == len(wanted):
            return start == len(values)
        acc = fn.create_accumulator()
        for end in range(start, len(values)):
            acc = fn.add_input(acc, values[end])
            if repr(fn.compact(acc)) == wanted[run] and covers(end + 1, run + 1):
                return True
        return False

    return covers(0, 0)


@pytest.mark.parametrize("fn", PLAIN_FNS, ids=PLAIN_IDS)
@settings(max_examples=25, deadline=None)
@given(events=st.lists(st.tuples(st.integers(0, 2), st.one_of(st.integers(-10**20, 10**20), st.floats(
           allow_nan=False, allow_infinity=False)), st.integers(-20, 20)), max_size=60),
       max_keys=st.sampled_from([None, 4]), windows=st.sampled_from(["fixed", "sliding"]))
@example(events=[(1, 1, 0), (0, 0, 0), (0, 0, 0), (0, 0, 0), (0, 0, 0), (0, 0, 0), (0, 0, 0), (0, 0, 0),
                 (1, 9007199254740992.0, 0), (1, -1, 0)], max_keys=4, windows="sliding")
def test_plain_windowed_partial_combines_equal_beams_per_key_and_window(fn, events, max_keys, windows):
    # Windowed (at the end of the window), the plain accumulators are kept per
    # key and window; evicted ones come back; each is Beam's add_input one
    # value at a time over its run of the key-window's values, to the bit.
    from apache_beam.internal import pickler
    from apache_beam.utils.windowed_value import WindowedValue

    from beam_ext.runner.worker import _direct

    windowfn = WINDOWS[windows]
    combine = _direct.DirectCombine("Fn/Precombine", pickler.dumps((fn, [], {})), core.Windowing(windowfn))
    values = [WindowedValue((k, v), ts, tuple(windowfn.assign(window.WindowFn.AssignContext(ts))))
              for k, v, ts in events]
    partials = _partials_per_key_and_window(combine, values, max_keys)
    added: dict = {}  # (key, window) -> its values, in input order
    for wv in values:
        for w in wv.windows:
            added.setdefault((wv.value[0], w), []).append(wv.value[1])
    assert partials.keys() == added.keys()
    if max_keys is None:
        assert all(len(p) == 1 for p in partials.values())
    # An evicted accumulator and the one begun after it split the values:
    # float sums then differ from one accumulator's in the last bit, as
    # between two bundles. Each must still be Beam's own, to the bit.
    for key, accumulators in partials.items():
        assert _runs_of_beams_accumulators(fn, added[key], accumulators), key


@pytest.mark.parametrize("fn", PLAIN_FNS[:3] + [combiners.TopCombineFn(2)], ids=PLAIN_IDS[:3] + ["top"])
@settings(max_examples=25, deadline=None)
@given(events=st.lists(st.tuples(st.integers(0, 2), st.integers(-50, 50), st.integers(-20, 20)), max_size=60),
       max_keys=st.sampled_from([None, 4]), windows=st.sampled_from(["fixed", "sliding"]),
       copies=st.integers(1, 3), same=st.booleans())
def test_a_window_into_folded_into_the_partial_combine_equals_beams(fn, events, max_keys, windows, copies, same):
    # The WindowInto before the combine folded in: elements in the windows
    # they had before (once per window, as Beam's AssignWindows outputs them),
    # each added in the windows the WindowInto assigns. Plain accumulators
    # take their windows with their keys; Top runs the WindowInto first.
    # Batches sharing a timestamp too (``same``).
    from apache_beam.internal import pickler
    from apache_beam.utils.windowed_value import WindowedValue

    from beam_ext.runner.worker import _direct

    windowfn = WINDOWS[windows]
    before = window.SlidingWindows(copies, 1) if copies > 1 else window.GlobalWindows()
    combine = _direct.DirectCombine("Fn/Precombine", pickler.dumps((fn, [], {})), core.Windowing(windowfn))
    if same:
        events = [(k, v, 7) for k, v, _ in events]
    values = [WindowedValue((k, v), ts, tuple(before.assign(window.WindowFn.AssignContext(ts))))
              for k, v, ts in events]
    partials = _partials_per_key_and_window(combine, values, max_keys, folded=windowfn)
    want: dict = {}
    for wv in values:
        for _ in wv.windows:  # Beam's AssignWindows: once per window the element was in
            for w in windowfn.assign(window.WindowFn.AssignContext(wv.timestamp)):
                key = (wv.value[0], w)
                want[key] = fn.add_input(want.get(key, fn.create_accumulator()), wv.value[1])
    assert ({k: fn.extract_output(fn.merge_accumulators(p)) for k, p in partials.items()}
            == {k: fn.extract_output(a) for k, a in want.items()})


@pytest.mark.parametrize("timestamps", sorted(COMBINERS))
def test_the_partial_combine_keeps_each_window_of_an_element_apart(timestamps):
    # An element in several windows (a materialized sliding-window
    # PCollection keeps them together) adds to each window's accumulator.
    from apache_beam.internal import pickler
    from apache_beam.metrics.execution import MetricsContainer
    from apache_beam.utils.windowed_value import WindowedValue

    from beam_ext.runner import _element_batches as element_batches
    from beam_ext.runner.worker import _direct

    windowing = core.Windowing(window.SlidingWindows(6, 2), timestamp_combiner=COMBINERS[timestamps])
    combine = _direct.DirectCombine("Total/Precombine", pickler.dumps((core.CombineFn.maybe_from_callable(sum), [], {})),
                                    windowing)
    # Elements of differing windows, then a batch of elements sharing theirs.
    events = [("a", 1, 1), ("a", 2, 3), ("b", 5, 4), ("a", 7, 8)] + [("c", v, 5) for v in range(20)]
    values = [WindowedValue((k, v), ts, tuple(window.SlidingWindows(6, 2).assign(
        window.WindowFn.AssignContext(ts)))) for k, v, ts in events]
    batches = [element_batches.as_batch(values[:4]), element_batches.as_batch(values[4:])]
    assert type(batches[0]) is list and type(batches[1]) is element_batches.Same
    out = [wv for batch in _direct._precombine(combine, _direct._Tracker(), _direct._State(MetricsContainer("t")),
                                               iter(batches)) for wv in element_batches.windowed(batch)]
    want = {}
    for k, v, ts in events:
        for w in window.SlidingWindows(6, 2).assign(window.WindowFn.AssignContext(ts)):
            total, stamps = want.get((k, w), (0, []))
            want[(k, w)] = (total + v, stamps + [ts])
    got = {(wv.value[0], wv.windows[0]): (sum(wv.value[1]), wv.timestamp) for wv in out}
    assert all(len(wv.windows) == 1 for wv in out)
    expected_stamp = {"earliest": min, "latest": max, "end_of_window": None}[timestamps]
    assert got == {key: (total, expected_stamp(stamps) if expected_stamp else key[1].max_timestamp())
                   for key, (total, stamps) in want.items()}


def test_a_cogroupbykeys_tagging_stages_run_on_objects_and_equal_beam(tmp_path, caplog):
    # Beam's fusion ends each tagging stage with a one-input Flatten (a coder
    # change before the Flatten's buffer): the elements pass as they are.
    def build(p):
        left = p | "Left" >> beam.Create([(k % 7, k) for k in range(40)]) | "Double" >> beam.MapTuple(
            lambda k, v: (k, 2 * v))
        right = p | "Right" >> beam.Create([(k, str(k)) for k in range(0, 9, 2)])
        return ({"l": left, "r": right} | beam.CoGroupByKey()
                | beam.MapTuple(lambda k, g: (k, sorted(g["l"]), sorted(g["r"]))))
    with caplog.at_level(logging.DEBUG, logger="beam_ext.runner"):
        got = spark_equals_direct(build, tmp_path)
    assert sorted(map(tuple, got))[0] == (0, [0, 14, 28, 42, 56, 70], ["0"])
    assert len(got) == 8  # keys 0-6 on the left, 8 on the right alone
    taken = [r.getMessage() for r in caplog.records if OBJECTS in r.getMessage()]
    assert any("Double" in m and "CoGroupByKey" in m for m in taken)


def _flatten_of_a_reshuffle(p):
    # Numbers from a Reshuffle and pairs flattened: each input's coder differs
    # from the Flatten's, and Beam's fusion re-encodes the Reshuffle's output in
    # a stage of its own, "Flatten/Transcode".
    pairs = p | "Numbers" >> beam.Create(range(5)) | "Pair" >> beam.Map(lambda x: (x, "paired"))
    spread = p | "Spread" >> beam.Create(range(3, 8)) | "Shuffle" >> beam.Reshuffle()
    return ((pairs, spread) | beam.Flatten() | "Window" >> beam.Map(lambda e, w=beam.DoFn.WindowParam: (e, repr(w)))
            | "Key" >> beam.Map(lambda e: (repr(e), e)) | beam.GroupByKey() | beam.FlatMap(lambda kv: kv[1]))


def test_a_flattens_transcoding_stage_runs_on_objects_and_equals_beam(tmp_path):
    got = spark_equals_direct(_flatten_of_a_reshuffle, tmp_path)
    assert sorted(map(repr, got)) == sorted(map(repr, [[[k, "paired"], "GlobalWindow"] for k in range(5)]
                                                + [[k, "GlobalWindow"] for k in range(3, 8)]))
    p = beam.Pipeline()
    _flatten_of_a_reshuffle(p)
    # The steps after the Flatten, up to the grouping, run in
    # each of its inputs' stages (write_flattens_to_their_grouping).
    transcoding = [stage.direct is not None for stage in plan_pipeline(p.to_runner_api(), 1 << 20, 2).stages
                   if stage.steps == ("Flatten", "Window", "Key")]
    assert transcoding == [True]


def test_a_stage_reading_an_impulse_runs_on_objects(tmp_path, caplog):
    # Beam's Impulse is read from the runner's impulse buffer, not a grouping.
    def build(p):
        return p | beam.Impulse() | "Unpack" >> beam.FlatMap(lambda impulse: [len(impulse), 1, 2])
    with caplog.at_level(logging.DEBUG, logger="beam_ext.runner"):
        assert sorted(spark_equals_direct(build, tmp_path)) == [0, 1, 2]
    assert any(OBJECTS in r.getMessage() and "Unpack" in r.getMessage() for r in caplog.records)


class _ReturnsText(beam.DoFn):
    """Returns a str from process: Beam refuses it for a DoFn class (apache/beam#18712)."""

    def process(self, element):
        return f"word{element}"


def test_a_dofn_class_returning_a_str_fails_as_in_beam_and_a_flatmaps_str_is_its_characters():
    with pytest.raises(PipelineError) as info:
        with beam.Pipeline(runner=SparkRunner()) as p:
            _ = p | beam.Create([1, 2]) | "Text" >> beam.ParDo(_ReturnsText())
    assert "Returning a str from a ParDo or FlatMap is not allowed" in str(info.value)
    assert "Text" in str(info.value)
    with beam.Pipeline(runner=SparkRunner()) as p:
        chars = p | "Words" >> beam.Create(["ab", "c"]) | beam.FlatMap(lambda w: w)
        assert_that(chars, equal_to(["a", "b", "c"]))


GROUPED = "takes its groups as objects"
_KEYS = st.one_of(st.integers(-3, 3), st.sampled_from(["", "a", "é"]), st.none(), st.tuples(st.booleans(), st.integers(0, 2)),
                  st.sampled_from([0.5, -0.0, 2.0]))
_VALUES = st.one_of(st.integers(-2**62, 2**62), st.text(max_size=3), st.binary(max_size=3), st.floats(allow_nan=False),
                    st.lists(st.integers(0, 9), max_size=2), st.none())


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kvs=st.lists(st.tuples(_KEYS, _VALUES), max_size=80), spill=st.booleans())
def test_groups_taken_as_objects_equal_beams(tmp_path_factory, caplog, kvs, spill):
    # Under a 1 KiB budget a task's groups spill and merge: a key's values
    # then arrive in several pieces of several values each.
    def build(p):
        pairs = p | beam.Create(kvs) | "Swap" >> beam.MapTuple(lambda k, v: (k, [v]))
        windowed = (pairs | beam.Map(lambda kv: window.TimestampedValue(kv, len(repr(kv[1]))))
                    | beam.WindowInto(window.FixedWindows(4)))

        # Both groupings of a branch feed object stages; the second shows
        # the first's windows (_Stamped's stage is the bundle processor's).
        def grouped(label, branch):
            return (branch | f"{label}Group" >> beam.GroupByKey()
                    | f"{label}Sizes" >> beam.MapTuple(lambda k, vs: (0, (repr(k), sorted(map(repr, vs)))))
                    | f"{label}Regroup" >> beam.GroupByKey()
                    | f"{label}Sort" >> beam.MapTuple(lambda _, groups: [label, sorted(groups)])
                    | f"{label}Stamp" >> beam.ParDo(_Stamped())
                    | f"{label}Rewindow" >> beam.WindowInto(window.GlobalWindows()))  # for the Flatten
        return (grouped("Global", pairs), grouped("Fixed", windowed)) | beam.Flatten()
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="beam_ext.runner"):
        spark_equals_direct(build, tmp_path_factory.mktemp("groups"),
                            ["--spark_group_memory=1024"] if spill else None)
    taken = [r.getMessage() for r in caplog.records if GROUPED in r.getMessage()]
    assert any("GlobalSizes" in m for m in taken) and any("FixedSizes" in m for m in taken)


class _AllParams(beam.DoFn):
    """Every DoFn parameter a stage on objects gives, with an extra argument after them."""

    def process(self, element, t=beam.DoFn.TimestampParam, w=beam.DoFn.WindowParam,
                pane=beam.DoFn.PaneInfoParam, wv=beam.DoFn.WindowedValueParam, suffix="?"):
        yield [element, float(t), repr(w), pane.is_first, pane.timing, len(wv.windows), suffix]


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases=st.lists(st.tuples(
    st.lists(st.tuples(st.sampled_from("abc"), st.integers(-5, 20), st.integers(0, 30)), max_size=40),
    st.sampled_from(sorted(WINDOWS))), min_size=1, max_size=4))
def test_dofn_parameters_and_window_into_run_on_objects_as_beam(tmp_path_factory, caplog, cases):
    def build(p, case, events, windows):
        # WindowInto (a DoFn of the timestamp and window) and a DoFn of every
        # parameter, once per window of an element in several, as Beam calls it.
        return (_timestamped(p, events, case)
                | f"Window{case}" >> beam.WindowInto(WINDOWS[windows])
                | f"Params{case}" >> beam.ParDo(_AllParams(), suffix="!")
                | f"Stamp again{case}" >> beam.Map(lambda row, t=beam.DoFn.TimestampParam: row + [float(t)]))
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="beam_ext.runner"):
        _cases_equal_beam(build, cases, tmp_path_factory.mktemp("params"))
    for case in map(str, range(len(cases))):
        assert any(OBJECTS in r.getMessage() and f"Window{case}" in r.getMessage()
                   and f"Params{case}" in r.getMessage() for r in caplog.records)


class _KeyOf(beam.DoFn):
    def process(self, kv, key=beam.DoFn.KeyParam):
        yield key


def test_a_dofn_of_other_parameters_keeps_the_bundle_processor(tmp_path, caplog):
    with caplog.at_level(logging.DEBUG, logger="beam_ext.runner"):
        out = spark_equals_direct(lambda p: (p | beam.Create([("a", 1), ("b", 2)]) | beam.Reshuffle()
                                             | "Keys" >> beam.ParDo(_KeyOf())), tmp_path)
    assert sorted(out) == ["a", "b"]
    assert not any(OBJECTS in r.getMessage() and "Keys" in r.getMessage() for r in caplog.records)


class _OneSecond(window.FixedWindows):
    """A subclass of a standard window function that assigns otherwise: its own ``assign`` must run."""

    def assign(self, context):
        return [window.IntervalWindow(context.timestamp, context.timestamp + 1)]


_REWINDOW = {"fixed": window.FixedWindows(5, 1), "global": window.GlobalWindows(), "subclass": _OneSecond(5)}


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cases=st.lists(st.tuples(
    st.lists(st.tuples(st.sampled_from("ab"), st.integers(-5, 20), st.integers(-30, 30)), max_size=30),
    st.sampled_from(sorted(_REWINDOW))), min_size=1, max_size=4))
def test_window_into_of_elements_in_several_windows_repeats_them_as_beam(tmp_path_factory, caplog, cases):
    def build(p, case, events, to):
        # Sliding windows put each element in three; re-windowing keeps one copy
        # per window (fixed windows, the global window, a subclass's own).
        return (_timestamped(p, events, case) | f"Slide{case}" >> beam.WindowInto(window.SlidingWindows(6, 2))
                | f"Rewindow{case}" >> beam.WindowInto(_REWINDOW[to]) | f"Sum{case}" >> beam.CombinePerKey(sum)
                | f"Params{case}" >> beam.ParDo(_AllParams(), suffix=to))
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="beam_ext.runner"):
        _cases_equal_beam(build, cases, tmp_path_factory.mktemp("rewindow"))
    for case in map(str, range(len(cases))):
        assert any(OBJECTS in r.getMessage() and f"Rewindow{case}" in r.getMessage() for r in caplog.records)
