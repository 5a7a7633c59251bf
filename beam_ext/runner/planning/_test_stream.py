"""TestStream in batch: replayed as a bounded source when batch semantics hold.

SparkRunner runs batch pipelines: all input is present and the watermark
jumps to +inf at the end. A TestStream whose events are element additions
and watermark advances, with no element behind the watermark when it is
added, ends in the same panes under that model, so it is replayed as a
bounded, timestamped source. Anything else (late elements, processing-time
advances, several output tags) needs the streaming runner and is refused
with a clear error rather than run with different results.
"""
from __future__ import annotations

import apache_beam as beam
from apache_beam.pipeline import PTransformOverride
from apache_beam.testing.test_stream import ElementEvent, ProcessingTimeEvent, TestStream, WatermarkEvent
from apache_beam.transforms.window import TimestampedValue
from apache_beam.utils.timestamp import MIN_TIMESTAMP


def _batch_elements(stream: TestStream) -> dict[object, list[TimestampedValue]]:
    """The elements of each output tag, checked to be batch-replayable."""
    watermarks: dict[object, object] = {}
    elements: dict[object, list[TimestampedValue]] = {tag: [] for tag in stream.output_tags}
    for event in stream._events:
        if isinstance(event, WatermarkEvent):
            watermarks[event.tag] = max(watermarks.get(event.tag, MIN_TIMESTAMP),
                                        event.new_watermark)
        elif isinstance(event, ElementEvent):
            watermark = watermarks.get(event.tag, MIN_TIMESTAMP)
            for tv in event.timestamped_values:
                if tv.timestamp < watermark:
                    raise NotImplementedError(
                        f"SparkRunner (batch) cannot replay TestStream: element {tv.value!r} "
                        f"at {tv.timestamp} arrives behind the watermark {watermark} (late "
                        "data needs streaming)")
                elements.setdefault(event.tag, []).append(tv)
        elif isinstance(event, ProcessingTimeEvent):
            raise NotImplementedError(
                "SparkRunner (batch) cannot replay a TestStream that advances "
                "processing time: needs streaming")
    return elements


class _BoundedTestStream(beam.PTransform):
    def __init__(self, stream: TestStream) -> None:
        super().__init__()
        self._stream = stream

    def expand(self, pbegin):
        by_tag = _batch_elements(self._stream)
        outputs = {
            tag: (pbegin
                  | f"Create[{tag}]" >> beam.Create(
                      [(tv.value, tv.timestamp) for tv in values], reshuffle=False)
                  | f"Stamp[{tag}]" >> beam.MapTuple(TimestampedValue).with_output_types(
                      self._stream.coder.to_type_hint()))
            for tag, values in by_tag.items()}
        if set(outputs) <= {None}:
            return outputs.get(None) or (
                pbegin | beam.Create([]).with_output_types(self._stream.coder.to_type_hint()))
        return outputs


class TestStreamAsBoundedSource(PTransformOverride):
    """Replaces a batch-compatible TestStream by a timestamped bounded source."""

    def matches(self, applied_ptransform) -> bool:
        return isinstance(applied_ptransform.transform, TestStream)

    def get_replacement_transform_for_applied_ptransform(self, applied_ptransform):
        return _BoundedTestStream(applied_ptransform.transform)
