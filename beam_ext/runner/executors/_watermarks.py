"""Where the streaming executor's input watermarks come from: ``--watermarks=min|tracker``.

``min`` is the classic computation (the minimum of the inputs' output
watermarks, per micro-batch), exact in this executor: it is the true low
watermark the tracker is measured against.

``tracker`` asks ``beam_ext.watermark``'s tracking service instead. The
driver runs a :class:`~beam_ext.watermark.TrackerService` on loopback (port
0, a random token per job; ``--tracker_address`` binds another interface),
registers one process per stage (and per GroupByKey) per partition with the
plan's edges, and listens for every end-of-substream notification (NEOSS)
through its own agent. Substreams are event-time buckets of
``--tracker_bucket`` seconds (:mod:`beam_ext.runner.worker._tracking` says
how tasks report them). Sources are the driver's: a TestStream promises the
buckets its watermark has passed, the impulse every bucket once emitted.
Only buckets something was sent in are promised or awaited: the driver
learns them from the task logs, and a bucket nothing was ever sent in is
empty.

A stage's input watermark is the largest T such that every process of its
producers received NEOSS for every such bucket below T (and T is no later
than every source's watermark): everything its producers will ever send
below T has been sent, and the stage processes what it was sent before its
timers fire, as in the classic model. Before launching a stage the driver
waits up to ``--tracker_timeout`` seconds for the notifications it expects
(the buckets below the classic watermark), then uses what it has: a late
notification only delays a watermark, never advances one early.

Faults. If the service is gone, or the expected notifications do not come
(an executor process died after flushing reports that its retry then sent
again), the driver starts a fresh service (new port, new token), registers
the graph and re-seeds it from its log of every report of every finished
task (tasks return their reports with their results) plus its own promises:
exactly the open state, without the reports of failed attempts. Tasks of
later stages report to the new service. Notifications already received are
kept, watermarks never go back.
"""
from __future__ import annotations

import bisect
import collections
import functools
import logging
import secrets
import threading
import time
from typing import Any, Iterable

from apache_beam.runners.portability.fn_api_runner.translations import IMPULSE_BUFFER
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP, Timestamp

from beam_ext.runner.worker import _tracking
from beam_ext.runner.worker._tracking import Marker, Route, TaskLog, Tracking, bucket_of, process

_LOG = logging.getLogger("beam_ext.runner")

try:
    from pyspark.accumulators import AccumulatorParam as _AccumulatorParam
except ImportError:  # pragma: no cover - pyspark is a hard dependency
    _AccumulatorParam = object


class _ListParam(_AccumulatorParam):
    def zero(self, value):
        return []

    def addInPlace(self, a, b):
        a.extend(b)
        return a


def _stats_summary(lags: list[float]) -> dict[str, float]:
    if not lags:
        return {"lag_mean_s": 0.0, "lag_p50_s": 0.0, "lag_max_s": 0.0}
    ordered = sorted(lags)
    return {"lag_mean_s": round(sum(ordered) / len(ordered), 6),
            "lag_p50_s": round(ordered[len(ordered) // 2], 6),
            "lag_max_s": round(ordered[-1], 6)}


class MinWatermarks:
    """The classic watermarks; counts what a punctuation scheme would send for them."""

    mode = "min"
    # Whether a stage's input watermark needs its producers to have run in the
    # batch even when none of them can hold it (the tracker waits for their reports).
    needs_producers_run = False

    def __init__(self, plan, parallelism: int, producers: dict[bytes, list[int]],
                 group_owner: dict[bytes, str]) -> None:
        self._plan = plan
        self._parallelism = parallelism
        self._group_owner = group_owner
        self._counts: dict[str, Any] = collections.Counter()
        self._lags: list[float] = []
        # owner -> the batch (its Progress) its watermark was last counted in; an
        # idle batch that commits nothing is run again under the same number.
        self._counted: dict[str, Any] = {}
        # owner -> the owners whose outputs it reads as main input
        self._producers: dict[str, list[str]] = {}
        for number, stage in enumerate(plan.stages):
            ups = []
            for buffer_id in stage.inputs:
                if buffer_id == IMPULSE_BUFFER:
                    ups.append("impulse")
                elif buffer_id in group_owner:
                    ups.append(group_owner[buffer_id])
                else:
                    ups.extend(f"stage{n}" for n in producers.get(buffer_id, ()))
            self._producers[f"stage{number}"] = list(dict.fromkeys(ups))
        for buffer_id, owner in group_owner.items():
            self._producers[owner] = [f"stage{n}" for n in producers.get(buffer_id, ())]
        self._passing = frozenset(owner for buffer_id, owner in group_owner.items()
                                  if plan.groups[buffer_id].passes_through)

    def width(self, owner: str) -> int:
        """How many processes ``owner`` has."""
        if owner == "impulse":
            return 1
        if owner.startswith("stage") and self._plan.stages[int(owner[5:])].test_stream is not None:
            return 1
        return self._parallelism

    # -- lifecycle ---------------------------------------------------------
    def start(self, progress) -> None:
        pass

    def stop(self) -> None:
        _LOG.info("watermarks (%s): %s", self.mode, self.stats())

    def stats(self) -> dict[str, Any]:
        """Counters for benchmarks: watermark computations, lag behind the
        classic (true low) watermark, messages."""
        out = {"mode": self.mode, "gathers": 0, "punctuations": 0, "timer_gathers": 0, "behind": 0, "ahead": 0,
               "restarts": 0, "wait_s": 0.0, **self._counts, **_stats_summary(self._lags)}
        return out

    # -- watermarks ----------------------------------------------------------
    def input_watermark(self, owner: str, classic: Timestamp, progress) -> Timestamp:
        if self._counted.get(owner) is not progress:
            self._counted[owner] = progress
            self._count_gather(owner)
            if self.stateful(owner):
                self._counts["timer_gathers"] += 1
                self._lags.append(0.0)
        return classic

    def stateful(self, owner: str) -> bool:
        """Whether ``owner`` keeps state between batches: only such a stage or
        group can hold its output watermark behind its input watermark."""
        return owner.startswith("group") or self._plan.stages[int(owner[5:])].keeps_state

    def holds(self, owner: str) -> bool:
        """Whether ``owner``, once run, may hold its output watermark behind its
        input watermark: a stage or grouping keeping state, but not a
        ``Reshuffle``'s grouping (``GroupSpec.passes_through``), which fires
        every value in the micro-batch it arrives in and keeps nothing."""
        return self.stateful(owner) and owner not in self._passing

    def _count_gather(self, owner: str) -> None:
        self._counts["gathers"] += 1
        # A punctuation scheme sends a watermark on every channel into the stage.
        self._counts["punctuations"] += self.width(owner) * sum(
            self.width(up) for up in self._producers.get(owner, ()))

    # -- hooks on the data path (nothing to add in min mode) --------------------
    def task(self, owner: str, task, report, progress):
        return functools.partial(task, report)

    def shuffle_side(self, owner: str, fn, coder, pairs: bool, progress):
        return functools.partial(_tracking.without_index, fn) if pairs else fn

    def source_records(self, number: int, buffer_id: bytes, chunk: bytes, progress) -> list:
        return [chunk]

    def impulse_records(self) -> list:
        return []


class TrackerWatermarks(MinWatermarks):
    """Input watermarks from the tracking service's end-of-substream notifications."""

    mode = "tracker"
    needs_producers_run = True

    def __init__(self, spark_context, plan, parallelism: int, producers: dict[bytes, list[int]],
                 group_owner: dict[bytes, str], address: str | None = None, bucket: float = 1.0,
                 timeout: float = 5.0, allow_plaintext: bool = False) -> None:
        super().__init__(plan, parallelism, producers, group_owner)
        if not bucket > 0:
            raise ValueError(f"--tracker_bucket must be > 0 seconds, got {bucket!r}")
        self._sc = spark_context
        self._bucket = max(1, round(bucket * 1e6))
        self._timeout = float(timeout)
        self._host, self._port = ("127.0.0.1", 0) if not address else _split_address(address)
        self._allow_plaintext = allow_plaintext
        self._consumers: dict[tuple[str, bytes], tuple[str, ...]] = {}
        self._routes: dict[str, dict[int, Route]] = {}
        self._graph = self._build_graph(producers)
        self._sources = sorted(p for p, ups in self._graph.items() if not ups)
        # The processes whose notifications make a watermark: those of producers.
        self._targets = sorted({process(up, i) for ups in self._producers.values() for up in ups
                                for i in range(self.width(up))} - set(self._sources))
        self._cond = threading.Condition()
        self._ended: dict[str, set[int]] = {p: set() for p in self._targets}
        self._low: dict[str, int] = {}
        self._relevant: list[int] = []  # sorted buckets anything was sent in
        self._relevant_set: set[int] = set()
        self._promised: dict[str, set[int]] = {s: set() for s in self._sources}
        self._open: dict[tuple[int, str], int] = {}  # (bucket, segment) -> XOR of every report
        self._holds: dict[str, dict[int, tuple]] = collections.defaultdict(dict)
        self._impulse_sent = False
        self._impulse_markers: list[Marker] = []
        self._cached: dict[str, tuple[Any, Timestamp]] = {}  # owner -> (its batch's Progress, watermark)
        self._service = None
        self._agent = None
        self._token = b""
        self._address = ""
        self._stopping = False
        self._old_stats: dict[str, int] = collections.Counter()
        self._log_acc = None
        self._unseen: set[tuple[str, int]] = set()

    # -- the process graph ---------------------------------------------------
    def _outputs_of(self, owner: str) -> list[tuple[int, bytes]]:
        if owner.startswith("group"):
            return [(0, next(b for b, o in self._group_owner.items() if o == owner))]
        return list(enumerate(self._plan.stages[int(owner[5:])].outputs))

    def _build_graph(self, producers: dict[bytes, list[int]]) -> dict[str, list[str]]:
        owners = [f"stage{n}" for n in range(len(self._plan.stages))] + list(self._group_owner.values())
        readers: dict[bytes, list[str]] = collections.defaultdict(list)
        for number, stage in enumerate(self._plan.stages):
            for buffer_id in stage.inputs:
                readers[buffer_id].append(f"stage{number}")
        coders: dict[bytes, Any] = {}
        for stage in self._plan.stages:
            for buffer_id, coder in zip(stage.inputs, stage.input_coders):
                coders.setdefault(buffer_id, coder)
        for owner in owners:
            routes = {}
            for index, buffer_id in self._outputs_of(owner):
                group = self._plan.groups.get(buffer_id)
                if group is not None and not owner.startswith("group"):
                    routes[index] = Route((self._group_owner[buffer_id],), None, True, not group.trivial)
                else:
                    coder = group.post_coder if group is not None else coders.get(buffer_id)
                    routes[index] = Route(tuple(readers.get(buffer_id, ())), coder, False, True)
            self._routes[owner] = routes
        if any(IMPULSE_BUFFER in s.inputs for s in self._plan.stages):
            owners.append("impulse")
            self._routes["impulse"] = {0: Route(tuple(readers[IMPULSE_BUFFER]), None, False, True)}
        graph: dict[str, list[str]] = {}
        for owner in owners:
            ups = [process(up, i) for up in self._producers.get(owner, ()) for i in range(self.width(up))]
            stage = self._plan.stages[int(owner[5:])] if owner.startswith("stage") else None
            if stage is not None and stage.keeps_state:
                # The map side of its input shuffle acts for one partition and sends to all.
                ups += [process(owner, i) for i in range(self.width(owner))]
            if stage is not None and stage.test_stream is not None:
                ups = []
            for i in range(self.width(owner)):
                graph[process(owner, i)] = ups
        return graph

    # -- lifecycle ---------------------------------------------------------
    def start(self, progress) -> None:
        self._log_acc = self._sc.accumulator([], _ListParam())
        self._impulse_sent = progress.impulse_done
        # Resuming from a checkpoint: a new service knows nothing of the holds
        # saved with the state until each partition's next task reports them.
        self._unseen = {(owner, i) for owner, summary in progress.summaries.items()
                        if summary.hold < MAX_TIMESTAMP and self.stateful(owner)
                        for i in range(self.width(owner))}
        self._start_service()
        _LOG.info("watermarks from the tracker at %s: %d processes, %d sources, buckets of %.3fs",
                  self._address, len(self._graph), len(self._sources), self._bucket / 1e6)

    def _start_service(self) -> None:
        from beam_ext.watermark import LocalAgent, TrackerService

        self._token = secrets.token_bytes(16)
        service = TrackerService(
            self._host, self._port, self._token, consistent_order=False, retire_lost=False,
            allow_plaintext=self._allow_plaintext).start()
        service.register_graph(self._graph)
        self._service = service
        self._address = service.address
        agent = LocalAgent(self._address, "driver", self._token, flush_interval=0.01,
                           hosts=sorted(self._graph), allow_plaintext=self._allow_plaintext)
        for target in self._targets:
            agent.on_end_of_substream(functools.partial(self._on_end, target), process=target)
        self._agent = agent

    def _on_end(self, target: str, bucket: int) -> None:
        with self._cond:
            self._ended[target].add(bucket)
            self._cond.notify_all()

    def stop(self) -> None:
        self._stopping = True
        try:
            super().stop()
        finally:
            self._close_service()

    def _close_service(self) -> None:
        if self._agent is not None:
            self._agent.close()
            self._agent = None
        if self._service is not None:
            for key, value in self._service.stats().items():
                self._old_stats[key] += value
            self._service.stop()
            self._service = None

    @property
    def service(self):
        """The running :class:`~beam_ext.watermark.TrackerService` (None when stopped)."""
        return self._service

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        service = dict(self._old_stats)
        if self._service is not None:
            for key, value in self._service.stats().items():
                service[key] = service.get(key, 0) + value
        for key in ("report_batches", "heartbeats", "notification_messages", "neoss_sent", "hello_calls",
                    "resyncs", "late_reports", "duplicate_reports", "rejected_calls"):
            out[f"service_{key}"] = service.get(key, 0)
        out["service_messages"] = (service.get("report_batches", 0) + service.get("heartbeats", 0)
                                   + service.get("notification_messages", 0) + service.get("hello_calls", 0))
        out["processes"] = len(self._graph)
        out["bucket_s"] = self._bucket / 1e6
        return out

    # -- what tasks need ------------------------------------------------------
    def _tracking(self, owner: str, progress, stateful: bool) -> Tracking:
        return Tracking(
            address=self._address, token=self._token, allow_plaintext=self._allow_plaintext,
            processes=tuple(sorted(self._graph)), owner=owner, parallelism=self._parallelism,
            bucket_micros=self._bucket, batch=progress.batch, routes=self._routes.get(owner, {}),
            holds=dict(self._holds.get(owner, {})), stateful=stateful, log=self._log_acc)

    def task(self, owner: str, task, report, progress):
        stateful = self.stateful(owner)
        self._ingest()  # the holds of its partitions' last tasks
        return functools.partial(_tracking.tracked_task, self._tracking(owner, progress, stateful), task, report)

    def shuffle_side(self, owner: str, fn, coder, pairs: bool, progress):
        if pairs:
            fn = functools.partial(_tracking.without_index, fn)
        return functools.partial(_tracking.tracked_shuffle, self._tracking(owner, progress, False), fn, coder,
                                 pairs)

    def source_records(self, number: int, buffer_id: bytes, chunk: bytes, progress) -> list:
        owner = f"stage{number}"
        index = self._plan.stages[number].outputs.index(buffer_id)
        route = self._routes[owner].get(index)
        if route is None or not route.consumers or route.coder is None:
            return [chunk]
        buckets = _tracking.chunk_buckets(route.coder, self._bucket, chunk)
        marker = self._send_from(process(owner, 0), route.consumers, buckets)
        return [chunk, marker]

    def impulse_records(self) -> list:
        if not self._impulse_markers and not self._impulse_sent:
            route = self._routes["impulse"][0]
            self._impulse_markers = [self._send_from(
                process("impulse", 0), route.consumers, {bucket_of(MIN_TIMESTAMP.micros, self._bucket)})]
            self._impulse_sent = True
        return list(self._impulse_markers)

    def _send_from(self, source: str, consumers: Iterable[str], buckets: set[int]) -> Marker:
        entries = []
        for consumer in consumers:
            target = process(consumer, 0)
            for b in sorted(buckets):
                tok = secrets.randbits(64) or 1
                entries.append((consumer, target, b, tok))
                self._record(("S", b, source, target, tok))
                self._agent.sent(b, tok, to=target, at=source)
        self._flush()
        return Marker(tuple(entries))

    def _flush(self) -> None:
        try:
            self._agent.flush()
        except ConnectionError:
            pass  # the next gather restarts the service and re-seeds it

    # -- the driver's log of open reports ------------------------------------
    def _record(self, entry: tuple[str, int, str, str, int]) -> None:
        op, b, at, segment, tok = entry
        if b not in self._relevant_set:
            self._relevant_set.add(b)
            bisect.insort(self._relevant, b)
        key = (b, segment)
        value = self._open.get(key, 0) ^ tok
        if value:
            self._open[key] = value
        else:
            self._open.pop(key, None)

    def _ingest(self) -> None:
        """Folds the logs of the tasks finished since the last call into the driver's log."""
        if self._log_acc is None:
            return
        logs: list[TaskLog] = list(self._log_acc.value)
        if not logs:
            return
        self._log_acc.value = []  # no task runs while the driver is here
        stale = []
        for log in logs:
            self._counts["task_reports"] += 1
            self._counts["task_report_entries"] += len(log.entries)
            self._counts[f"task_reports_{log.status}"] += 1
            for entry in log.entries:
                self._record(entry)
            if log.holds is not None:
                self._holds[log.owner][log.partition] = log.holds
                self._unseen.discard((log.owner, log.partition))
            if log.token != self._token or log.status == "failed":
                stale.append(log)
        if stale and self._service is not None:
            # Sent to an earlier service, or refused: this one has never seen them.
            for log in stale:
                self._report_as_driver(log.entries)
            self._counts["task_reports_resent"] += len(stale)
            self._flush()

    def _report_as_driver(self, entries) -> None:
        for op, b, at, segment, tok in entries:
            if op == "S":
                self._agent.sent(b, tok, to=segment, at=at)
            else:
                self._agent.received(b, tok, at=at)

    # -- the watermark -------------------------------------------------------
    def _frontier(self, source: str, progress) -> Timestamp:
        owner = source.split("/")[0]
        if owner.startswith("stage"):
            number = int(owner[5:])
            spec = self._plan.stages[number].test_stream
            if spec is not None:
                return min((progress.source_watermarks.get((number, i), MIN_TIMESTAMP) for i in spec.outputs),
                           default=MAX_TIMESTAMP)
        if owner == "impulse" and not (self._impulse_sent or progress.impulse_done):
            return MIN_TIMESTAMP
        return MAX_TIMESTAMP

    def _promise(self, progress) -> None:
        promised = False
        for source in self._sources:
            frontier = self._frontier(source, progress)
            done = self._promised[source]
            for b in self._relevant:
                if (b + 1) * self._bucket > frontier.micros:
                    break
                if b not in done:
                    done.add(b)
                    self._agent.promise(b, at=source)
                    promised = True
        if promised:
            self._flush()

    def _start(self, b: int) -> Timestamp:
        return Timestamp(micros=max(MIN_TIMESTAMP.micros, min(b * self._bucket, MAX_TIMESTAMP.micros)))

    def _prefix(self, target: str, limit: Timestamp) -> Timestamp:
        """The largest T <= limit such that ``target`` got NEOSS for every relevant bucket below T."""
        ended = self._ended[target]
        low = self._low.get(target)
        start = 0 if low is None else bisect.bisect_left(self._relevant, low)
        for b in self._relevant[start:]:
            if self._start(b) >= limit:
                break
            if b not in ended:
                self._low[target] = b
                return self._start(b)
        if limit < MAX_TIMESTAMP:
            self._low[target] = bucket_of(limit.micros, self._bucket)
        return limit

    def _producers_ended(self, owner: str, progress) -> Timestamp:
        limit = min((self._frontier(s, progress) for s in self._sources), default=MAX_TIMESTAMP)
        mark = MAX_TIMESTAMP
        for up in self._producers.get(owner, ()):
            for i in range(self.width(up)):
                name = process(up, i)
                if name in self._promised:
                    mark = min(mark, self._frontier(name, progress))
                else:
                    mark = min(mark, self._prefix(name, limit))
        return min(mark, limit)

    def input_watermark(self, owner: str, classic: Timestamp, progress) -> Timestamp:
        stateful = self.stateful(owner)
        cached = self._cached.get(owner)
        if cached is not None and cached[0] is progress:
            if stateful:
                return cached[1]  # the value its timers fired under
        else:
            self._count_gather(owner)
        self._ingest()
        if self._service is None or not self._service.running:
            self._restart("the service is not running")
        limit = min((self._frontier(s, progress) for s in self._sources), default=MAX_TIMESTAMP)
        expected = min(classic, limit)
        if MIN_TIMESTAMP < expected < MAX_TIMESTAMP:
            # What buckets can tell: up to the start of the one it falls in.
            expected = self._start(bucket_of(expected.micros, self._bucket))
        start = time.monotonic()
        restarted = False
        while True:
            self._promise(progress)
            deadline = time.monotonic() + self._timeout
            with self._cond:
                while True:
                    mark = self._producers_ended(owner, progress)
                    left = deadline - time.monotonic()
                    if mark >= expected or left <= 0:
                        break
                    self._cond.wait(min(left, 0.5))
            if mark >= expected or restarted:
                break
            # Expected notifications did not come: reports were lost or sent twice.
            self._restart(f"{owner} waited {self._timeout:.1f}s for notifications up to "
                          f"{float(expected) if expected < MAX_TIMESTAMP else '+inf'}")
            restarted = True
        self._counts["wait_s"] = round(self._counts.get("wait_s", 0) + time.monotonic() - start, 6)
        if self._unseen and mark > classic:
            mark = classic  # holds restored from the checkpoint, not reported yet
            self._counts["capped_after_resume"] += 1
        if stateful:
            # Measured where a watermark is acted on, once its producers have run
            # (a stateless stage launched lazily is computed again when they have).
            self._counts["timer_gathers"] += 1
            if mark < expected:
                self._counts["behind"] += 1
                _LOG.warning("tracker: %s runs under %s, behind the %s expected", owner, mark, expected)
            if mark > classic:
                self._counts["ahead"] += 1
                _LOG.warning("tracker: %s watermark %s is ahead of the classic %s", owner, mark, classic)
            if MIN_TIMESTAMP < classic < MAX_TIMESTAMP and mark > MIN_TIMESTAMP:
                self._lags.append(max(0.0, float(classic - mark)))
        self._cached[owner] = (progress, mark)
        with self._cond:
            self._prune()
        return mark

    def _prune(self) -> None:
        """Forgets buckets that every process has passed and every source promised."""
        if not self._relevant:
            return
        lows = [self._low.get(t) for t in self._targets]
        if any(low is None for low in lows):
            return
        floor = min(lows)
        cut = bisect.bisect_left(self._relevant, floor)
        gone = [b for b in self._relevant[:cut] if all(b in p for p in self._promised.values())]
        if len(gone) < 64:
            return
        drop = set(gone)
        self._relevant = [b for b in self._relevant if b not in drop]
        self._relevant_set -= drop
        for done in self._promised.values():
            done -= drop
        for ended in self._ended.values():
            ended -= drop
        self._open = {k: v for k, v in self._open.items() if k[0] not in drop}
        self._counts["buckets_forgotten"] += len(drop)

    # -- faults --------------------------------------------------------------
    def _restart(self, why: str) -> None:
        """A fresh service, re-seeded from the driver's log of open reports."""
        _LOG.warning("tracker: restarting the service (%s); re-seeding %d open reports", why, len(self._open))
        self._counts["restarts"] += 1
        try:
            self._close_service()
        except Exception:  # noqa: BLE001 - the old one may be half dead
            _LOG.debug("tracker: closing the old service failed", exc_info=True)
        self._port = 0 if self._host in ("127.0.0.1", "localhost", "::1") else self._port
        self._start_service()
        # The table XORs per segment: one report per open (bucket, segment) restores it.
        for (b, segment), tok in self._open.items():
            self._agent.received(b, tok, at=segment)
        for source, done in self._promised.items():
            for b in done:
                self._agent.promise(b, at=source)
        self._flush()


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--tracker_address must be HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port)


def make_watermarks(mode: str, spark_context, plan, parallelism: int, producers: dict[bytes, list[int]],
                    group_owner: dict[bytes, str], tracker_options: dict | None = None) -> MinWatermarks:
    """The watermark source of ``--watermarks=mode``."""
    if mode == "min":
        return MinWatermarks(plan, parallelism, producers, group_owner)
    if mode == "tracker":
        return TrackerWatermarks(spark_context, plan, parallelism, producers, group_owner,
                                 **(tracker_options or {}))
    raise ValueError(f"--watermarks must be 'min' or 'tracker', got {mode!r}")
