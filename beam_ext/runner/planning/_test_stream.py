"""TestStream: replayed as a bounded source in batch, decoded into micro-batches in streaming.

SparkRunner runs batch pipelines: all input is present and the watermark
jumps to +inf at the end. A TestStream whose events are element additions
and watermark advances, with no element behind the watermark when it is
added, ends in the same panes under that model, so it is replayed as a
bounded, timestamped source. Anything else (late elements, processing-time
advances) needs the streaming runner and is refused in batch with a clear
error rather than run with different results. In streaming
(:class:`TestStreamSpec`) every event is one micro-batch, as the Python
DirectRunner takes one event per step.
"""
from __future__ import annotations

import dataclasses

import apache_beam as beam
from apache_beam.coders.coder_impl import create_OutputStream
from apache_beam.pipeline import PTransformOverride
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.testing.test_stream import ElementEvent, ProcessingTimeEvent, TestStream, WatermarkEvent
from apache_beam.transforms.window import GlobalWindows, TimestampedValue
from apache_beam.utils.timestamp import MIN_TIMESTAMP, Duration, Timestamp


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


@dataclasses.dataclass
class TestStreamSpec:
    """A TestStream for the streaming executor: its events, each one micro-batch.

    ``events`` holds ``("elements", output index, encoded chunk)``,
    ``("watermark", output index, Timestamp)`` and ``("processing_time", None,
    Duration)``, in the stream's order. ``outputs`` are the stage's output
    indices (one per tag read downstream).
    """

    __test__ = False  # not a pytest class, despite its name

    step_name: str
    events: list[tuple[str, int | None, object]]
    outputs: list[int]
    counts: dict[int, int] = dataclasses.field(default_factory=dict)  # event position -> elements


def test_stream_spec(transform: beam_runner_api_pb2.PTransform, output_pcolls: list[str],
                     pipeline_context, channel_coder) -> TestStreamSpec:
    """Decodes a TestStream transform's payload into encoded micro-batches.

    ``output_pcolls[i]`` is the PCollection of the stage's output ``i``;
    ``channel_coder(pcoll)`` its windowed coder. Tags nobody reads are dropped.
    """
    payload = beam_runner_api_pb2.TestStreamPayload.FromString(transform.spec.payload)
    if payload.endpoint.url:
        raise NotImplementedError(
            f"SparkRunner cannot read TestStream {transform.unique_name!r} from a "
            f"TestStreamService ({payload.endpoint.url}): its events must be in the pipeline")
    value_impl = pipeline_context.coders[payload.coder_id].get_impl()
    index_of_tag: dict[str, int] = {}
    for tag, pcoll in transform.outputs.items():
        if pcoll in output_pcolls:
            index_of_tag[tag] = output_pcolls.index(pcoll)
    impls = {index: channel_coder(output_pcolls[index]).get_impl() for index in index_of_tag.values()}
    events: list[tuple[str, int | None, object]] = []
    counts: dict[int, int] = {}
    for event in payload.events:
        kind = event.WhichOneof("event")
        if kind == "element_event":
            index = index_of_tag.get(event.element_event.tag)
            if index is None:
                continue
            out = create_OutputStream()
            for element in event.element_event.elements:
                value = value_impl.decode(element.encoded_element)  # encoded in the outer context
                impls[index].encode_to_stream(
                    GlobalWindows.windowed_value(value, Timestamp(micros=1000 * element.timestamp)), out, True)
            counts[len(events)] = len(event.element_event.elements)
            events.append(("elements", index, out.get()))
        elif kind == "watermark_event":
            index = index_of_tag.get(event.watermark_event.tag)
            if index is not None:
                events.append(("watermark", index,
                               Timestamp(micros=1000 * event.watermark_event.new_watermark)))
        elif kind == "processing_time_event":
            events.append(("processing_time", None,
                           Duration(micros=1000 * event.processing_time_event.advance_duration)))
    return TestStreamSpec(transform.unique_name, events, sorted(index_of_tag.values()), counts)
