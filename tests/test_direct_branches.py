"""Stages that fork run on element objects: tagged outputs, Partition, a PCollection read twice.

Oracles: plain Python on the same elements, and DirectRunner on the same
pipeline. Also checked: the plan runs those stages on objects, user metrics
count under each branch's step, an error names the branch's step, and the
fork holds no more than one batch per branch at a time.
"""
from __future__ import annotations

import collections

import apache_beam as beam
import pytest
from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.transforms import window
from apache_beam.utils.windowed_value import WindowedValue
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pipeline_outputs import spark_equals_direct

from beam_ext.runner import PipelineError, SparkRunner
from beam_ext.runner._element_batches import windowed
from beam_ext.runner.planning import plan_pipeline
from beam_ext.runner.worker import _branches

pytestmark = pytest.mark.usefixtures("spark")


def _stages_on_objects(build) -> dict[str, bool]:
    """Each planned stage with more than one output: whether it runs on element objects."""
    p = beam.Pipeline()
    build(p)
    plan = plan_pipeline(p.to_runner_api(), 1 << 20, 2)
    return {stage.label: stage.direct is not None for stage in plan.stages if len(stage.outputs) > 1}


class _Route(beam.DoFn):
    """Fours to ``fours``; ones stamped to ``stamped``; twos to ``unread``, which no
    step reads; the rest to the main output. Counts what it routes."""

    def __init__(self) -> None:
        self.routed = Metrics.counter("branches", "routed")

    def process(self, x):
        self.routed.inc()
        if x % 4 == 0:
            yield beam.pvalue.TaggedOutput("fours", x)
        elif x % 4 == 1:
            yield beam.pvalue.TaggedOutput("stamped", window.TimestampedValue(x, x))
        elif x % 4 == 2:
            yield beam.pvalue.TaggedOutput("unread", x)
        else:
            yield x


def _routed(values: list):
    def build(p):
        parts = (p | beam.Create(values) | "Spread" >> beam.Reshuffle()
                 | "Route" >> beam.ParDo(_Route()).with_outputs("fours", "stamped", "unread", main="rest"))
        fours = parts.fours | "Four" >> beam.Map(lambda x: ["four", x])
        stamped = (parts.stamped | "Fix" >> beam.WindowInto(window.FixedWindows(8))
                   | "Parity" >> beam.Map(lambda x: (x % 2, x)) | "Sum" >> beam.CombinePerKey(sum)
                   | "Windowed" >> beam.Map(lambda kv, w=beam.DoFn.WindowParam: ["window", w.start.micros, kv[1]])
                   | "Unfix" >> beam.WindowInto(window.GlobalWindows()))
        # The main output read by two steps, fused into the same stage.
        rest = parts.rest | "Rest" >> beam.Map(lambda x: ["rest", x])
        count = parts.rest | "Count" >> beam.combiners.Count.Globally() | "Tag" >> beam.Map(lambda n: ["count", n])
        return (fours, stamped, rest, count) | beam.Flatten()
    return build


def _routed_oracle(values: list) -> list:
    sums: dict = collections.defaultdict(int)
    for x in values:
        if x % 4 == 1:
            sums[(x // 8 * 8, x % 2)] += x
    rest = [x for x in values if x % 4 == 3]
    want = ([["four", x] for x in values if x % 4 == 0] + [["rest", x] for x in rest] + [["count", len(rest)]]
            + [["window", start * 1_000_000, total] for (start, _), total in sums.items()])
    return sorted(want, key=repr)


def test_a_stage_with_tagged_outputs_and_a_pcollection_read_twice_runs_on_objects(tmp_path):
    values = list(range(-20, 60))
    build = _routed(values)
    forks = _stages_on_objects(build)
    assert [label for label in forks if "Route" in label] and all(forks.values())
    assert sorted(spark_equals_direct(build, tmp_path), key=repr) == _routed_oracle(values)


def _branch_counters(runner) -> dict:
    with beam.Pipeline(runner=runner) as p:
        parts = p | beam.Create(range(100)) | "Route" >> beam.ParDo(_Route()).with_outputs("fours", main="rest")
        _ = parts.fours | "CountFours" >> beam.Map(lambda x: Metrics.counter("branches", "fours").inc())
        _ = parts.rest | "CountRest" >> beam.Map(lambda x: Metrics.counter("branches", "rest").inc())
    return {(c.key.step, c.key.metric.name): c.committed
            for c in p.result.metrics().query(MetricsFilter().with_namespace("branches"))["counters"]}


def test_user_metrics_count_under_each_branchs_step():
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    counters = _branch_counters(SparkRunner())
    assert counters == _branch_counters(FnApiRunner())
    # Tags the step does not declare ("stamped", "unread") are dropped, as Beam drops them.
    assert sorted(counters.values()) == [25, 25, 100]
    assert {step for step, _ in counters} == {"Route/ParDo(_Route)", "CountFours", "CountRest"}


def _fails_on_seven(x):
    if x == 7:
        raise ValueError("seven is not allowed")
    return x


def test_an_error_in_a_branch_names_its_step():
    with pytest.raises(PipelineError) as info:
        with beam.Pipeline(runner=SparkRunner()) as p:
            parts = p | beam.Create(range(10)) | beam.Partition(lambda x, n: x % n, 2)
            _ = parts[0] | "Evens" >> beam.Map(abs)
            _ = parts[1] | "Odds" >> beam.Map(_fails_on_seven)
    message = str(info.value)
    assert message.startswith("Beam step 'Odds' failed on Spark:")
    assert "ValueError: seven is not allowed" in message


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.integers(-50, 200), max_size=60), bundle=st.sampled_from([1, 3, 1 << 20]))
def test_forked_stages_equal_plain_python_and_beam(tmp_path_factory, values, bundle):
    # Bundle sizes of one element, a few, and the whole input: the result never depends on them.
    got = spark_equals_direct(_routed(values), tmp_path_factory.mktemp("routed"), [f"--spark_bundle_size={bundle}"])
    assert sorted(got, key=repr) == _routed_oracle(values)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.integers(0, 1000), max_size=60), parts=st.integers(1, 5))
def test_a_partition_flattened_and_grouped_equals_plain_python_and_beam(tmp_path_factory, values, parts):
    def build(p):
        split = p | beam.Create(values) | beam.Partition(lambda x, n: x % n, parts)
        keyed = [part | f"Key{i}" >> beam.Map(lambda x, i=i: (i, x)) for i, part in enumerate(split)]
        return (keyed | beam.Flatten() | beam.GroupByKey() | beam.MapTuple(lambda k, vs: [k, sorted(vs)]))
    assert all(_stages_on_objects(build).values())
    got = spark_equals_direct(build, tmp_path_factory.mktemp("partition"))
    groups: dict = collections.defaultdict(list)
    for x in values:
        groups[x % parts].append(x)
    assert sorted(got, key=repr) == sorted(([k, sorted(vs)] for k, vs in groups.items()), key=repr)


def test_the_fork_hands_each_branch_its_tag_in_order_and_holds_one_batch_at_a_time():
    # Plain generators stand for the branches' lines; one keeps everything
    # to the end (as a partial combine does), one passes each batch on.
    template = WindowedValue(None, 0, (window.GlobalWindow(),))
    held: list[int] = []

    def line():
        for n in range(1000):
            yield [_branches.Tagged("odd", template.with_value(n)) if n % 2 else template.with_value(n)]
            held.append(n)

    def keeps_all(batches):
        kept = []
        for batch in batches:
            if batch is _branches.PAUSE:
                yield batch
                continue
            kept += [wv.value for wv in windowed(batch)]
        yield ("all", kept)

    def passes_on(batches):
        for batch in batches:
            yield batch if batch is _branches.PAUSE else ("each", [wv.value for wv in windowed(batch)])

    out = []
    for item in _branches.fork(line(), [("odd", keeps_all), (_branches.MAIN_TAG, passes_on),
                                        ("unread", passes_on)], tagged=True):
        out.append(item)
        if item[0] == "each":  # it reached its branch before the line made the next batch
            assert len(held) == item[1][0]
    assert out[-1] == ("all", list(range(1, 1000, 2)))
    assert [values for kind, values in out[:-1]] == [[n] for n in range(0, 1000, 2)]


class _Threes(beam.DoFn):
    def process(self, x):
        if x % 3 == 0:
            yield beam.pvalue.TaggedOutput("threes", window.TimestampedValue(x, 7) if x == 30 else x)
        elif x == 5:
            yield beam.pvalue.TaggedOutput(_branches.MAIN_TAG, x)  # the main output's tag in the proto
        else:
            yield x


def test_a_tagged_steps_plain_outputs_are_split_by_tag_without_an_element_each():
    from apache_beam.metrics.execution import MetricsContainer
    from apache_beam.transforms.window import GlobalWindows

    from beam_ext.runner._element_batches import Same
    from beam_ext.runner.worker import _direct

    template = WindowedValue(None, 0, (window.GlobalWindow(),))
    out = list(_direct._run_step("Route", _Threes(), (), {}, GlobalWindows(), _direct._Tracker(),
                                 _direct._State(MetricsContainer("Route")),
                                 iter([Same(template, list(range(10))), Same(template, list(range(28, 32)))]),
                                 tagged=True))
    # Plain values only: each tag's values share the input's windowing, as one batch.
    assert type(out[0]) is _branches.ByTag
    assert {tag: (part.template, part.values) for tag, part in _branches._by_tag(out[0]).items()} == {
        "threes": (template, [0, 3, 6, 9]), _branches.MAIN_TAG: (template, [1, 2, 4, 7, 8, 5])}
    # A TimestampedValue among them is windowed as Beam's output handler windows it.
    parts = {tag: windowed(part) for tag, part in _branches._by_tag(out[1]).items()}
    assert [(wv.value, wv.timestamp.micros) for wv in parts["threes"]] == [(30, 7_000_000)]
    assert [wv.value for wv in parts[_branches.MAIN_TAG]] == [28, 29, 31]
