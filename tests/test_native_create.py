"""beam.Create on SparkRunner: one native Spark step, the same elements as Beam's expansion."""
from __future__ import annotations

import glob
import logging
import math

import apache_beam as beam
import numpy
import pytest
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import given, reject, settings
from hypothesis import strategies as st
from pipeline_outputs import spark_jobs_run, streaming_equals_direct

from beam_ext.runner import SparkRunner
from beam_ext.runner.native import CREATE_URN
from beam_ext.runner.planning._create_type import create_output_type


class Point:
    """Has no Beam coder of its own: Create pickles it."""

    def __init__(self, x: int) -> None:
        self.x = x

    def __eq__(self, other):
        return isinstance(other, Point) and other.x == self.x

    def __hash__(self):
        return hash(self.x)

    def __repr__(self):
        return f"Point({self.x})"


def _element_info(value, ts=beam.DoFn.TimestampParam, window=beam.DoFn.WindowParam):
    yield repr(value), int(ts.micros), repr(window)


VALUES = [
    list(range(50)),
    [1, "a", 2.5, None, (1, "b"), {"k": [1, 2]}, b"bytes", True],
    [Point(1), Point(2)],
    [beam.Row(a=1, b="x"), beam.Row(a=2, b="y")],
    [],
    ["only one"],
]


def _collect(runner, values, prefix: str) -> list[str]:
    # Through files: a matcher's closure is pickled, so it cannot fill a list of the test's.
    with beam.Pipeline(runner=runner) as p:
        _ = p | beam.Create(values) | beam.ParDo(_element_info) | beam.Map(repr) | beam.io.WriteToText(prefix)
    return sorted(line for path in glob.glob(prefix + "*") for line in open(path))


@pytest.mark.parametrize("values", VALUES, ids=["ints", "mixed", "pickled", "rows", "empty", "one"])
def test_elements_windows_and_timestamps_equal_beams(spark, tmp_path, values, caplog):
    want = _collect("DirectRunner", values, str(tmp_path / "direct" / "out"))
    with caplog.at_level(logging.INFO, logger="beam_ext.runner"):
        got = _collect(SparkRunner(), values, str(tmp_path / "spark" / "out"))
    assert got == want
    assert len(got) == len(values)
    assert f"runs Spark-natively ({CREATE_URN})" in caplog.text


def _stream_element_info(value, ts=beam.DoFn.TimestampParam, window=beam.DoFn.WindowParam,
                         pane=beam.DoFn.PaneInfoParam):
    yield [repr(value), int(ts.micros), repr(window), repr(pane)]


@pytest.mark.parametrize("values", [VALUES[0], VALUES[1], VALUES[2], VALUES[4]],
                         ids=["ints", "mixed", "pickled", "empty"])
def test_a_create_and_the_reshuffle_after_it_in_streaming_give_the_direct_runners_elements(
        spark, tmp_path, values, caplog):
    """In streaming too the Create runs natively and the Reshuffle reading it
    is dropped; each element's value, timestamp, window and pane are the
    DirectRunner's streaming engine's."""
    def build(p):
        return p | beam.Create(values) | beam.Reshuffle() | beam.ParDo(_stream_element_info)

    with caplog.at_level(logging.INFO, logger="beam_ext.runner"):
        out = streaming_equals_direct(build, tmp_path)
    assert len(out) == len(values)
    assert f"runs Spark-natively ({CREATE_URN})" in caplog.text and "step 'Reshuffle' dropped" in caplog.text


def test_reshuffle_off_keeps_one_bundle_in_order(spark):
    from apache_beam.transforms import util

    with beam.Pipeline(runner=SparkRunner()) as p:
        batches = (p | beam.Create(list(range(10)), reshuffle=False)
                   | util.BatchElements(min_batch_size=10, max_batch_size=10))
        assert_that(batches, equal_to([list(range(10))]))


def test_dict_items_reshuffle_off_and_output_types(spark):
    with beam.Pipeline(runner=SparkRunner()) as p:
        assert_that(p | "Dict" >> beam.Create({"a": 1, "b": 2}), equal_to([("a", 1), ("b", 2)]), label="dict")
        assert_that(p | "NoShuffle" >> beam.Create([3, 1, 2], reshuffle=False), equal_to([1, 2, 3]),
                    label="reshuffle")
        typed = p | "Typed" >> beam.Create([1, 2]).with_output_types(int)
        assert typed.element_type is int
        assert_that(typed | beam.Map(lambda x: x * 2), equal_to([2, 4]), label="typed")


def test_values_go_through_their_coder_as_on_beam(spark):
    # Create encodes its values: a float NaN and -0.0 come back as the coder makes them.
    with beam.Pipeline(runner=SparkRunner()) as p:
        out = p | beam.Create([math.nan, -0.0, 1e300]) | beam.Map(repr)
        assert_that(out, equal_to(["nan", "-0.0", "1e+300"]))


def test_one_create_read_by_two_consumers_and_a_side_input(spark):
    with beam.Pipeline(runner=SparkRunner()) as p:
        numbers = p | beam.Create(range(1, 11))
        total = numbers | "Total" >> beam.CombineGlobally(sum)
        shares = numbers | beam.Map(lambda x, t: x / t, t=beam.pvalue.AsSingleton(total))
        assert_that(shares | "SumShares" >> beam.CombineGlobally(sum), equal_to([1.0]), label="shares")
        assert_that(numbers | beam.combiners.Count.Globally(), equal_to([10]), label="count")


def test_a_create_read_by_two_stages_on_objects_is_computed_by_each_not_persisted(spark, tmp_path):
    """Two readers of one Create run as many Spark jobs as two readers of two
    Creates: no job of its own to encode, persist and count it."""
    values = list(range(100))

    def shared(p):
        numbers = p | beam.Create(values)
        _ = numbers | "Evens" >> beam.Filter(lambda x: x % 2 == 0) | "WriteEvens" >> beam.io.WriteToText(
            str(tmp_path / "shared-evens"))
        _ = numbers | "Odds" >> beam.Filter(lambda x: x % 2) | "WriteOdds" >> beam.io.WriteToText(
            str(tmp_path / "shared-odds"))

    def separate(p):
        _ = (p | "A" >> beam.Create(values) | "Evens" >> beam.Filter(lambda x: x % 2 == 0)
             | "WriteEvens" >> beam.io.WriteToText(str(tmp_path / "separate-evens")))
        _ = (p | "B" >> beam.Create(values) | "Odds" >> beam.Filter(lambda x: x % 2)
             | "WriteOdds" >> beam.io.WriteToText(str(tmp_path / "separate-odds")))

    assert spark_jobs_run(spark, shared) == spark_jobs_run(spark, separate)
    for name, rest in (("evens", 0), ("odds", 1)):
        lines = [int(line) for path in glob.glob(str(tmp_path / f"shared-{name}*")) for line in open(path)]
        assert sorted(lines) == [v for v in values if v % 2 == rest]


class _Doubled(beam.Create):
    """A Create subclass with its own expansion: not Beam's Create, so no native step."""

    def expand(self, pbegin):
        return super().expand(pbegin) | beam.Map(lambda x: x * 2)


def test_a_create_subclass_keeps_its_own_expansion(spark, caplog):
    with caplog.at_level(logging.INFO, logger="beam_ext.runner"):
        with beam.Pipeline(runner=SparkRunner()) as p:
            assert_that(p | "Doubled" >> _Doubled([1, 2, 3]), equal_to([2, 4, 6]))
    assert "step 'Doubled' runs Spark-natively" not in caplog.text


def _reshuffled(p, values, reshuffle: bool = True):
    """Seeds spread by a Reshuffle, then expanded: Beam's idiom; elements with their windowing."""
    return (p | beam.Create(values, reshuffle=reshuffle) | beam.Reshuffle()
            | beam.FlatMap(lambda s: [(s, i) for i in range(s % 4)]) | beam.ParDo(_element_info))


class _Spread(beam.PTransform):
    def __init__(self, values):
        super().__init__()
        self._values = values

    def expand(self, pbegin):
        return pbegin | beam.Create(self._values) | "Spread" >> beam.Reshuffle()


def test_a_reshuffle_of_a_create_is_dropped_and_changes_nothing(spark, caplog):
    from apache_beam.transforms.window import GlobalWindow
    from apache_beam.utils.timestamp import MIN_TIMESTAMP

    seeds = list(range(40))
    # Each element as Beam's DirectRunner gives it: checked on both runners.
    want = [(repr((s, i)), MIN_TIMESTAMP.micros, repr(GlobalWindow())) for s in seeds for i in range(s % 4)]
    with beam.Pipeline("DirectRunner") as p:
        assert_that(_reshuffled(p, seeds), equal_to(want))
    with caplog.at_level(logging.INFO, logger="beam_ext.runner"):
        with beam.Pipeline(runner=SparkRunner()) as p:
            assert_that(_reshuffled(p, seeds), equal_to(want))
            # The dropped Reshuffle's output is a composite's, and read twice more, once as a side input.
            spread = p | _Spread([1, 2, 3])
            assert_that(spread | "Count" >> beam.combiners.Count.Globally(), equal_to([3]), label="count")
            total = spread | beam.CombineGlobally(sum)
            assert_that(spread | beam.Map(lambda x, t: x * 10 + t, t=beam.pvalue.AsSingleton(total)),
                        equal_to([16, 26, 36]), label="side")
    assert "step 'Reshuffle' dropped" in caplog.text and "step '_Spread/Spread' dropped" in caplog.text


def test_a_reshuffle_of_a_create_in_one_bundle_stays(spark, caplog):
    with caplog.at_level(logging.INFO, logger="beam_ext.runner"):
        with beam.Pipeline(runner=SparkRunner()) as p:
            assert_that(_reshuffled(p, [5, 6, 7], reshuffle=False) | beam.Map(lambda e: e[0]),
                        equal_to([repr((5, 0)), repr((6, 0)), repr((6, 1)), repr((7, 0)), repr((7, 1)),
                                  repr((7, 2))]))
    assert "dropped" not in caplog.text


_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=3),
                     st.binary(max_size=3), st.builds(Point, st.integers(0, 3)),
                     st.builds(numpy.int64, st.integers(-5, 5)))
_NESTED = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.tuples(inner, inner), st.tuples(inner), st.just(()), st.lists(inner, max_size=3),
    st.dictionaries(st.integers(0, 3), inner, max_size=2), st.frozensets(st.integers(0, 3), max_size=2),
    st.builds(lambda a: beam.Row(a=a), inner)), max_leaves=6)


@settings(max_examples=300, deadline=None)
@given(values=st.lists(_NESTED, max_size=12))
def test_a_creates_type_from_one_value_per_shape_is_beams(values):
    try:
        create = beam.Create(values)
    except (AttributeError, TypeError):  # Beam's own inference refuses some mixes of rows and others
        reject()
    assert create_output_type(create) == create.infer_output_type(None)


def test_a_create_applied_on_spark_runner_has_beams_type_and_elements(spark):
    values = [(i, str(i)) for i in range(3000)] + [(None, "x"), (1.5, None)]
    for runner in (SparkRunner(), beam.Pipeline().runner):
        # Applied by each runner (no run needed to compare types): the same hint and coder.
        p = beam.Pipeline(runner=runner)
        out = p | beam.Create(values)
        assert out.element_type == beam.Create(values).infer_output_type(None)
        assert (p | "Declared" >> beam.Create([1, 2]).with_output_types(float)).element_type is float
    with beam.Pipeline(runner=SparkRunner()) as p:
        assert_that(p | beam.Create(values), equal_to(values))
