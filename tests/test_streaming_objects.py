"""Streaming stages that keep nothing between micro-batches run on element objects, as batch stages do.

A stage with no user state, no timers and no splittable DoFn runs its steps
with the batch executor's object path (``worker/_direct.py``) in each
micro-batch. Its outputs must be the ones Beam's bundle processor gives:
the DirectRunner's, in streaming, panes, windows and timestamps included,
late data too.
"""
from __future__ import annotations

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import trigger, window
from hypothesis import HealthCheck, Phase, given, settings
from pipeline_outputs import (
    AppendLines,
    keyed_events,
    keyed_test_stream,
    planned_on_objects,
    read_lines,
    streaming_equals_direct,
)

from beam_ext.runner import SparkRunner

# Each example runs its stream on both runners, ~0.5 s per micro-batch on
# Spark: a few examples, reproducible; a failure is reported as found.
_SETTINGS = settings(max_examples=3, deadline=None, derandomize=True, database=None,
                     phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.too_slow])


class _Split(beam.DoFn):
    """Odd values to a tagged output, each value with its timestamp."""

    def process(self, kv, t=beam.DoFn.TimestampParam):
        key, value = kv
        if value % 2:
            yield beam.pvalue.TaggedOutput("odd", (key, value, float(t)))
        else:
            yield key, value


def _pipeline(events):
    def build(p):
        weights = p | "Table" >> beam.Create([("a", 10), ("b", 20)])
        split = (p | keyed_test_stream(events)
                 | "Weigh" >> beam.Map(lambda kv, w: (kv[0], kv[1] * w.get(kv[0], 1)), w=beam.pvalue.AsDict(weights))
                 | "Twice" >> beam.FlatMap(lambda kv: [kv, (kv[0].upper(), kv[1])])
                 | "Split" >> beam.ParDo(_Split()).with_outputs("odd", main="even"))
        odd = split.odd | "Odd" >> beam.Map(lambda r, w=beam.DoFn.WindowParam: ["odd", *r, str(w)])
        # Timestamps in milliseconds: Beam's windowed value coder keeps no
        # more, so a runner that encodes between stages (any but the
        # DirectRunner's streaming engine, which passes objects) ends a pane
        # at 9.999 s, the DirectRunner at 9.999999 s.
        panes = (split.even
                 | "Even" >> beam.Map(lambda kv: (kv[0], kv[1])).with_output_types(tuple[str, int])
                 | beam.WindowInto(window.FixedWindows(10),
                                   trigger=trigger.AfterWatermark(early=trigger.AfterCount(2),
                                                                  late=trigger.AfterCount(1)),
                                   allowed_lateness=15, accumulation_mode=trigger.AccumulationMode.ACCUMULATING)
                 | beam.CombinePerKey(sum)
                 | "Panes" >> beam.Map(lambda kv, w=beam.DoFn.WindowParam, t=beam.DoFn.TimestampParam,
                                       p=beam.DoFn.PaneInfoParam:
                                       ["pane", kv[0], kv[1], str(w), t.micros // 1000, p.timing, p.index,
                                        p.is_last])
                 | "Global" >> beam.WindowInto(window.GlobalWindows()))
        return (odd, panes) | beam.Flatten()
    return build


@_SETTINGS
@given(keyed_events())
def test_stateless_stages_on_objects_equal_the_direct_runner(spark, tmp_path_factory, events):
    build = _pipeline(events)
    out = streaming_equals_direct(build, tmp_path_factory.mktemp("objects"))
    # Every element passes the unwindowed branch, late or not: its rows by brute force.
    weights = {"a": 10, "b": 20}
    expected = sorted((key, v * weights.get(k, 1), float(ts))
                      for kind, elements in events if kind == "elements" for k, v, ts in elements
                      for key in (k, k.upper()) if v * weights.get(k, 1) % 2)
    assert sorted(tuple(row[1:4]) for row in out if row[0] == "odd") == expected
    for step in ("Weigh", "Odd", "Panes"):
        assert planned_on_objects(build, step, streaming=True) == [True], step


def test_stateless_stage_metrics_count_every_element(spark, tmp_path):
    """The object path's user metrics reach the streaming result, once per element."""
    counter = beam.metrics.Metrics.counter("objects", "seen")
    sizes = beam.metrics.Metrics.distribution("objects", "value")

    def seen(kv):
        counter.inc()
        sizes.update(kv[1])
        return kv

    def build(p):
        return (p | keyed_test_stream([("elements", [("k", v, v) for v in range(5)]), ("watermark", 3),
                                  ("elements", [("k", v, v) for v in range(5, 12)])])
                | "Seen" >> beam.Map(seen))

    path = str(tmp_path / "out.jsonl")
    p = beam.Pipeline(runner=SparkRunner(), options=PipelineOptions(["--streaming"]))
    _ = build(p) | beam.Map(lambda kv: kv[1]) | beam.ParDo(AppendLines(path))
    result = p.run()
    result.wait_until_finish()
    [count] = result.metrics().query(beam.metrics.MetricsFilter().with_name("seen"))["counters"]
    [dist] = result.metrics().query(beam.metrics.MetricsFilter().with_name("value"))["distributions"]
    assert count.committed == 12
    assert (dist.committed.count, dist.committed.sum, dist.committed.min, dist.committed.max) == (12, 66, 0, 11)
    assert sorted(read_lines(path)) == list(range(12))
    assert planned_on_objects(build, "Seen", streaming=True) == [True]


def test_cogroupbykey_stages_run_on_objects(spark, tmp_path):
    """In streaming, a CoGroupByKey's tagging stages write the grouping's
    shuffle themselves, as in batch, and run on objects."""
    events = [("elements", [("a", 1, 1), ("b", 2, 12), ("a", 3, 4)]), ("watermark", 11),
              ("elements", [("a", 4, 15), ("b", 5, 3)]),  # 5 comes late, past no lateness: dropped
              ("elements", [("b", 6, 19)])]

    def build(p):
        read = p | keyed_test_stream(events)
        left = read | "Left" >> beam.WindowInto(window.FixedWindows(10))
        right = (read | "Negate" >> beam.Map(lambda kv: (kv[0], -kv[1]))
                 | "Right" >> beam.WindowInto(window.FixedWindows(10)))
        return ({"l": left, "r": right} | beam.CoGroupByKey()
                | "Rows" >> beam.MapTuple(lambda k, g, w=beam.DoFn.WindowParam:
                                          [k, sorted(g["l"]), sorted(g["r"]), str(w)]))

    out = streaming_equals_direct(build, tmp_path)
    assert sorted(out) == [["a", [1, 3], [-3, -1], "[0.0, 10.0)"], ["a", [4], [-4], "[10.0, 20.0)"],
                           ["b", [2, 6], [-6, -2], "[10.0, 20.0)"]]
    # Both tagging stages and the stage after the grouping; no stage between
    # the Flatten and the grouping (test_flatten_to_grouping.py).
    assert planned_on_objects(build, "CoGroupByKey", streaming=True) == [True] * 3
