"""The simulated streams as a bounded Beam source."""
from __future__ import annotations

from typing import Any, Iterator

import apache_beam as beam
from apache_beam.transforms.window import TimestampedValue

from beam_ext.io._simulation import StreamSpec, generate_chunk


class ReadSimulatedEvents(beam.PTransform):
    """A bounded PCollection of the events of ``spec``, timestamped by
    generation time (``gen_ts``); each event also carries ``arr_ts``.

    One element per second of generation time is reshuffled before it is
    expanded, so generation spreads over workers on any runner. A
    PCollection has no order: consumers that need arrival order sort by
    ``arr_ts`` (as :class:`~beam_ext.transforms.ApproximateWindowAggregate`
    does).

    Example::

        events = p | ReadSimulatedEvents(StreamSpec("nyt", "EG", rate=5000, duration=30))
    """

    def __init__(self, spec: StreamSpec) -> None:
        super().__init__()
        self._spec = spec

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        spec = self._spec
        return (pbegin
                | "Chunks" >> beam.Create(list(range(spec.chunks)))
                | "Spread" >> beam.Reshuffle()
                | "Generate" >> beam.FlatMap(_chunk_events, spec))


def _chunk_events(chunk: int, spec: StreamSpec) -> Iterator[Any]:
    batch = generate_chunk(spec, chunk)
    for event in batch.events():
        yield TimestampedValue(event, event["gen_ts"])
