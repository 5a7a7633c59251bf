"""In streaming, a grouping's one reader runs in the grouping's own tasks, on its panes as objects.

Where one stage reads a GroupByKey's output, as its only main input, and
that stage keeps nothing between micro-batches, the executor runs the
stage's steps in the group's tasks: the panes go from the trigger driver to
the reader's steps without being encoded and persisted.
The outputs must be the DirectRunner's, panes of every timing included; a
reader that sees bundles gets them cut at about ``--spark_bundle_size``.
"""
from __future__ import annotations

import logging
import types

import apache_beam as beam
from apache_beam.metrics import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import trigger, window
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pipeline_outputs import AppendLines, keyed_events, keyed_test_stream, read_lines, streaming_equals_direct

from beam_ext.runner import SparkRunner

_FUSED = "runs in the tasks of the grouping it reads, "

# Each example runs its stream on both runners, ~0.5 s per micro-batch on
# Spark: a few examples, reproducible; a failure is reported as found.
_SETTINGS = settings(max_examples=4, deadline=None, derandomize=True, database=None,
                     phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.too_slow])


class _FusedGroupings(logging.Handler):
    """The groupings whose reader ran in their tasks, from the executor's debug lines, while in a ``with``."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.steps: set[str] = set()
        self._logger = logging.getLogger("beam_ext.runner")

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if _FUSED in message:
            self.steps.add(message.split(_FUSED)[1])

    def __enter__(self) -> _FusedGroupings:
        self._level = self._logger.level
        self._logger.setLevel(logging.DEBUG)
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)


@_SETTINGS
@given(keyed_events("ab"), st.sampled_from([trigger.AccumulationMode.ACCUMULATING, trigger.AccumulationMode.DISCARDING]))
def test_a_groupings_reader_in_its_tasks_equals_the_direct_runner(spark, tmp_path_factory, events, mode):
    def build(p):
        return (p | keyed_test_stream(events)
                | "Fixed" >> beam.WindowInto(window.FixedWindows(10),
                                             trigger=trigger.AfterWatermark(early=trigger.AfterCount(2),
                                                                            late=trigger.AfterCount(1)),
                                             allowed_lateness=15, accumulation_mode=mode)
                | beam.GroupByKey()
                # Timestamps in milliseconds: Beam's windowed value coder keeps no more.
                | "Panes" >> beam.MapTuple(lambda k, vs, w=beam.DoFn.WindowParam, t=beam.DoFn.TimestampParam,
                                           p=beam.DoFn.PaneInfoParam:
                                           [k, sorted(vs), str(w), t.micros // 1000, p.timing, p.index, p.is_last])
                | "Global" >> beam.WindowInto(window.GlobalWindows()))

    with _FusedGroupings() as fused:
        out = streaming_equals_direct(build, tmp_path_factory.mktemp("fused"))
    assert "GroupByKey" in fused.steps
    # The last pane of each key and window holds, accumulating, every value
    # that came in time or within the lateness: at most all of the key's values.
    for key, values, *_ in out:
        assert set(values) <= {v for kind, elements in events if kind == "elements" for k, v, _ in elements
                               if k == key}


class _BundleSums(beam.DoFn):
    """Sums what it sees per bundle and outputs the sums when the bundle finishes, counting bundles."""

    def start_bundle(self):
        self._sum = 0
        self._window = None

    def process(self, kv, w=beam.DoFn.WindowParam):
        self._sum += sum(kv[1])
        self._window = w

    def finish_bundle(self):
        beam.metrics.Metrics.counter("reader", "bundles").inc()
        if self._window is not None:
            yield beam.utils.windowed_value.WindowedValue(
                self._sum, self._window.max_timestamp(), [self._window])


def test_a_reader_that_sees_bundles_gets_them_cut_by_size(spark, tmp_path):
    """With a bundle size of 1 KiB, 40 keys of 50 numbers each (about 100
    bytes per key) make several bundles; their sums add up to the total."""
    events = [("elements", [(f"k{i % 40}", i, 1) for i in range(2000)])]
    path = str(tmp_path / "out.jsonl")
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(["--streaming", "--spark_bundle_size=1024"]))
    _ = (p | keyed_test_stream(events) | beam.WindowInto(window.FixedWindows(10)) | beam.GroupByKey()
         | beam.ParDo(_BundleSums()) | beam.ParDo(AppendLines(path)))
    with _FusedGroupings() as fused:
        result = p.run()
        result.wait_until_finish()
    [bundles] = result.metrics().query(MetricsFilter().with_name("bundles"))["counters"]
    assert sum(read_lines(path)) == sum(range(2000))
    assert bundles.committed > 2  # more than one per task
    assert "GroupByKey" in fused.steps


_EVENTS = [("elements", [("a", 1, 1), ("b", 2, 3), ("a", 3, 12)]), ("watermark", 11), ("elements", [("b", 4, 14)])]


def _grouped(p):
    return p | keyed_test_stream(_EVENTS) | "Fixed" >> beam.WindowInto(window.FixedWindows(10)) | beam.GroupByKey()


def test_a_reader_with_a_side_input_runs_in_the_groupings_tasks(spark, tmp_path):
    """Two readers of one grouping, one with a side input: Beam's fusion puts
    them in one stage, which reads the side input; the side input is listed
    before the grouping runs, and the stage runs in the grouping's tasks."""
    def build(p):
        table = p | "Table" >> beam.Create([("a", 10), ("b", 20)])
        grouped = _grouped(p)
        sums = grouped | "Sums" >> beam.MapTuple(lambda k, vs: ["sum", k, sum(vs)])
        weighed = grouped | "Weigh" >> beam.Map(lambda kv, w: ["weighed", kv[0], sum(kv[1]) * w[kv[0]]],
                                                w=beam.pvalue.AsDict(table))
        return (sums, weighed) | beam.Flatten() | "Global" >> beam.WindowInto(window.GlobalWindows())

    with _FusedGroupings() as fused:
        out = streaming_equals_direct(build, tmp_path)
    assert sorted(out) == [["sum", "a", 1], ["sum", "a", 3], ["sum", "b", 2], ["sum", "b", 4],
                           ["weighed", "a", 10], ["weighed", "a", 30], ["weighed", "b", 40], ["weighed", "b", 80]]
    assert "GroupByKey" in fused.steps  # the Create of the table runs Spark-natively: no grouping of its own


class _RunningSum(beam.DoFn):
    """A key's running sum of its groups' sums, in user state."""

    TOTAL = beam.transforms.userstate.CombiningValueStateSpec("total", sum)

    def process(self, kv, total=beam.DoFn.StateParam(TOTAL)):
        total.add(sum(kv[1]))
        yield [kv[0], total.read()]


def test_a_reader_that_keeps_state_reads_the_groupings_output(spark, tmp_path):
    """A stateful reader keeps its own stage, partitioned by key: the grouping
    keeps its output, and the outputs equal the DirectRunner's."""
    def build(p):
        return _grouped(p) | "Running" >> beam.ParDo(_RunningSum()) | "Global" >> beam.WindowInto(
            window.GlobalWindows())

    with _FusedGroupings() as fused:
        out = streaming_equals_direct(build, tmp_path)
    assert sorted(out) == [["a", 1], ["a", 3], ["b", 2], ["b", 4]]
    assert "GroupByKey" not in fused.steps


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(st.lists(st.lists(st.lists(st.integers(0, 10 ** 6), max_size=30), max_size=3), max_size=40),
       st.sampled_from([0, 1, 64, 1024]))
def test_pane_batches_cut_bundles_and_batches_as_beams_bundle_processor_would(keys_panes, bundle_bytes):
    """Every pane, in order, each with a list of its own; batches of at most
    ``BATCH``; with a bundle size, bundles closed as soon as their estimated
    size reaches it, none empty, no bundle end at the end."""
    from apache_beam import coders
    from apache_beam.utils.windowed_value import WindowedValue

    from beam_ext.runner._element_batches import BATCH, BUNDLE_END
    from beam_ext.runner.worker._streaming_group import _pane_batches

    kv = coders.TupleCoder([coders.StrUtf8Coder(), coders.VarIntCoder()])
    group = types.SimpleNamespace(pre_coder=coders.WindowedValueCoder(kv, coders.coders.GlobalWindowCoder()))
    panes = [(f"k{k}", [WindowedValue(values, 0, ()) for values in values_of]) for k, values_of in
             enumerate(keys_panes)]
    out = list(_pane_batches(iter(panes), group, bundle_bytes))
    assert out[-1:] != [BUNDLE_END] and all(a is not BUNDLE_END or b is not BUNDLE_END for a, b in zip(out, out[1:]))
    batches = [b for b in out if b is not BUNDLE_END]
    assert all(0 < len(b) <= BATCH for b in batches)
    flat = [wv.value for b in batches for wv in b]
    assert flat == [(key, values) for key, values_of in panes for wv in values_of for values in [wv.value]]
    given_lists = {id(wv.value) for _, values_of in panes for wv in values_of}
    assert not any(id(wv.value[1]) in given_lists for b in batches for wv in b)  # lists of their own
    if not bundle_bytes:
        assert BUNDLE_END not in out
        return
    bundles, bundle = [], []
    for item in out:
        if item is BUNDLE_END:
            bundles.append(bundle)
            bundle = []
        else:
            bundle += [wv.value[1] for wv in item]
    bundles.append(bundle)
    assert all(bundles) or bundles == [[]]  # no input: no bundle
    per_value = None
    for values in (v for vs in keys_panes for v in vs):
        if values:
            sample = values[:16]
            per_value = max(1, sum(len(coders.VarIntCoder().encode(v)) for v in sample) // len(sample))
            break
    sizes = [[len(v) * (per_value or 0) for v in bundle] for bundle in bundles]
    assert all(sum(s) >= bundle_bytes for s in sizes[:-1])
    assert all(sum(s[:-1]) < bundle_bytes for s in sizes)
