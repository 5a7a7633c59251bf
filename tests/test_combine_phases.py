"""A grouped combine's merge and extract phases give what Beam's PhasedCombineFnExecutor gives."""
from __future__ import annotations

import math

import apache_beam as beam
import hypothesis.strategies as st
from apache_beam.transforms import combiners, core
from hypothesis import given

from beam_ext.runner.worker._direct import phase_apply

_NUMBERS = st.one_of(st.integers(-5, 5), st.floats(allow_nan=False), st.sampled_from([0.0, -0.0, math.inf]))


def _fns():
    # CombinePerKey(f) wraps f without side inputs; with them, Beam's other wrapper.
    return [core.CombineFn.maybe_from_callable(f, has_side_inputs=side) for f in (sum, min, max, lambda vs: sorted(vs)[:2])
            for side in (False, True)] + [
        combiners.MeanCombineFn(), combiners.CountCombineFn(), combiners.TopCombineFn(2)]


def _same(a, b) -> bool:
    return repr(a) == repr(b)  # -0.0 against 0.0 and int against float told apart


@given(groups=st.lists(st.lists(_NUMBERS, min_size=1, max_size=6), min_size=1, max_size=4))
def test_merge_then_extract_as_beams_executor(groups):
    for fn in _fns():
        accumulators = [fn.add_inputs(fn.create_accumulator(), group) for group in groups]
        if isinstance(fn, combiners.TopCombineFn):
            accumulators = [fn.compact(acc) for acc in accumulators]
        merged = {}
        for name in ("merge", "extract"):
            beams = combiners.PhasedCombineFnExecutor(name, fn, (), {})
            ours = phase_apply(name, beams)
            given_value = accumulators if name == "merge" else merged["beam"]
            merged_ours = ours(given_value if name == "merge" else merged["ours"])
            merged_beam = beams.apply(given_value)
            if name == "merge":
                merged = {"beam": merged_beam, "ours": merged_ours}
            assert _same(merged_ours, merged_beam), (fn, name)
        # Both phases in one call, as a merge runs with its extract.
        both = phase_apply("merge_extract", combiners.PhasedCombineFnExecutor("merge", fn, (), {}))
        assert _same(both(accumulators), fn.extract_output(fn.merge_accumulators(accumulators))), fn


def test_sum_merges_without_beams_chain_and_a_reiterating_function_keeps_it():
    wrapped = core.CombineFn.maybe_from_callable(sum, has_side_inputs=False)
    fast = phase_apply("merge", combiners.PhasedCombineFnExecutor("merge", wrapped, (), {}))
    assert fast != wrapped.merge_accumulators
    assert fast([[1, 2], [3]]) == [6]
    twice = core.CombineFn.maybe_from_callable(lambda vs: sum(vs) * len(list(vs)), has_side_inputs=False)
    kept = phase_apply("merge", combiners.PhasedCombineFnExecutor("merge", twice, (), {}))
    assert kept == twice.merge_accumulators and kept([[1, 2], [3]]) == [18]


def test_combine_per_key_on_spark_and_direct_runner_equal_the_sums(spark):
    from apache_beam.testing.util import assert_that, equal_to

    from beam_ext.runner import SparkRunner

    # Quarters: every order of adding them gives the same float.
    pairs = [(k % 7, v) for k, v in zip(range(300), [0.5, -0.0, 3, -2.25] * 75)]
    expected = [repr((key, sum(v for k, v in pairs if k == key))) for key in range(7)]
    for runner in ("DirectRunner", SparkRunner()):
        with beam.Pipeline(runner=runner) as p:
            out = p | beam.Create(pairs) | beam.CombinePerKey(sum) | beam.Map(repr)
            assert_that(out, equal_to(expected))


class _PhaseCounts(beam.CombineFn):
    """A sum counting its merges and extractions."""

    def __init__(self):
        from apache_beam.metrics import Metrics
        self.merged = Metrics.counter("phases", "merged")
        self.extracted = Metrics.counter("phases", "extracted")

    def create_accumulator(self):
        return 0

    def add_input(self, accumulator, value):
        return accumulator + value

    def merge_accumulators(self, accumulators):
        self.merged.inc()
        return sum(accumulators)

    def extract_output(self, accumulator):
        self.extracted.inc()
        return accumulator


def test_a_combine_fns_merge_and_extract_count_under_their_own_steps_as_in_beam(spark):
    # SparkRunner runs a plain CombineFn's merge and extract in one pass;
    # a user's still counts each phase under its own step.
    from apache_beam.metrics.metric import MetricsFilter

    from beam_ext.runner import SparkRunner

    def counts(runner):
        p = beam.Pipeline(runner=runner)
        _ = p | beam.Create([(k % 4, k) for k in range(40)]) | "Total" >> beam.CombinePerKey(_PhaseCounts())
        result = p.run()
        result.wait_until_finish()
        return sorted((m.key.step, m.key.metric.name, m.committed)
                      for m in result.metrics().query(MetricsFilter().with_namespace("phases"))["counters"])

    assert counts(SparkRunner()) == counts("DirectRunner") == [
        ("Total/ExtractOutputs", "extracted", 4), ("Total/Merge", "merged", 4)]


def _tuple_fns():
    return [combiners.TupleCombineFn(sum, max, combiners.MeanCombineFn(), combiners.CountCombineFn()),
            combiners.SingleInputTupleCombineFn(sum, min, combiners.MeanCombineFn())]


def _tuple_accumulators(fn, groups: list) -> list:
    # A TupleCombineFn adds tuples, a component each; its single-input kin, values.
    if type(fn) is combiners.TupleCombineFn:
        groups = [[(v, -v, v, v) for v in group] for group in groups]
    return [fn.compact(fn.add_inputs(fn.create_accumulator(), group)) for group in groups]


@given(groups=st.lists(st.lists(_NUMBERS, min_size=1, max_size=6), min_size=1, max_size=4))
def test_a_tuple_of_combine_fns_merges_and_extracts_in_one_call_as_beam(groups):
    for fn in _tuple_fns():
        accumulators = _tuple_accumulators(fn, groups)
        both = phase_apply("merge_extract", combiners.PhasedCombineFnExecutor("merge", fn, (), {}))
        assert _same(both(accumulators), fn.extract_output(fn.merge_accumulators(accumulators))), fn


def test_a_tuple_of_combine_fns_merges_many_accumulators_as_beams_batches():
    # Beam merges a tuple's accumulators in batches (250 at a time for four
    # components): the one call folds them all at once, to the same floats.
    import random

    rng = random.Random(7)
    groups = [[rng.uniform(-1e6, 1e6) for _ in range(rng.randint(1, 3))] for _ in range(1_200)]
    for fn in _tuple_fns():
        accumulators = _tuple_accumulators(fn, groups)
        both = phase_apply("merge_extract", combiners.PhasedCombineFnExecutor("merge", fn, (), {}))
        assert _same(both(accumulators), fn.extract_output(fn.merge_accumulators(accumulators))), fn
