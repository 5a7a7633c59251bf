"""Streaming results on SparkRunner do not depend on where micro-batches begin and end.

One TestStream event is one micro-batch. The same timestamped elements are
cut into element events at random places, in a random order, with the
watermark advanced between some of them -- never past an element still to
come, so nothing is late and every split must give the same panes: the
DirectRunner's, and the ones a plain grouping of the elements predicts.
"""
from __future__ import annotations

import collections

import apache_beam as beam
from apache_beam.coders import StrUtf8Coder, TupleCoder, VarIntCoder
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import trigger, userstate, window
from apache_beam.transforms.timeutil import TimeDomain
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from pipeline_outputs import streaming_equals_direct

WINDOW = 10
# Each example runs its stream on both runners, ~0.5 s per micro-batch on
# Spark: a few examples, reproducible, keep the module under a minute.
# Shrinking a failure would rerun it dozens of times: the example is reported as found.
_SETTINGS = settings(max_examples=3, deadline=None, derandomize=True, database=None,
                     phases=[Phase.explicit, Phase.generate], suppress_health_check=[HealthCheck.too_slow])


@st.composite
def splits(draw):
    """(elements, events): ``elements`` are (key, value, timestamp); ``events`` the TestStream's.

    At most three element events and two watermark advances: six micro-batches.
    """
    n = draw(st.integers(2, 6))
    stamps = draw(st.lists(st.integers(0, 3 * WINDOW - 1), min_size=n, max_size=n))
    keys = draw(st.lists(st.sampled_from("ab"), min_size=n, max_size=n))
    elements = [(key, value, ts) for value, (key, ts) in enumerate(zip(keys, stamps))]
    order = draw(st.permutations(elements))
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=2)))
    groups = [order[a:b] for a, b in zip([0] + cuts, cuts + [n])]
    events, watermark = [], 0
    for i, group in enumerate(groups):
        events.append(("elements", group))
        rest = [ts for g in groups[i + 1:] for _, _, ts in g]
        if rest and draw(st.booleans()):
            # Valid: no element still to come falls behind it.
            highest = min(rest)
            if highest > watermark:
                watermark = draw(st.integers(watermark + 1, highest))
                events.append(("watermark", watermark))
    return elements, events


def _test_stream(events) -> TestStream:
    stream = TestStream(coder=TupleCoder([StrUtf8Coder(), VarIntCoder()]))
    for kind, value in events:
        if kind == "elements":
            stream = stream.add_elements([window.TimestampedValue((k, v), ts) for k, v, ts in value])
        else:
            stream = stream.advance_watermark_to(value)
    return stream.advance_watermark_to_infinity()


class _FlushAtWindowEnd(beam.DoFn):
    BUFFER = userstate.BagStateSpec("buffer", VarIntCoder())
    FLUSH = userstate.TimerSpec("flush", TimeDomain.WATERMARK)

    def process(self, kv, w=beam.DoFn.WindowParam, buffer=beam.DoFn.StateParam(BUFFER),
                flush=beam.DoFn.TimerParam(FLUSH)):
        buffer.add(kv[1])
        flush.set(w.end)

    @userstate.on_timer(FLUSH)
    def on_flush(self, key=beam.DoFn.KeyParam, w=beam.DoFn.WindowParam, buffer=beam.DoFn.StateParam(BUFFER)):
        yield "flush", key, float(w.start), sorted(buffer.read())
        buffer.clear()


def _grouped(elements, windows) -> list:
    """[key, window start, sorted values] of each window of each key, as grouping all at once gives."""
    found = collections.defaultdict(list)
    for key, value, ts in elements:
        for start in windows(ts):
            found[(key, float(start))].append(value)
    return sorted([key, start, sorted(values)] for (key, start), values in found.items())


_THREE_BATCHES = [("a", 0, 3), ("a", 5, 8), ("b", 1, 12), ("a", 2, 14), ("b", 3, 21), ("a", 4, 25)]


@_SETTINGS
@given(splits())
@example((_THREE_BATCHES, [("elements", _THREE_BATCHES[:2]), ("watermark", 10), ("elements", _THREE_BATCHES[2:4]),
                           ("watermark", 20), ("elements", _THREE_BATCHES[4:])]))
def test_panes_sums_and_timer_flushes_ignore_batch_boundaries(spark, tmp_path_factory, split):
    elements, events = split

    def build(p):
        stream = p | _test_stream(events)
        fixed = stream | "Fixed" >> beam.WindowInto(window.FixedWindows(WINDOW))
        panes = fixed | beam.GroupByKey() | beam.Map(
            lambda kv, w=beam.DoFn.WindowParam, p=beam.DoFn.PaneInfoParam:
            ("pane", kv[0], float(w.start), sorted(kv[1]), p.timing, p.index, p.is_first, p.is_last))
        flushes = fixed | beam.ParDo(_FlushAtWindowEnd())
        sums = (stream
                | "Sliding" >> beam.WindowInto(window.SlidingWindows(WINDOW, WINDOW // 2),
                                               trigger=trigger.AfterWatermark(),
                                               accumulation_mode=trigger.AccumulationMode.DISCARDING)
                | beam.CombinePerKey(sum)
                | beam.Map(lambda kv, w=beam.DoFn.WindowParam: ("sum", kv[0], float(w.start), kv[1])))
        return (panes, flushes, sums) | beam.Flatten()

    out = streaming_equals_direct(build, tmp_path_factory.mktemp("split"))
    fixed = _grouped(elements, lambda ts: [ts - ts % WINDOW])
    assert sorted(o[1:4] for o in out if o[0] == "pane") == fixed
    # One on-time pane per window; Beam's default trigger never marks a pane last.
    assert all(o[4:] == [1, 0, True, False] for o in out if o[0] == "pane")
    assert sorted(o[1:] for o in out if o[0] == "flush") == fixed
    sliding = _grouped(elements, lambda ts: range(ts - ts % (WINDOW // 2) - WINDOW // 2, ts + 1, WINDOW // 2))
    assert sorted(o[1:] for o in out if o[0] == "sum") == [[k, start, sum(vs)] for k, start, vs in sliding]
