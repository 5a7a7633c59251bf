"""Beam GroupByKey as a Spark shuffle on encoded key bytes.

The producing stage writes windowed ``KV`` elements; :class:`ShuffleWriter`
splits them into ``(encoded_key, payload)`` pairs that Spark partitions by
:func:`~beam_ext._key_hash.key_hash` of the key bytes, equal in every worker.
A stage feeding a trivial grouping gathers each key's values first
(:class:`KeyedValues`): one record per key and flush. In streaming, a stage
on objects feeding a grouping whose trigger driver reads no element
timestamps gathers them per key and windows (:class:`WindowedKeyedValues`).
:class:`GroupReader` turns one shuffled partition back into the encoded
``KV<K, Iterable<V>>`` elements the consuming stage reads, with Beam's
windowing semantics (the same trigger driver Beam's own runners use in batch).

Global windowing with the default trigger, the common case, never decodes a
value: the payload is the value's nested encoding and the output element is
assembled from bytes. Groups that outgrow the task's memory budget spill to
disk as sorted runs (:mod:`._group_spill`).
"""
from __future__ import annotations

import contextlib
import struct
from operator import itemgetter
from typing import Any, Callable, Iterable, Iterator

from apache_beam import coders
from apache_beam.coders.coder_impl import create_InputStream, create_OutputStream
from apache_beam.transforms.window import GlobalWindow, GlobalWindows
from apache_beam.utils import windowed_value

from beam_ext._key_hash import key_hash
from beam_ext.runner._batch_panes import OnTimePanes, pane_driver
from beam_ext.runner._element_batches import Same, batched, windowed
from beam_ext.runner._group_spill import KEY_OVERHEAD, VALUE_OVERHEAD, ExternalGrouping, Group, SpillStats
from beam_ext.runner._pickled_values import OWN_TYPES, PickledValues
from beam_ext.runner._row_columns import RowColumns
from beam_ext.runner._window_sets import WindowSetCodec

_CHUNK_BYTES = 4 << 20
_PLAIN_KEYS = frozenset({int, str, bytes})
_SIZED = frozenset({str, bytes})  # field values whose length counts against a KeyedValues budget
# KeyedValues.add_batch's slice: what a flush may lag behind the budget.
_BATCH_SLICE = 2048
# A grouping's values written as blocks: schema rows as columns, or objects Beam pickles.
Blocks = RowColumns | PickledValues


def identity_partition(partition: int) -> int:
    """Blobs are keyed by their target partition already."""
    return partition


def _on_time_global_header() -> bytes:
    """The encoding of the one on-time pane at the end of the global window, less its value's."""
    wv = GlobalWindows.windowed_value(
        b"",
        timestamp=GlobalWindow().max_timestamp(),
        pane_info=windowed_value.PaneInfo(
            is_first=True, is_last=True, timing=windowed_value.PaneInfoTiming.ON_TIME,
            index=0, nonspeculative_index=0))
    encoded = _HEADER_CODER.get_impl().encode_nested(wv)
    assert encoded.endswith(b"\x00")  # the nested empty bytes value
    return encoded[:-1]


def _on_time_global_value() -> windowed_value.WindowedValue:
    """What a reader decodes from that header: its timestamp is whole milliseconds."""
    return _HEADER_CODER.get_impl().decode_nested(_on_time_global_header() + b"\x00")


_HEADER_CODER = coders.WindowedValueCoder(coders.BytesCoder(), coders.coders.GlobalWindowCoder())


def as_decoded(panes: Iterable[windowed_value.WindowedValue]) -> Iterator[windowed_value.WindowedValue]:
    """``panes`` as a reader of their encoding gets them: Beam's coder keeps a
    timestamp's whole milliseconds (an end of window, 4.999999 s, reads 4.999).

    >>> from apache_beam.utils.timestamp import Timestamp
    >>> [float(wv.timestamp) for wv in as_decoded([GlobalWindows.windowed_value(1, Timestamp(4.999999))])]
    [4.999]
    """
    impl = _HEADER_CODER.get_impl()
    decoded: dict[int, Any] = {}  # panes share timestamps: each is round-tripped once
    for wv in panes:
        micros = wv.timestamp_micros
        read = decoded.get(micros)
        if read is None:
            if len(decoded) >= 4096:
                decoded.clear()
            read = decoded[micros] = impl.decode_nested(
                impl.encode_nested(GlobalWindows.windowed_value(b"", timestamp=wv.timestamp))).timestamp_micros
        yield wv if read == micros else windowed_value.create(wv.value, read, wv.windows, wv.pane_info)


class ShuffleWriter:
    """Splits encoded windowed KVs into ``(key bytes, payload)`` pairs."""

    def __init__(self, pre_coder: coders.WindowedValueCoder, trivial: bool, blocks: Blocks | None = None,
                 by_window: bool = False, windows_apart: bool = False) -> None:
        assert not (by_window and windows_apart)
        self._coder = pre_coder
        self._trivial = trivial
        self.blocks = blocks  # how KeyedValues writes a trivial grouping's values as blocks, if it may
        self.by_window = by_window  # objects are gathered per key and windows (WindowedKeyedValues)
        # A payload is the element's windows and value, not the whole windowed value (GroupSpec.windows_apart).
        self._window_sets = WindowSetCodec(pre_coder.window_coder) if windows_apart else None
        self._heads: dict[int, tuple[tuple, bytes]] = {}  # a payload's windows, by the tuple's id

    def split(self, data: bytes) -> Iterator[tuple[bytes, bytes]]:
        if self._trivial:
            encode_key, encode_value = self.value_encoders()
            for key, value in self.kvs(data):
                yield encode_key(key), encode_value(value)
            return
        impl = self._coder.get_impl()
        stream = create_InputStream(data)
        if self._window_sets is not None:
            decode = impl.decode_from_stream

            def elements() -> Iterator[Any]:
                while stream.size() > 0:
                    yield decode(stream, True)
            yield from self._apart(elements())
            return
        key_impl = self._coder.wrapped_value_coder.key_coder().get_impl()
        while stream.size() > 0:
            wv = impl.decode_from_stream(stream, True)
            yield key_impl.encode_nested(wv.value[0]), impl.encode_nested(wv)

    def _apart(self, values: Iterable[Any]) -> Iterator[tuple[bytes, bytes]]:
        """Pairs of windowed KVs whose payload is the length-prefixed encoding of
        the element's windows, then its value's nested encoding."""
        kv_coder = self._coder.wrapped_value_coder
        encode_key = kv_coder.key_coder().get_impl().encode_nested
        encode_value = kv_coder.value_coder().get_impl().encode_nested
        heads = self._heads
        for wv in values:
            key, value = wv.value
            windows = wv.windows
            # Elements of a window mostly share its tuple (WindowInto's
            # assignment, the partial combine's output): found by identity,
            # which no other tuple has while the entry keeps this one.
            found = heads.get(id(windows))
            head = found[1] if found is not None else self._head(windows)
            yield encode_key(key), head + encode_value(value)

    def _head(self, windows: tuple) -> bytes:
        """The length-prefixed encoding of ``windows``, kept by the tuple's identity
        (the tuple kept too, so its id is not reused while the entry lives)."""
        out = create_OutputStream()
        out.write(self._window_sets.encode(windows), True)
        if len(self._heads) >= 4096:
            self._heads.clear()
        head = out.get()
        self._heads[id(windows)] = (windows, head)
        return head

    def kvs(self, data: bytes) -> Iterator[tuple[Any, Any]]:
        """The ``(key, value)`` objects of encoded windowed KVs of a trivial
        grouping, for :class:`KeyedValues` (with :meth:`value_encoders`)."""
        assert self._trivial
        decode = self._coder.get_impl().decode_from_stream
        stream = create_InputStream(data)
        while stream.size() > 0:
            yield decode(stream, True).value

    def pairs(self, values: Iterable[Any]) -> Iterator[tuple[bytes, bytes]]:
        """The pairs :meth:`split` gives for the encoding of ``values`` (windowed
        KVs), from the objects: the coder must be the real one, not the
        runner's bytes view of it."""
        if self._trivial:
            yield from self.value_pairs(wv.value for wv in values)
            return
        if self._window_sets is not None:
            yield from self._apart(values)
            return
        key = self._coder.wrapped_value_coder.key_coder().get_impl().encode_nested
        encode = self._coder.get_impl().encode_nested
        for wv in values:
            yield key(wv.value[0]), encode(wv)

    @property
    def trivial(self) -> bool:
        """Whether the grouping is trivial (global window, default trigger): payloads are values alone."""
        return self._trivial

    def value_pairs(self, kvs: Iterable[tuple[Any, Any]]) -> Iterator[tuple[bytes, bytes]]:
        """:meth:`pairs` of a trivial grouping, from the elements' ``(key, value)`` values alone."""
        key, value = self.value_encoders()
        for k, v in kvs:
            yield key(k), value(v)

    def value_encoders(self) -> tuple[Callable[[Any], bytes], Callable[[Any], bytes]]:
        """The nested encodings of a trivial grouping's keys and values (:meth:`Buckets.add_values`)."""
        assert self._trivial
        kv_coder = self._coder.wrapped_value_coder
        return kv_coder.key_coder().get_impl().encode_nested, kv_coder.value_coder().get_impl().encode_nested


# Every blob starts with its kind: encoded (key, value) pairs, (key, count,
# values) records of a key's values grouped before the shuffle (KeyedValues),
# or (key, windows, count, values) records (WindowedKeyedValues).
_PAIRS, _GROUPED, _WINDOWED = 0, 1, 2


def _new_stream(kind: int):
    out = create_OutputStream()
    out.write_byte(kind)
    return out


class Buckets:
    """Packs ``(key, payload)`` pairs into one byte blob per target partition.

    Spark then shuffles a few large blobs instead of pickling every pair,
    which is most of the cost of a PySpark shuffle.
    """

    def __init__(self, partitions: int, blob_bytes: int = 1 << 20) -> None:
        self._partitions = partitions
        self._blob_bytes = blob_bytes
        self._streams = [_new_stream(_PAIRS) for _ in range(partitions)]

    def add(self, pairs: Iterable[tuple[bytes, bytes]]) -> Iterator[tuple[int, bytes]]:
        """Packs the pairs; yields each ``(target, blob)`` that fills."""
        streams, n, limit = self._streams, self._partitions, self._blob_bytes
        hash_ = key_hash
        for key, payload in pairs:
            target = hash_(key) % n
            out = streams[target]
            out.write(key, True)
            out.write(payload, True)
            if out.size() >= limit:
                yield target, out.get()
                streams[target] = _new_stream(_PAIRS)

    def add_values(self, kvs: Iterable[tuple[Any, Any]], encode_key: Callable[[Any], bytes],
                   encode_value: Callable[[Any], bytes]) -> Iterator[tuple[int, bytes]]:
        """:meth:`add` of each ``(encode_key(k), encode_value(v))``, made in the
        same loop, without a generator of pairs between them (benchmarks/group_read.py
        times both)."""
        streams, n, limit = self._streams, self._partitions, self._blob_bytes
        hash_ = key_hash
        for k, v in kvs:
            key = encode_key(k)
            target = hash_(key) % n
            out = streams[target]
            out.write(key, True)
            out.write(encode_value(v), True)
            if out.size() >= limit:
                yield target, out.get()
                streams[target] = _new_stream(_PAIRS)

    def flush(self) -> Iterator[tuple[int, bytes]]:
        for target, out in enumerate(self._streams):
            if out.size() > 1:
                yield target, out.get()
        self._streams = [_new_stream(_PAIRS) for _ in range(self._partitions)]


class KeyedValues:
    """A trivial grouping's shuffle write with each key's values gathered first.

    A task holds its values' encodings per encoded key and ships each key's
    as one record, so the shuffle and the grouping handle a record per key
    and flush instead of a pair per value. It holds at most ``memory_bytes``
    (counted as :mod:`._group_spill` counts) before it flushes. If its first
    ``_SAMPLE`` values have fewer than ``_MIN_VALUES_PER_KEY`` per key, it
    flushes them and writes plain pairs from then on, which cost less when
    keys rarely repeat (a ``GroupByKey`` of 1M keys over 2M values).
    Values come out of the grouping in another order than arrival, which a
    GroupByKey leaves unspecified. Given :class:`~._row_columns.RowColumns`
    as ``blocks``, the values are schema rows: it holds each one's field
    values and writes a key's rows as a block of columns. Given
    :class:`~._pickled_values.PickledValues`, it holds the values Beam's coder
    would pickle as objects, at most ``_PENDING`` of them across keys, and
    then pickles each key's as one block, whose bytes count from then on.
    """

    _MIN_VALUES_PER_KEY = 4
    _SAMPLE = 16_384
    # Objects held unpickled: enough for a block per key of tens of values at
    # hundreds of keys; their memory, not counted, is that of so many elements.
    _PENDING = 4_096

    def __init__(self, partitions: int, memory_bytes: int = 16 << 20, blob_bytes: int = 1 << 20,
                 blocks: Blocks | None = None) -> None:
        self._partitions = partitions
        self._memory_bytes = memory_bytes
        self._blob_bytes = blob_bytes
        # Schema rows held as their fields and written as blocks, or the objects Beam pickles.
        self._rows = blocks if type(blocks) is RowColumns else None
        self._objects = blocks if type(blocks) is PickledValues else None
        self._pending: dict[bytes, list] = {}  # a key's objects held unpickled
        self._pending_count = 0
        self._extra: dict[bytes, int] = {}  # a key's values beyond its held entries, in its blocks of objects
        self._table: dict[bytes, list] = {}
        # Encodings of the held keys of an int, str or bytes: one encoding per key and flush,
        # not per value. Of these exact types, equal keys encode equally; of others (1, 1.0,
        # True; 0.0, -0.0) they need not.
        self._keys: dict[Any, bytes] = {}
        self._by_key: dict[Any, list] = {}  # a held key of those types -> its entries in _table
        self._held = 0
        self._count = 0  # values held
        self._sample = self._SAMPLE  # values after which keys are judged; 0 once judged
        self._pairs: Buckets | None = None  # once keys turned out not to repeat

    def add(self, kvs: Iterable[tuple[Any, Any]], encode_key: Callable[[Any], bytes],
            encode_value: Callable[[Any], bytes]) -> Iterator[tuple[int, bytes]]:
        """Takes ``(key, value)`` objects; yields the ``(target, blob)`` of each flush."""
        if self._pairs is not None:
            yield from self._pairs.add_values(kvs, encode_key, encode_value)
            return
        rows, objects = self._rows, self._objects
        # Schema rows are held as their fields' values, whose str and bytes add their lengths.
        fields, row_bytes, sized = (rows.fields, rows.row_bytes, rows.sized) if rows is not None else (None, 0, ())
        table, budget, sample = self._table, self._memory_bytes, self._sample
        held, count = self._held, self._count
        get = table.get
        keys, plain, own = self._keys, _PLAIN_KEYS, OWN_TYPES
        kvs = iter(kvs)
        for k, v in kvs:
            if type(k) in plain:
                key = keys.get(k)
                if key is None:
                    key = keys[k] = encode_key(k)
            else:
                key = encode_key(k)
            if fields is not None:
                value = fields(v)
                held += row_bytes
                for i in sized:
                    if type(value[i]) in _SIZED:
                        held += len(value[i])
            elif objects is None or type(v) in own or not objects.pickles(v):
                value = encode_value(v)
                held += len(value) + VALUE_OVERHEAD
            else:
                value = None
            values = get(key)
            if values is None:
                values = table[key] = []
                held += len(key) + KEY_OVERHEAD
            if value is None:
                held += self._hold(key, v)
            else:
                values.append(value)
            count += 1
            if count == sample:
                self._sample = sample = 0
                if count < self._MIN_VALUES_PER_KEY * len(table):
                    yield from self._to_pairs(kvs, encode_key, encode_value)
                    return
            if held > budget:
                yield from self.flush()
                held, count = 0, 0
        self._held, self._count = held, count

    def add_batch(self, elements: list, key_of: Callable[[Any], Any] | None, encode_key: Callable[[Any], bytes],
                  encode_value: Callable[[Any], bytes]) -> Iterator[tuple[int, bytes]]:
        """:meth:`add` of a batch's ``(key, value)`` pairs, or of its values
        keyed by ``key_of``, a slice at a time: where a slice's keys are all
        ints, strs or bytes, each value's entry (its fields or its encoding)
        is made by one ``map`` over the slice and filed by the key object
        itself, its encoding looked up once per key and flush; the budget
        and the sample are checked after each slice, so a flush may come up
        to a slice late."""
        pairs = elements if key_of is None else zip(map(key_of, elements), elements)
        if self._pairs is not None:  # keys rarely repeat: written as they come
            yield from self._pairs.add_values(pairs, encode_key, encode_value)
            return
        if self._objects is not None:  # objects are held one by one, in add
            yield from self.add(pairs, encode_key, encode_value)
            return
        if key_of is None:  # unpacking the keys checks that each element is a pair
            keys, values = [k for k, _ in elements], list(map(itemgetter(1), elements))
        else:
            keys, values = list(map(key_of, elements)), elements
        rows = self._rows
        size = _BATCH_SLICE
        for start in range(0, len(keys), size):
            ks, vs = keys[start:start + size], values[start:start + size]
            if self._pairs is not None or not set(map(type, ks)) <= _PLAIN_KEYS:
                yield from self.add(zip(ks, vs), encode_key, encode_value)
                continue
            if rows is None:
                entries = list(map(encode_value, vs))
                added = sum(map(len, entries)) + VALUE_OVERHEAD * len(entries)
            else:
                entries = list(map(rows.fields, vs))
                added = rows.row_bytes * len(entries)
                for i in rows.sized:  # fields that may hold a str or bytes, which count their lengths
                    column = list(map(itemgetter(i), entries))
                    kinds = set(map(type, column))
                    if kinds <= _SIZED:
                        added += sum(map(len, column))
                    elif kinds & _SIZED:
                        added += sum(len(v) for v in column if type(v) in _SIZED)
            by_key, table, encoded = self._by_key, self._table, self._keys
            get = by_key.get
            for k, entry in zip(ks, entries):
                held = get(k)
                if held is None:
                    key = encoded.get(k)
                    if key is None:
                        key = encoded[k] = encode_key(k)
                    held = table.get(key)
                    if held is None:
                        held = table[key] = []
                        added += len(key) + KEY_OVERHEAD
                    by_key[k] = held
                held.append(entry)
            self._held += added
            self._count += len(entries)
            if self._sample and self._count >= self._sample:
                self._sample = 0
                if self._count < self._MIN_VALUES_PER_KEY * len(table):
                    yield from self._to_pairs(iter(()), encode_key, encode_value)
                    continue
            if self._held > self._memory_bytes:
                yield from self.flush()

    def _to_pairs(self, kvs: Iterator[tuple[Any, Any]], encode_key: Callable[[Any], bytes],
                  encode_value: Callable[[Any], bytes]) -> Iterator[tuple[int, bytes]]:
        """Keys rarely repeat: what is held is flushed, and plain pairs written from here on."""
        yield from self.flush()
        self._pairs = Buckets(self._partitions, self._blob_bytes)
        yield from self._pairs.add_values(kvs, encode_key, encode_value)

    def _hold(self, key: bytes, value: Any) -> int:
        """Holds an object Beam would pickle; the bytes added to what is held."""
        pending = self._pending.get(key)
        if pending is None:
            self._pending[key] = [value]
        else:
            pending.append(value)
        self._pending_count += 1
        return self._pickle_pending() if self._pending_count == self._PENDING else 0

    def _pickle_pending(self) -> int:
        """Each key's held objects pickled as one block among its entries; the bytes added."""
        table, extra, encode = self._table, self._extra, self._objects.encode
        added = 0
        for key, objects in self._pending.items():
            data = encode(objects)
            table[key].append(data)
            extra[key] = extra.get(key, 0) + len(objects) - 1
            added += len(data) + VALUE_OVERHEAD
        self._pending.clear()
        self._pending_count = 0
        return added

    def flush(self) -> Iterator[tuple[int, bytes]]:
        """Every held key's record, packed into blobs per target partition."""
        if self._pending:
            self._pickle_pending()
        join = b"".join if self._rows is None else self._rows.encode
        extra = self._extra
        yield from _packed(((key, None, len(values) + extra.get(key, 0), values)
                            for key, values in self._table.items()), _GROUPED,
                           self._partitions, self._blob_bytes, join)
        self._table.clear()
        self._keys.clear()
        self._by_key.clear()
        extra.clear()
        self._held, self._count = 0, 0
        if self._pairs is not None:
            yield from self._pairs.flush()


def _packed(records: Iterable[tuple[bytes, bytes | None, int, list]], kind: int, partitions: int, blob_bytes: int,
            join: Callable[[list], bytes]) -> Iterator[tuple[int, bytes]]:
    """``(key, windows or None, count, values)`` records packed into blobs of
    ``kind`` per target partition: each a key, its windows if any, the count
    of values and the joined values."""
    streams = [_new_stream(kind) for _ in range(partitions)]
    hash_ = key_hash
    for key, windows, count, values in records:
        target = hash_(key) % partitions
        out = streams[target]
        out.write(key, True)
        if windows is not None:
            out.write(windows, True)
        out.write_var_int64(count)
        out.write(join(values), True)
        if out.size() >= blob_bytes:
            yield target, out.get()
            streams[target] = _new_stream(kind)
    for target, out in enumerate(streams):
        if out.size() > 1:
            yield target, out.get()


class WindowedKeyedValues:
    """A streaming grouping's shuffle write with the values gathered per key and windows first.

    Where the grouping's trigger driver reads of an element only its value
    and windows (windows that do not merge, end-of-window output
    timestamps: ``GroupSpec.by_window``), a task holds the values'
    encodings per encoded key and encoded windows, and ships each such
    group as one record ``(key, windows, count, values)``: no timestamp or
    pane per element, each key and window set encoded once per flush,
    where :meth:`ShuffleWriter.pairs` encodes a whole ``WindowedValue``,
    key included, per element. It flushes at ``memory_bytes``, as
    :class:`KeyedValues` does, and, like it, writes plain pairs from its
    first judged batch on if keys rarely repeat (fewer than two values per
    key and windows in its first ``_SAMPLE`` values). :func:`windowed_records`
    reads both.
    """

    # A pair here encodes a whole windowed value, and reading it back decodes
    # one, so gathering pays off at fewer values per key than KeyedValues
    # needs; judged on a larger sample, so that 10,000 keys of many values
    # each look like it in a task's first values.
    _MIN_VALUES_PER_KEY = 2
    _SAMPLE = 65_536

    def __init__(self, writer: ShuffleWriter, partitions: int, memory_bytes: int = 16 << 20,
                 blob_bytes: int = 1 << 20) -> None:
        kv_coder = writer._coder.wrapped_value_coder
        self._writer = writer
        self._encode_key = kv_coder.key_coder().get_impl().encode_nested
        self._encode_value = kv_coder.value_coder().get_impl().encode_nested
        self._window_sets = WindowSetCodec(writer._coder.window_coder)
        self._partitions = partitions
        self._memory_bytes = memory_bytes
        self._blob_bytes = blob_bytes
        self._table: dict[tuple[bytes, bytes], list[bytes]] = {}
        self._keys: dict[Any, bytes] = {}  # as KeyedValues' (plain key types only)
        self._held = 0
        self._count = 0
        self._judged = False
        self._pairs: Buckets | None = None

    def add(self, batch: Any) -> Iterator[tuple[int, bytes]]:
        """Takes a batch of windowed KVs (any of :mod:`._element_batches`' kinds);
        yields the ``(target, blob)`` of each flush."""
        if self._pairs is not None:
            yield from self._pairs.add(self._writer.pairs(windowed(batch)))
            return
        table, get, keys, plain = self._table, self._table.get, self._keys, _PLAIN_KEYS
        encode_key, encode_value = self._encode_key, self._encode_value
        held = self._held
        if type(batch) is Same:
            runs = [(batch.template.windows, batch.values)]
        else:
            # Runs of elements with the same window set object: consecutive
            # elements mostly share it.
            runs, last = [], None
            for wv in windowed(batch):
                if wv.windows is not last:
                    last, kvs = wv.windows, []
                    runs.append((last, kvs))
                kvs.append(wv.value)
        windows_bytes, last, last_bytes = self._window_sets.encode, None, b""
        count = self._count
        for windows, kvs in runs:
            if windows is not last:
                last, last_bytes = windows, windows_bytes(windows)
            for k, v in kvs:
                if type(k) in plain:
                    key = keys.get(k)
                    if key is None:
                        key = keys[k] = encode_key(k)
                else:
                    key = encode_key(k)
                value = encode_value(v)
                held += len(value) + VALUE_OVERHEAD
                slot = (key, last_bytes)
                values = get(slot)
                if values is None:
                    table[slot] = [value]
                    held += len(key) + len(last_bytes) + KEY_OVERHEAD
                else:
                    values.append(value)
                count += 1
        self._held, self._count = held, count
        if not self._judged and count >= self._SAMPLE:
            self._judged = True
            if count < self._MIN_VALUES_PER_KEY * len(table):
                yield from self.flush()
                self._pairs = Buckets(self._partitions, self._blob_bytes)
                return
        if held > self._memory_bytes:
            yield from self.flush()

    def flush(self) -> Iterator[tuple[int, bytes]]:
        """Every held record, packed into blobs per target partition."""
        yield from _packed(((key, windows, len(values), values) for (key, windows), values in self._table.items()),
                           _WINDOWED,
                           self._partitions, self._blob_bytes, b"".join)
        self._table.clear()
        self._keys.clear()
        self._held, self._count = 0, 0
        if self._pairs is not None:
            yield from self._pairs.flush()


def windowed_records(blobs: Iterable[bytes]) -> Iterator[tuple[bytes, bytes | None, int, bytes]]:
    """The records of a streaming grouping's shuffled blobs:
    :class:`WindowedKeyedValues`' ``(key, windows, count, values)``, and each
    pair of :class:`Buckets` as ``(key, None, 1, element)``."""
    for blob in blobs:
        stream = create_InputStream(blob)
        read = stream.read_all
        kind = stream.read_byte()
        if kind == _PAIRS:
            while stream.size() > 0:
                key = read(True)
                yield key, None, 1, read(True)
        elif kind == _WINDOWED:
            while stream.size() > 0:
                key = read(True)
                windows = read(True)
                count = stream.read_var_int64()
                yield key, windows, count, read(True)
        else:
            raise ValueError(f"a shuffle blob of kind {kind} where a streaming grouping's records were expected")


def unpack(blobs: Iterable[bytes]) -> Iterator[tuple[bytes, bytes]]:
    """Inverse of :class:`Buckets`: the pairs of the blobs, in order."""
    for blob in blobs:
        stream = create_InputStream(blob)
        if stream.read_byte() != _PAIRS:
            raise ValueError("a shuffle blob of grouped records where pairs were expected")
        while stream.size() > 0:
            key = stream.read_all(True)
            yield key, stream.read_all(True)


def _records(blob: bytes) -> Iterator[tuple[bytes, int, bytes]]:
    """The ``(key, count, values)`` records of a blob: a :class:`KeyedValues`
    record as it is, a pair as a record of one value."""
    stream = create_InputStream(blob)
    read = stream.read_all
    if stream.read_byte() == _PAIRS:
        while stream.size() > 0:
            key = read(True)
            yield key, 1, read(True)
        return
    while stream.size() > 0:
        key = read(True)
        count = stream.read_var_int64()
        yield key, count, read(True)


class GroupReader:
    """Groups one shuffled partition by key and window; yields encoded chunks.

    Keys and values stay encoded while grouping, within ``memory_bytes``
    (sorted runs spill to disk past it, see :mod:`._group_spill`); values
    are decoded one key at a time, only where the trigger driver needs them.
    """

    def __init__(self, pre_coder: coders.WindowedValueCoder,
                 post_coder: coders.WindowedValueCoder, windowing: Any, trivial: bool,
                 step: str = "", memory_bytes: int = 256 << 20, blocks: Blocks | None = None,
                 windows_apart: bool = False) -> None:
        self._pre = pre_coder
        self._post = post_coder
        self._windowing = windowing
        self._trivial = trivial
        self.step = step
        self._memory_bytes = memory_bytes
        self._blocks = blocks  # how writers may have written the values as blocks
        self._windows_apart = windows_apart  # payloads are windows and value (ShuffleWriter's windows_apart)

    def read(self, blobs: Iterable[bytes], stats: SpillStats | None = None) -> Iterator[bytes]:
        """The grouped elements of ``blobs``, encoded; ``stats`` counts what spilled."""
        with self._grouped(blobs, stats) as groups:
            if self._trivial:
                yield from self._assemble_global(groups, self._blocks)
                return
            out_impl = self._post.get_impl()
            out = create_OutputStream()
            for grouped in self._trigger_panes(groups):
                out_impl.encode_to_stream(grouped, out, True)
                if out.size() >= _CHUNK_BYTES:
                    yield out.get()
                    out = create_OutputStream()
            if out.size():
                yield out.get()

    def read_batches(self, blobs: Iterable[bytes], coder: coders.WindowedValueCoder, limit_bytes: int,
                     batch_size: int, stats: SpillStats | None = None) -> Iterator[list]:
        """The grouped elements of ``blobs`` as objects (``WindowedValue``s of
        ``(key, [values])``), in lists of at most ``batch_size`` that close once
        their values' encodings reach ``limit_bytes``.

        ``coder`` is the reader's real coder of the grouped elements: their
        encoding is what :meth:`read` yields, so decoding it here gives the
        objects a decode of that would, without assembling and parsing it.
        """
        kv_coder = coder.wrapped_value_coder
        with self._grouped(blobs, stats) as groups:
            if not self._trivial:
                # A trigger's panes are objects already (its coders are the real ones).
                yield from batched(as_decoded(self._trigger_panes(groups)), batch_size)
                return
            with_value = _on_time_global_value().with_value
            decode_key = kv_coder.key_coder().get_impl().decode_nested
            iterable_coder = kv_coder.value_coder()
            decode_value = iterable_coder.value_coder().get_impl().decode_nested
            decode_values = iterable_coder.get_impl().decode_from_stream
            pack = struct.Struct(">i").pack
            blocks = self._blocks
            batch, size = [], 0
            for key, count, pieces in groups:
                if count == len(pieces) and count < 8:
                    # A few values, a piece each: decoding each beats joining and parsing
                    # them; from 8 values on the iterable coder's loop wins (benchmarks/group_read.py).
                    # A piece of one value is never a block, which holds two or more.
                    values = list(map(decode_value, pieces))
                elif blocks is not None:
                    values = blocks.decode_all(pieces)
                else:  # many values, or pieces of several (gathered by key, merged from spilled runs)
                    values = decode_values(create_InputStream(b"".join((pack(count), *pieces))), True)
                batch.append(with_value((decode_key(key), values)))
                size += sum(map(len, pieces))
                if len(batch) == batch_size or size >= limit_bytes:
                    yield batch
                    batch, size = [], 0
            if batch:
                yield batch

    @contextlib.contextmanager
    def _grouped(self, blobs: Iterable[bytes], stats: SpillStats | None) -> Iterator[Iterator[Group]]:
        grouping = ExternalGrouping(self._memory_bytes, stats)
        try:
            for blob in blobs:
                grouping.add_counted(_records(blob))
            yield grouping.groups()
        finally:
            grouping.close()

    @staticmethod
    def _assemble_global(groups: Iterable[Group], blocks: Blocks | None) -> Iterator[bytes]:
        header = _on_time_global_header()
        pack = struct.Struct(">i").pack
        parts: list[bytes] = []
        size = 0
        for key, count, pieces in groups:
            if blocks is not None:
                pieces = list(map(blocks.encoded, pieces))
            parts += (header, key, pack(count))
            parts += pieces
            size += len(key) + sum(map(len, pieces))
            if size >= _CHUNK_BYTES:
                yield b"".join(parts)
                parts, size = [], 0
        if parts:
            yield b"".join(parts)

    def _trigger_panes(self, groups: Iterable[Group]) -> Iterator[Any]:
        """Beam's trigger driver over each key's values: its panes."""
        driver = pane_driver(self._windowing)
        key_impl = self._pre.wrapped_value_coder.key_coder().get_impl()
        if self._windows_apart:
            yield from self._panes_at_end(driver, key_impl, groups)
            return
        decode = self._pre.get_impl().decode_from_stream
        for encoded_key, _, pieces in groups:
            key = key_impl.decode_nested(encoded_key)
            values = []
            for piece in pieces:
                stream = create_InputStream(piece)
                while stream.size() > 0:
                    wv = decode(stream, True)
                    values.append(wv.with_value(wv.value[1]))
            yield from driver.process_entire_key(key, values)

    def _panes_at_end(self, driver: OnTimePanes, key_impl: Any, groups: Iterable[Group]) -> Iterator[Any]:
        """:meth:`_trigger_panes` of payloads of windows and value, each set of windows decoded once."""
        decode_windows = WindowSetCodec(self._pre.window_coder).decode
        decode_value = self._pre.wrapped_value_coder.value_coder().get_impl().decode_from_stream
        for encoded_key, _, pieces in groups:
            elements = []
            append = elements.append
            for piece in pieces:
                stream = create_InputStream(piece)
                read = stream.read_all
                while stream.size() > 0:
                    windows = decode_windows(read(True))
                    append((windows, decode_value(stream, True)))
            yield from driver.panes_at_end(key_impl.decode_nested(encoded_key), elements)


class ElementSplitter:
    """Splits encoded elements one by one (to re-key or spread them)."""

    def __init__(self, coder: coders.Coder) -> None:
        self._coder = coder

    def elements(self, data: bytes) -> Iterator[Any]:
        impl = self._coder.get_impl()
        stream = create_InputStream(data)
        while stream.size() > 0:
            yield impl.decode_from_stream(stream, True)

    def encode(self, value: Any) -> bytes:
        return self._coder.get_impl().encode_nested(value)

    def keyed(self, elements: Iterable[Any]) -> Iterator[tuple[bytes, bytes]]:
        """``(encoded key, encoded element)`` of each KV element, the coders looked up once."""
        encode = self._coder.get_impl().encode_nested
        encode_key = self._coder.wrapped_value_coder.key_coder().get_impl().encode_nested
        for wv in elements:
            yield encode_key(wv.value[0]), encode(wv)
