"""Task side of ``--watermarks=tracker``: what each Spark task reports to the tracking service.

Substreams are event-time buckets: bucket ``b`` holds the elements with
``b * width <= timestamp < (b + 1) * width``. Every hop of a micro-batch is
reported per task, aggregated per (target process, bucket):

* a producing task draws one random 64-bit token per (consumer, target
  process, bucket) of its output, reports ``SND`` for it, and appends a
  :class:`Marker` carrying those tokens to the output partition, so the
  token travels with the data it stands for;
* the task that consumes the partition (a stage's task, or the map side of
  the shuffle in front of a keyed stage, which re-tokens per target
  partition) reports ``RCV`` of every token of the markers it read, after
  it processed the data and reported the ``SND`` of its own outputs;
* a partition's watermark holds (pending event-time timers, deferred SDF
  residuals, GroupByKey panes) are elements in flight from the process to
  itself: ``SND`` when the task ends holding them, ``RCV`` by the next task
  of that partition, which gets the tokens from the driver.

Tokens are random per attempt, never derived from the data: a report sent
twice (a retried task that had flushed, a recomputed partition) leaves its
segment non-zero, so a duplicate can delay a notification but never cancel
an element still in flight. Each task sends all its reports in one flush at
its end, SNDs before RCVs, and also returns them to the driver (through an
accumulator): the driver's log of what is open, from which it re-seeds a
restarted service.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import os
import secrets
import struct
import threading
from typing import Any, Callable, Iterable, Iterator, Mapping, NamedTuple

from apache_beam import coders
from apache_beam.coders.coder_impl import create_InputStream
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp

from beam_ext.runner._shuffle import unpack

_LOG = logging.getLogger(__name__)
_TIME_SHIFT = 1 << 63  # WindowedValueCoder's timestamp encoding
_MIN_BUCKET_MICROS = MIN_TIMESTAMP.micros
_MAX_BUCKET_MICROS = MAX_TIMESTAMP.micros


class Marker(NamedTuple):
    """Tokens sent with one output partition: ``(consumer, target process, bucket, token)``."""

    entries: tuple[tuple[str, str, int, int], ...]


class Route(NamedTuple):
    """Where one output of a stage goes."""

    consumers: tuple[str, ...]  # owners that read it as a main input
    coder: Any  # windowed coder of its elements; None for GroupByKey input
    shuffle: bool  # (target partition, blob) records feeding a GroupByKey
    timestamped: bool  # GroupByKey payloads carry their timestamps (not default windowing)


@dataclasses.dataclass(frozen=True)
class Tracking:
    """What the driver tells every task of one stage launch in tracker mode."""

    address: str
    token: bytes
    allow_plaintext: bool
    processes: tuple[str, ...]  # every process of the registered graph
    owner: str
    parallelism: int
    bucket_micros: int
    batch: int
    routes: Mapping[int, Route]  # output index -> route
    holds: Mapping[int, tuple[tuple[int, int], ...]]  # partition -> (bucket, token) held since its last task
    stateful: bool  # partitions are state partitions: report holds
    log: Any  # accumulator of TaskLog lists


@dataclasses.dataclass(frozen=True)
class TaskLog:
    """One task's reports, returned to the driver with its result."""

    token: bytes  # the service incarnation they were sent to
    owner: str
    partition: int
    batch: int
    entries: tuple[tuple[str, int, str, str, int], ...]  # ("S"|"R", bucket, at, segment, token)
    holds: tuple[tuple[int, int], ...] | None  # (bucket, token) held now; None: not a state partition
    status: str  # "delivered", "pending" (service unreachable) or "failed"


def bucket_of(micros: int, width: int) -> int:
    """The bucket of a timestamp in microseconds (clamped to Beam's range)."""
    return max(_MIN_BUCKET_MICROS, min(micros, _MAX_BUCKET_MICROS)) // width


def process(owner: str, index: int) -> str:
    return f"{owner}/{index}"


# -- reading timestamps --------------------------------------------------------
def element_bucket_reader(coder: Any, width: int) -> Callable[[bytes], int]:
    """``encoded element -> bucket``: the 8-byte timestamp prefix of a full
    WindowedValueCoder encoding, else a decode."""
    if type(coder) is coders.WindowedValueCoder:
        unpack_ts = struct.Struct(">Q").unpack_from

        def read(data: bytes) -> int:
            return bucket_of((unpack_ts(data)[0] - _TIME_SHIFT) * 1000, width)
        return read
    impl = coder.get_impl()
    return lambda data: bucket_of(impl.decode_nested(data).timestamp.micros, width)


def chunk_buckets(coder: Any, width: int, chunk: bytes) -> set[int]:
    """The buckets of the elements of an encoded chunk."""
    impl = coder.get_impl()
    stream = create_InputStream(chunk)
    found = set()
    while stream.size() > 0:
        found.add(bucket_of(impl.decode_from_stream(stream, True).timestamp.micros, width))
    return found


# -- the executor process's agent ----------------------------------------------
_AGENTS: dict[tuple[str, bytes], Any] = {}
_AGENTS_LOCK = threading.Lock()


def _agent(tracking: Tracking):
    """This Python worker's report-only agent for the job's service, made on first use."""
    from beam_ext.watermark import LocalAgent

    key = (tracking.address, tracking.token)
    with _AGENTS_LOCK:
        agent = _AGENTS.get(key)
        if agent is not None:
            return agent
        # Agents of an earlier service incarnation (or job) would retry forever.
        for old in list(_AGENTS):
            _AGENTS.pop(old).close()
        agent = LocalAgent(
            tracking.address, f"exec-{os.getpid()}-{secrets.token_hex(4)}", tracking.token,
            flush_interval=0.05, hosts=tracking.processes, listen=False, connect_timeout=2.0,
            allow_plaintext=tracking.allow_plaintext)
        _AGENTS[key] = agent
        return agent


def _drop_agent(tracking: Tracking) -> None:
    with _AGENTS_LOCK:
        agent = _AGENTS.pop((tracking.address, tracking.token), None)
    if agent is not None:
        agent.close()


def send_reports(tracking: Tracking, entries: list[tuple[str, int, str, str, int]]) -> str:
    """Reports ``entries`` in order and flushes; returns the TaskLog status.

    An unreachable service does not fail the task: the agent keeps retrying,
    and the driver re-seeds a restarted service from the task logs.
    """
    from beam_ext.watermark import TrackerAuthError

    if not entries:
        return "delivered"
    try:
        agent = _agent(tracking)
        for op, bucket, at, segment, token in entries:
            if op == "S":
                agent.sent(bucket, token, to=segment, at=at)
            else:
                agent.received(bucket, token, at=at)
        agent.flush()
        return "delivered"
    except ConnectionError:
        return "pending"
    except TrackerAuthError:
        # A restarted service has a new token: this incarnation's agent is useless.
        _drop_agent(tracking)
        return "failed"
    except Exception:  # noqa: BLE001 - a refused report must not lose the task's data
        _LOG.warning("tracker: reports of %s partition refused", tracking.owner, exc_info=True)
        _drop_agent(tracking)
        return "failed"


# -- one stage or GroupByKey task -------------------------------------------------
class _Outputs:
    """Buckets seen per output (and per target partition for GroupByKey inputs)."""

    def __init__(self, tracking: Tracking) -> None:
        self._t = tracking
        self.buckets: dict[int, set[int]] = collections.defaultdict(set)
        self.shuffled: dict[int, dict[int, set[int]]] = collections.defaultdict(
            lambda: collections.defaultdict(set))
        self._readers: dict[int, Callable[[bytes], int]] = {}

    def add(self, index: int, data: Any) -> None:
        route = self._t.routes.get(index)
        if route is None or not route.consumers:
            return
        width = self._t.bucket_micros
        if not route.shuffle:
            self.buckets[index] |= chunk_buckets(route.coder, width, data)
            return
        target, blob = data
        seen = self.shuffled[index][target]
        if not route.timestamped:
            # Default windowing drops timestamps from the payload: count the
            # elements in the lowest bucket, which holds everything back.
            seen.add(bucket_of(MIN_TIMESTAMP.micros, width))
            return
        reader = self._readers.get(index)
        if reader is None:
            reader = self._readers[index] = _payload_reader(width)
        for _, payload in unpack([blob]):
            seen.add(reader(payload))


def _payload_reader(width: int) -> Callable[[bytes], int]:
    unpack_ts = struct.Struct(">Q").unpack_from
    return lambda payload: bucket_of((unpack_ts(payload)[0] - _TIME_SHIFT) * 1000, width)


def _token() -> int:
    return secrets.randbits(64) or 1


def tracked_task(tracking: Tracking, task: Callable, report: Callable, partition: int,
                 records: Iterable[tuple[int, Any]]) -> Iterator[Any]:
    """Runs ``task(report, partition, records)`` and reports its hop to the tracker.

    Markers are taken out of ``records`` before the task sees them; the
    task's outputs pass through, followed by the markers of its own outputs.
    A GroupByKey task yields bare chunks (output 0), a stage task
    ``(output index, data)`` records.
    """
    received: list[Marker] = []
    holds: set[Timestamp] = set()
    grouped = tracking.owner.startswith("group")

    def inputs():
        for record in records:
            if isinstance(record[1], Marker):
                received.append(record[1])
            else:
                yield record

    def capture(part: int, summary) -> None:
        holds.update(summary.holds)
        report(part, dataclasses.replace(summary, holds=frozenset()))

    outputs = _Outputs(tracking)
    for record in task(capture, partition, inputs()):
        if grouped:
            outputs.add(0, record)
        elif record[0] >= 0:
            outputs.add(record[0], record[1])
        yield record
    yield from _finish(tracking, partition, received, outputs, holds, grouped)


def _finish(tracking: Tracking, partition: int, received: list[Marker], outputs: _Outputs,
            holds: set[Timestamp], grouped: bool) -> Iterator[Any]:
    t = tracking
    me = process(t.owner, partition % t.parallelism)
    sends: list[tuple[str, int, str, str, int]] = []
    out: list[Any] = []
    for index, buckets in outputs.buckets.items():
        entries = []
        for consumer in t.routes[index].consumers:
            target = process(consumer, partition % t.parallelism)
            for b in sorted(buckets):
                tok = _token()
                sends.append(("S", b, me, target, tok))
                entries.append((consumer, target, b, tok))
        marker = Marker(tuple(entries))
        out.append(marker if grouped else (index, marker))
    for index, targets in outputs.shuffled.items():
        group = t.routes[index].consumers[0]
        for target_partition, buckets in targets.items():
            target = process(group, target_partition)
            entries = []
            for b in sorted(buckets):
                tok = _token()
                sends.append(("S", b, me, target, tok))
                entries.append((group, target, b, tok))
            out.append((index, (target_partition, Marker(tuple(entries)))))
    held = None
    if t.stateful:
        held = tuple((b, _token()) for b in sorted({bucket_of(h.micros, t.bucket_micros) for h in holds}))
        sends.extend(("S", b, me, me, tok) for b, tok in held)
    receives = [("R", b, target, target, tok) for m in received for consumer, target, b, tok in m.entries
                if consumer == t.owner]
    if t.stateful:
        receives.extend(("R", b, me, me, tok) for b, tok in t.holds.get(partition, ()))
    entries = sends + receives
    if entries or held:
        status = send_reports(t, entries)
        t.log.add([TaskLog(t.token, t.owner, partition, t.batch, tuple(entries), held, status)])
    yield from out


# -- the map side of a keyed or spread stage's input shuffle ----------------------
def tracked_shuffle(tracking: Tracking, fn: Callable, coder: Any, pairs: bool, index: int,
                    chunks: Iterable[Any]) -> Iterator[tuple[int, Any]]:
    """Runs ``fn(index, chunks)`` (yielding ``(target partition, (input, payload))``)
    and re-tokens the hop per target partition.

    The map task acts for the process its input's markers were sent to: it
    reports SND to each target partition's process, then RCV of those
    markers; the targets get new markers through the shuffle. ``pairs``: the
    payload is a blob of (key, element) pairs, else one element.
    """
    t = tracking
    received: list[Marker] = []

    def data():
        for chunk in chunks:
            if isinstance(chunk, Marker):
                received.append(chunk)
            else:
                yield chunk

    read = element_bucket_reader(coder, t.bucket_micros)
    per_target: dict[int, set[int]] = collections.defaultdict(set)
    input_index = 0
    for target, (input_index, payload) in fn(index, data()):
        seen = per_target[target]
        if pairs:
            for _, element in unpack([payload]):
                seen.add(read(element))
        else:
            seen.add(read(payload))
        yield target, (input_index, payload)
    mine = [entry for m in received for entry in m.entries if entry[0] == t.owner]
    me = mine[0][1] if mine else process(t.owner, index % t.parallelism)
    sends = []
    for target_partition, buckets in sorted(per_target.items()):
        target = process(t.owner, target_partition)
        entries = []
        for b in sorted(buckets):
            tok = _token()
            sends.append(("S", b, me, target, tok))
            entries.append((t.owner, target, b, tok))
        yield target_partition, (input_index, Marker(tuple(entries)))
    entries = sends + [("R", b, target, target, tok) for _, target, b, tok in mine]
    if not entries:
        return
    status = send_reports(t, entries)
    t.log.add([TaskLog(t.token, t.owner, -1 - index, t.batch, tuple(entries), None, status)])


def without_index(fn: Callable, index: int, chunks: Iterable[Any]) -> Iterator[Any]:
    return fn(chunks)
