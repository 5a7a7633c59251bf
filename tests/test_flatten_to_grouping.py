"""A Flatten read at once by a GroupByKey: its inputs write the shuffle themselves.

Oracles: plain Python on the same elements, and DirectRunner on the same
pipeline, in batch and in streaming. Also checked: the plan reads no such
Flatten's buffer back, and a Flatten read by more than the grouping keeps its
read.
"""
from __future__ import annotations

import collections

import apache_beam as beam
import pytest
from apache_beam.portability import common_urns
from apache_beam.runners.portability.fn_api_runner import translations
from apache_beam.transforms import window
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pipeline_outputs import keyed_test_stream, spark_equals_direct, streaming_equals_direct

from beam_ext.runner.planning import plan_pipeline

pytestmark = pytest.mark.usefixtures("spark")


def _flatten_reads(build, streaming: bool = False) -> list[str]:
    """The planned stages that read a Flatten's buffer back (Beam's
    ``<flatten>/Read``) and write a grouping's shuffle."""
    p = beam.Pipeline()
    build(p)
    proto = p.to_runner_api()
    flattens = {translations.create_buffer_id(t.unique_name) for t in proto.components.transforms.values()
                if t.spec.urn == common_urns.primitives.FLATTEN.urn}
    plan = plan_pipeline(proto, 1 << 20, 2, streaming=streaming)
    return [stage.label for stage in plan.stages
            if flattens & set(stage.inputs) and any(out.startswith(b"group:") for out in stage.outputs)]


def _cogroup(left: list, right: list, windowed: bool):
    def build(p):
        def side(label, kvs):
            pcoll = p | f"{label}Create" >> beam.Create(kvs)
            if windowed:
                pcoll = (pcoll | f"{label}Stamp" >> beam.MapTuple(lambda k, v: window.TimestampedValue((k, v), v % 9))
                         | f"{label}Window" >> beam.WindowInto(window.FixedWindows(3)))
            return pcoll | f"{label}Keep" >> beam.MapTuple(lambda k, v: (k, v))
        return ({"l": side("L", left), "r": side("R", right)} | beam.CoGroupByKey()
                | beam.MapTuple(lambda k, g: [k, sorted(g["l"]), sorted(g["r"])]))
    return build


def _cogroup_oracle(left: list, right: list, windowed: bool) -> list:
    groups: dict = collections.defaultdict(lambda: ([], []))
    for side, kvs in enumerate((left, right)):
        for k, v in kvs:
            groups[(k, v % 9 // 3) if windowed else k][side].append(v)
    return sorted(([key[0] if windowed else key, sorted(ls), sorted(rs)] for key, (ls, rs) in groups.items()),
                  key=repr)


def test_a_cogroupbykeys_inputs_write_its_shuffle_with_no_stage_between(tmp_path):
    left = [(k % 5, k) for k in range(60)]
    right = [(k, -k) for k in range(3, 9)]
    build = _cogroup(left, right, windowed=False)
    assert _flatten_reads(build) == []
    got = spark_equals_direct(build, tmp_path)
    assert sorted(got, key=repr) == _cogroup_oracle(left, right, windowed=False)


def test_a_flatten_read_by_more_than_a_grouping_keeps_its_read(tmp_path):
    # The Flatten's elements also go to a Map: the read stage does work.
    def build(p):
        a = p | "A" >> beam.Create([("a", 1), ("b", 2)])
        b = p | "B" >> beam.Create([("a", 3)])
        both = (a, b) | beam.Flatten()
        grouped = both | beam.GroupByKey() | beam.MapTuple(lambda k, vs: [k, sorted(vs)])
        keys = both | beam.Keys() | "Tag" >> beam.Map(lambda k: ["key", k])
        return (grouped, keys) | "Both" >> beam.Flatten()
    assert _flatten_reads(build)
    assert spark_equals_direct(build, tmp_path) == [["a", [1, 3]], ["b", [2]], ["key", "a"], ["key", "a"],
                                                    ["key", "b"]]


def _flatten_then(steps, parts: list[list], side: bool = False):
    """``parts`` flattened, then ``steps`` (on the Flatten's output), then a
    GroupByKey; with ``side``, the first part also goes to a Partition whose
    two outputs join the Flatten (one stage writes it twice)."""
    def build(p):
        inputs = [p | f"Create{i}" >> beam.Create(kvs) | f"Keep{i}" >> beam.MapTuple(lambda k, v: (k, v))
                  for i, kvs in enumerate(parts)]
        if side:
            inputs += list(inputs[0] | beam.Partition(lambda kv, n: kv[1] % n, 2))
        return (inputs | beam.Flatten() | steps | beam.GroupByKey()
                | "Sorted" >> beam.MapTuple(lambda k, vs: [k, sorted(vs)]))
    return build


def _flatten_then_oracle(parts: list[list], side: bool = False) -> list:
    groups: dict = collections.defaultdict(list)
    for kvs in parts + ([parts[0]] if side else []):
        for k, v in kvs:
            groups[k % 3].append(v * 10)
    return sorted(([k, sorted(vs)] for k, vs in groups.items()), key=repr)


_TIMES_TEN = "TimesTen" >> beam.MapTuple(lambda k, v: (k % 3, v * 10))


def test_a_flattens_inputs_run_the_steps_before_the_grouping_and_write_its_shuffle(tmp_path):
    parts = [[(k, k) for k in range(20)], [(k, -k) for k in range(5)], [(7, 1)]]
    build = _flatten_then(_TIMES_TEN, parts)
    assert _flatten_reads(build) == []
    assert _read_stages(build) == []
    got = spark_equals_direct(build, tmp_path)
    assert sorted(got, key=repr) == _flatten_then_oracle(parts)


def test_steps_after_a_flatten_with_a_side_input_keep_the_read(tmp_path):
    parts = [[(k, k) for k in range(8)], [(1, 5)]]

    @beam.ptransform_fn
    def with_side(pcoll):
        factor = pcoll.pipeline | "Factor" >> beam.Create([10])
        return pcoll | "Times" >> beam.Map(lambda kv, f: (kv[0] % 3, kv[1] * f), f=beam.pvalue.AsSingleton(factor))

    build = _flatten_then(with_side(), parts)
    assert _read_stages(build)
    assert sorted(spark_equals_direct(build, tmp_path), key=repr) == _flatten_then_oracle(parts)


def test_a_stage_writing_a_flatten_several_times_flattens_them_itself(tmp_path):
    # The first part's stage writes the Flatten three times (its own output and
    # a Partition's two): a Flatten of the three in that stage, the steps once after it.
    parts = [[(k, k) for k in range(8)], [(1, 5)]]
    build = _flatten_then(_TIMES_TEN, parts, side=True)
    assert _read_stages(build) == []
    assert _read_stages(build, streaming=True) == []
    assert sorted(spark_equals_direct(build, tmp_path), key=repr) == _flatten_then_oracle(parts, side=True)


class _Counted(beam.DoFn):
    """Keys each number by its remainder, counting the numbers it sees."""

    def process(self, x):
        beam.metrics.Metrics.counter("flatten_test", "seen").inc()
        yield x % 4, x


def _partitioned_counts(values: list[int], finalized: bool = False):
    """``values`` partitioned three ways, flattened back, keyed and counted
    (a user counter in the keying step) and summed per key; with
    ``finalized``, a step before the Partition asks for bundle finalization,
    which keeps the stage on Beam's bundle processor."""
    def build(p):
        numbers = p | beam.Create(values) | "Keep" >> beam.Map(lambda x: x)
        if finalized:
            numbers |= "Finalized" >> beam.ParDo(_Finalized())
        parts = numbers | beam.Partition(lambda x, n: x % n, 3)
        return (parts | beam.Flatten() | beam.ParDo(_Counted()) | beam.CombinePerKey(sum)
                | "AsList" >> beam.MapTuple(lambda k, total: [k, total]))
    return build


class _Finalized(beam.DoFn):
    def process(self, x, finalizer=beam.DoFn.BundleFinalizerParam):
        yield x


@pytest.mark.parametrize("finalized", [False, True], ids=["objects", "bundle_processor"])
def test_a_partition_flattened_back_counts_each_element_once(tmp_path, finalized):
    from beam_ext.runner import SparkRunner

    values = list(range(-20, 90))
    build = _partitioned_counts(values, finalized)
    assert _read_stages(build) == []
    got = spark_equals_direct(build, tmp_path)
    assert sorted(got) == [[k, sum(x for x in values if x % 4 == k)] for k in range(4)]
    # The keying step runs once per line into the stage's Flatten; its counter counts each element once.
    p = beam.Pipeline(runner=SparkRunner())
    build(p)
    result = p.run()
    result.wait_until_finish()
    [counter] = result.metrics().query(beam.metrics.MetricsFilter().with_name("seen"))["counters"]
    assert counter.committed == len(values)


def test_a_flatten_then_a_combine_pre_combines_in_each_input_stage(tmp_path):
    def build(p):
        parts = [p | f"Create{i}" >> beam.Create(range(i * 100, i * 100 + 50)) | f"Keep{i}" >> beam.Map(lambda x: x)
                 for i in range(3)]
        return parts | beam.Flatten() | beam.Map(lambda x: (x % 4, x)) | beam.CombinePerKey(sum) | beam.Map(list)
    assert _read_stages(build) == []
    got = spark_equals_direct(build, tmp_path)
    values = [x for i in range(3) for x in range(i * 100, i * 100 + 50)]
    assert sorted(got) == [[k, sum(x for x in values if x % 4 == k)] for k in range(4)]


def _read_stages(build, streaming: bool = False) -> list[str]:
    """The planned stages that read a Flatten's buffer back."""
    p = beam.Pipeline()
    build(p)
    proto = p.to_runner_api()
    flattens = {translations.create_buffer_id(t.unique_name) for t in proto.components.transforms.values()
                if t.spec.urn == common_urns.primitives.FLATTEN.urn}
    return [stage.label for stage in plan_pipeline(proto, 1 << 20, 2, streaming=streaming).stages
            if flattens & set(stage.inputs)]


_KVS = st.lists(st.tuples(st.integers(-3, 3), st.integers(0, 40)), max_size=30)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(left=_KVS, right=_KVS, windowed=st.booleans())
def test_cogrouped_inputs_equal_plain_python_and_beam(tmp_path_factory, left, right, windowed):
    got = spark_equals_direct(_cogroup(left, right, windowed), tmp_path_factory.mktemp("cogroup"))
    assert sorted(got, key=repr) == _cogroup_oracle(left, right, windowed)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(_KVS, min_size=1, max_size=3), side=st.booleans())
def test_steps_after_a_flatten_group_as_plain_python_and_beam(tmp_path_factory, parts, side):
    got = spark_equals_direct(_flatten_then(_TIMES_TEN, parts, side), tmp_path_factory.mktemp("steps"))
    assert sorted(got, key=repr) == _flatten_then_oracle(parts, side)


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(_KVS, min_size=2, max_size=3))
def test_a_flatten_of_creates_and_of_a_branch_read_twice_groups_as_beam(tmp_path_factory, parts):
    # Inputs straight from native Creates (each written by a stage of its
    # own), and one input also counted apart: its stage writes two outputs.
    def build(p):
        inputs = [p | f"Create{i}" >> beam.Create(kvs) for i, kvs in enumerate(parts)]
        doubled = inputs[0] | "Double" >> beam.MapTuple(lambda k, v: (k, 2 * v))
        counted = doubled | "Count" >> beam.combiners.Count.Globally() | "Tag" >> beam.Map(lambda n: ["count", n])
        grouped = ((doubled, *inputs[1:]) | beam.Flatten() | beam.GroupByKey()
                   | beam.MapTuple(lambda k, vs: [k, sorted(vs)]))
        return (grouped, counted) | "Both" >> beam.Flatten()
    assert _flatten_reads(build) == []
    got = spark_equals_direct(build, tmp_path_factory.mktemp("flatten"))
    groups: dict = collections.defaultdict(list)
    for i, kvs in enumerate(parts):
        for k, v in kvs:
            groups[k].append(2 * v if i == 0 else v)
    want = [[k, sorted(vs)] for k, vs in groups.items()] + [["count", len(parts[0])]]
    assert sorted(got, key=repr) == sorted(want, key=repr)


@st.composite
def _streams(draw) -> list[tuple[str, object]]:
    """TestStream events: element events of (key, value, timestamp) and
    watermark advances between them, so that some elements come late."""
    events, value = [], 0
    for _ in range(draw(st.integers(1, 4))):
        stamps = draw(st.lists(st.integers(0, 39), min_size=1, max_size=6))
        keys = draw(st.lists(st.sampled_from("ab"), min_size=len(stamps), max_size=len(stamps)))
        events.append(("elements", [(k, value + i, ts) for i, (k, ts) in enumerate(zip(keys, stamps))]))
        value += len(stamps)
        if draw(st.booleans()):
            events.append(("watermark", draw(st.integers(0, 50))))
    return events


def _stream_cogroup(events):
    def build(p):
        read = p | keyed_test_stream(events)
        left = read | "Left" >> beam.WindowInto(window.FixedWindows(10))
        right = (read | "Odd" >> beam.Filter(lambda kv: kv[1] % 2) | "Negate" >> beam.MapTuple(lambda k, v: (k, -v))
                 | "Right" >> beam.WindowInto(window.FixedWindows(10)))
        return ({"l": left, "r": right} | beam.CoGroupByKey()
                | beam.MapTuple(lambda k, g, w=beam.DoFn.WindowParam: [k, sorted(g["l"]), sorted(g["r"]), str(w)]))
    return build


# Each example runs its stream on both runners, about half a second per
# micro-batch on Spark: a few examples, reproducible.
@settings(max_examples=3, deadline=None, derandomize=True, database=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(events=_streams())
def test_a_streaming_cogroupbykeys_inputs_write_its_shuffle_and_group_as_beam(tmp_path_factory, events):
    # The watermark of the grouping's input is the least of its writers':
    # elements behind it are late exactly as Beam's DirectRunner drops them.
    build = _stream_cogroup(events)
    assert _flatten_reads(build, streaming=True) == []
    got = streaming_equals_direct(build, tmp_path_factory.mktemp("stream"))
    assert sorted(got, key=repr) == _stream_cogroup_oracle(events)


def _grouped_times_ten(parts):
    """``parts`` flattened, in 10-s windows, times ten and grouped: ``[key, values, window]``."""
    return (parts | beam.Flatten() | "Window" >> beam.WindowInto(window.FixedWindows(10))
            | "TimesTen" >> beam.MapTuple(lambda k, v: (k, v * 10)) | beam.GroupByKey()
            | beam.MapTuple(lambda k, vs, w=beam.DoFn.WindowParam: [k, sorted(vs), str(w)]))


def _stream_flatten_then(events):
    def build(p):
        read = p | keyed_test_stream(events)
        # A TestStream is the runner's: a Map after it writes the Flatten.
        every = read | "Every" >> beam.Map(lambda kv: kv)
        odd = read | "Odd" >> beam.Filter(lambda kv: kv[1] % 2) | "Negate" >> beam.MapTuple(lambda k, v: (k, -v))
        return _grouped_times_ten((every, odd))
    return build


@settings(max_examples=3, deadline=None, derandomize=True, database=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(events=_streams())
def test_steps_after_a_streaming_flatten_run_in_its_inputs_and_group_as_beam(tmp_path_factory, events):
    build = _stream_flatten_then(events)
    assert _read_stages(build, streaming=True) == []
    got = streaming_equals_direct(build, tmp_path_factory.mktemp("stream"))
    want = [[k, sorted(v * 10 for v in ls + rs), w]
            for k, ls, rs, w in _stream_cogroup_oracle(events)]
    assert sorted(got, key=repr) == sorted(want, key=repr)


def _stream_partition_then(events):
    def build(p):
        # One stage writes both of the Partition's outputs to the Flatten.
        return _grouped_times_ten(p | keyed_test_stream(events) | "Keep" >> beam.Map(lambda kv: kv)
                                  | beam.Partition(lambda kv, n: kv[1] % n, 2))
    return build


@settings(max_examples=3, deadline=None, derandomize=True, database=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(events=_streams())
def test_a_streaming_partition_flattened_back_groups_as_beam(tmp_path_factory, events):
    build = _stream_partition_then(events)
    assert _read_stages(build, streaming=True) == []
    got = streaming_equals_direct(build, tmp_path_factory.mktemp("stream"))
    want = [[k, sorted(v * 10 for v in ls), w] for k, ls, _, w in _stream_cogroup_oracle(events)]
    assert sorted(got, key=repr) == sorted(want, key=repr)


def _stream_cogroup_oracle(events) -> list:
    """One pane per key and window under the default trigger; an element
    whose window ended at or before the watermark it arrives behind is
    dropped (no allowed lateness)."""
    groups: dict = collections.defaultdict(lambda: ([], []))
    watermark = 0
    for kind, arg in events:
        if kind == "watermark":
            watermark = max(watermark, arg)
            continue
        for k, v, ts in arg:
            start = ts - ts % 10
            if start + 10 > watermark:
                groups[(k, start)][0].append(v)
                if v % 2:
                    groups[(k, start)][1].append(-v)
    return sorted(([k, sorted(ls), sorted(rs), f"[{start:.1f}, {start + 10:.1f})"]
                   for (k, start), (ls, rs) in groups.items()), key=repr)
