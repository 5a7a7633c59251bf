"""A trivial grouping's shuffle, written by ``KeyedValues`` and read back by
``GroupReader`` both ways, for the tests of value blocks."""
from __future__ import annotations

from typing import Any, Callable

import apache_beam as beam
from apache_beam.coders.coder_impl import create_InputStream

from beam_ext.runner._shuffle import GroupReader, KeyedValues


def shuffled(blocks, encode_key, encode_value, kvs: list, memory: int, sample: int, cut: int,
             pending: int | None = None, batch: bool = False) -> list[bytes]:
    """The blobs ``KeyedValues`` writes for ``kvs``, added ``cut`` pairs at a time (by
    ``add_batch`` if ``batch``), judging keys after ``sample`` values, flushing past
    ``memory`` bytes, holding ``pending`` objects unpickled."""
    gathered = KeyedValues(1, memory_bytes=memory, blob_bytes=256, blocks=blocks)
    gathered._sample = sample
    if pending is not None:
        gathered._PENDING = pending
    blobs = []
    for start in range(0, len(kvs), cut):
        blobs += added(gathered, kvs[start:start + cut], encode_key, encode_value, batch)
    blobs += gathered.flush()
    return [blob for _, blob in blobs]


def added(gathered: KeyedValues, kvs: list, encode_key, encode_value, batch: bool) -> list[tuple[int, bytes]]:
    """What ``gathered`` flushes taking ``kvs``: one by one (``add``) or a batch (``add_batch``)."""
    if batch:
        return list(gathered.add_batch(kvs, None, encode_key, encode_value))
    return list(gathered.add(kvs, encode_key, encode_value))


def groups_both_ways(reader: GroupReader, post, blobs: list[bytes]) -> tuple[dict, dict]:
    """Each key's values as ``read_batches`` gives them (objects), and as ``read``'s encoding decodes."""
    objects = {wv.value[0]: list(wv.value[1]) for batch in reader.read_batches(blobs, post, 1 << 20, 7)
               for wv in batch}
    impl = post.get_impl()
    encoded = {}
    for chunk in reader.read(blobs):
        stream = create_InputStream(chunk)
        while stream.size() > 0:
            key, values = impl.decode_from_stream(stream, True).value
            encoded[key] = list(values)
    return objects, encoded


class BundleConsumer(beam.DoFn):
    """Has bundle methods: its stage reads the groups encoded, in Beam's
    bundle processor; gives ``seen(key, values)`` of each group."""

    def __init__(self, seen: Callable[[Any, Any], Any]) -> None:
        self._seen = seen

    def start_bundle(self):
        self.groups = 0

    def process(self, element):
        self.groups += 1
        yield self._seen(*element)
