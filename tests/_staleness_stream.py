"""A late-data stream for StalenessRefire tests, run on Beam and on a brute-force model."""
from __future__ import annotations

import dataclasses

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window
from apache_beam.transforms.window import TimestampedValue

from beam_ext.transforms.staleness import StalenessRefire


@dataclasses.dataclass
class Stream:
    """Batches of (key, value, timestamp), each followed by a watermark advance."""

    size: float  # fixed window size
    batches: list[tuple[list[tuple[str, int, float]], float]]


def model(stream: Stream, offsets: list[float], t: float, accumulate: bool = True):
    """Expected panes as (key, window_start, values, first, last, late, index) and dead letters."""
    firings = [*offsets, *([] if offsets and offsets[-1] >= t else [t])]
    state: dict = {}  # (key, start) -> dict(values, next, panes, pending)
    panes, dead = [], []

    def fire_due(watermark: float) -> None:
        for (key, start), s in state.items():
            end = start + stream.size
            while s["next"] is not None:
                when = end - 1e-6 if s["next"] == 0 else end + firings[s["next"] - 1]
                if not when < watermark:
                    break
                last = s["next"] == len(firings)
                if s["next"] == 0 or s["pending"]:
                    panes.append((key, start, tuple(sorted(s["values"])), s["panes"] == 0,
                                  last, s["next"] > 0, s["panes"]))
                    s["panes"] += 1
                    s["pending"] = False
                    if not accumulate:
                        s["values"] = []
                s["next"] = None if last else s["next"] + 1

    for batch, watermark in stream.batches:
        for key, value, ts in batch:
            start = ts - ts % stream.size
            s = state.get((key, start))
            if s is not None and s["next"] is None:
                dead.append((key, value))
                continue
            if s is None:
                state[(key, start)] = {"values": [value], "next": 0, "panes": 0, "pending": False}
            else:
                s["values"].append(value)
                s["pending"] = s["pending"] or s["next"] > 0
        fire_due(watermark)
    fire_due(float("inf"))
    return sorted(panes), sorted(dead)


class _Record(beam.DoFn):
    def process(self, element, pane=beam.DoFn.PaneInfoParam, w=beam.DoFn.WindowParam):
        from apache_beam.utils.windowed_value import PaneInfoTiming
        key, values = element
        yield (key, float(w.start), tuple(sorted(values)), pane.is_first, pane.is_last,
               pane.timing == PaneInfoTiming.LATE, pane.index)


def run(stream: Stream, trigger, expected_panes, expected_dead, accumulate: bool = True,
        runner="BundleBasedDirectRunner", transform=None) -> dict[str, int]:
    """Run StalenessRefire, or ``transform``, over the stream; assert outputs; return counters."""
    test_stream = TestStream().advance_watermark_to(0)
    for batch, watermark in stream.batches:
        if batch:
            test_stream = test_stream.add_elements(
                [TimestampedValue((k, v), ts) for k, v, ts in batch])
        test_stream = test_stream.advance_watermark_to(watermark)
    # Pass every timer explicitly: BundleBasedDirectRunner may finish at an
    # infinite watermark before firing timers still due.
    last = max((w for _, w in stream.batches), default=0.0)
    test_stream = test_stream.advance_watermark_to(round(last + 10_000, 3))
    test_stream = test_stream.advance_watermark_to_infinity()
    p = beam.Pipeline(runner=runner, options=PipelineOptions(streaming=True))
    panes, dead = (p | test_stream
                   | beam.WindowInto(window.FixedWindows(stream.size))
                   | (transform or StalenessRefire(trigger, accumulate=accumulate))
                   .with_dead_letters())
    assert_that(panes | "Record" >> beam.ParDo(_Record()), equal_to(expected_panes),
                label="CheckPanes")
    assert_that(dead, equal_to(expected_dead), label="CheckDeadLetters")
    result = p.run()
    result.wait_until_finish()
    return {m.key.metric.name: m.committed
            for m in result.metrics().query(MetricsFilter().with_namespace(
                "beam_ext.staleness"))["counters"]}
