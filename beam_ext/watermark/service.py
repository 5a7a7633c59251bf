"""TrackerService: the trAcker tracking agent as a gRPC server."""
from __future__ import annotations

import asyncio
import hmac
import logging
import secrets
import threading
from typing import Callable, Iterable, Mapping, Sequence

import grpc
from apache_beam.metrics import Metrics

from beam_ext.clock import Clock, SystemClock
from beam_ext.watermark import _tracker_pb2 as pb
from beam_ext.watermark._table import TableError, TableFull, TrackerTable
from beam_ext.watermark._transport import (
    TOKEN_KEY,
    Pem,
    check_plaintext,
    decode_batch,
    encode_at,
    encode_substream,
    read_pem,
    server_handler,
)

_log = logging.getLogger(__name__)
_NAMESPACE = "beam_ext.watermark"


class TrackerService:
    """The tracking agent: collects SND/RCV XOR reports and promises, sends NEOSS.

    Binds to ``host`` (loopback by default) and refuses every call that does
    not carry ``token``. ``port=0`` picks a free port; ``address`` tells it.
    With ``tls_cert`` and ``tls_key`` it serves TLS only; without them it
    serves plaintext, which is refused on a non-loopback ``host`` unless
    ``allow_plaintext``.

    Example::

        svc = TrackerService(token=b"job-secret").start()
        svc.register_graph({"src/0": [], "sink/0": ["src/0"]})
        ...  # LocalAgent(svc.address, "sink/0", token=b"job-secret")
        svc.stop()

    Args:
        host: interface to bind; anything but loopback exposes the service
            (and needs TLS or ``allow_plaintext``).
        port: TCP port, 0 for any free one.
        token: the job's secret; every call must carry it.
        consistent_order: release each process's NEOSS in coarse-label order.
        heartbeat_timeout: seconds of silence after which a process is lost.
        clock: time source for liveness (tests inject ``ManualClock``).
        restore_from: bytes of ``snapshot()`` of a previous incarnation.
        on_process_lost: ``callback(process_id, silent_seconds)``.
        max_open_substreams: substreams open at once (about 2 kB each, plus
            ~120 B per target process); a report that would open more is
            refused with RESOURCE_EXHAUSTED and counted. None: no bound.
        retire_lost: retire the open substreams a lost process blocks (its
            source never promised them, or elements are in flight to it) and
            stop waiting for its acknowledgements; False keeps them open
            until it comes back.
        tls_cert: the service's certificate chain (PEM bytes or a file's path).
        tls_key: its private key (PEM bytes or a file's path).
        allow_plaintext: serve plaintext on a non-loopback ``host`` anyway.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        token: bytes = b"",
        *,
        consistent_order: bool = True,
        heartbeat_timeout: float = 5.0,
        clock: Clock | None = None,
        restore_from: bytes | None = None,
        on_process_lost: Callable[[str, float], None] | None = None,
        max_open_substreams: int | None = 10_000,
        retire_lost: bool = True,
        tls_cert: Pem | None = None,
        tls_key: Pem | None = None,
        allow_plaintext: bool = False,
    ) -> None:
        if not isinstance(host, str) or not host:
            raise ValueError(f"host must be a non-empty string, got {host!r}")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"port must be an int in [0, 65535], got {port!r}")
        if not isinstance(token, bytes) or not token:
            raise ValueError("token must be non-empty bytes: the service refuses calls without the job's token")
        if not heartbeat_timeout > 0:
            raise ValueError(f"heartbeat_timeout must be > 0 seconds, got {heartbeat_timeout!r}")
        if (tls_cert is None) != (tls_key is None):
            raise ValueError("tls_cert and tls_key go together: pass both for TLS, or neither")
        self._tls: tuple[bytes, bytes] | None = None
        if tls_cert is not None:
            self._tls = (read_pem(tls_key, "tls_key"), read_pem(tls_cert, "tls_cert"))
        else:
            check_plaintext(host, allow_plaintext, "TrackerService host", "tls_cert and tls_key")
        self._host = host
        self._port = port
        self._token = token
        self._clock: Clock = clock or SystemClock()
        self._heartbeat_timeout = float(heartbeat_timeout)
        self._on_lost = on_process_lost
        self._retire_lost = bool(retire_lost)
        if restore_from is not None:
            self._table = TrackerTable.restore(restore_from, max_open_substreams=max_open_substreams)
        else:
            self._table = TrackerTable(consistent_order=consistent_order, max_open_substreams=max_open_substreams)
        self._lock = threading.Lock()
        self._incarnation = secrets.randbits(64) or 1
        self._subscribers: dict[str, asyncio.Queue] = {}
        self._host_agent: dict[str, str] = {  # process -> the agent that reports for it
            h: a for a, hosts in self._table._agents.items() for h in hosts
        }
        self._last_seen: dict[str, float] = {}
        self._closed: set[str] = set()
        self._lost: set[str] = set()
        self._stats = dict.fromkeys(
            [
                "hello_calls",
                "report_batches",
                "heartbeats",
                "notification_messages",
                "neoss_sent",
                "rejected_calls",
                "duplicate_reports",
                "buffered_reports",
                "late_reports",
                "resyncs",
                "invalid_reports",
                "open_limit_refusals",
            ],
            0,
        )
        self._rejected_metric = Metrics.counter(_NAMESPACE, "rejected_calls")
        self._late_metric = Metrics.counter(_NAMESPACE, "late_reports")
        self._refused_metric = Metrics.counter(_NAMESPACE, "open_limit_refusals")
        self._abandoned_metric = Metrics.counter(_NAMESPACE, "abandoned_substreams")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: grpc.aio.Server | None = None
        self._address: str | None = None

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> TrackerService:
        """Start serving in a background thread; returns ``self``."""
        if self._loop is not None:
            raise RuntimeError("TrackerService already started")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tracker-service", daemon=True)
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._astart(), self._loop).result()
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop = None
            raise
        return self

    async def _astart(self) -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((server_handler(self),))
        bind = f"[{self._host}]" if ":" in self._host and not self._host.startswith("[") else self._host
        try:
            if self._tls is not None:
                port = server.add_secure_port(f"{bind}:{self._port}", grpc.ssl_server_credentials([self._tls]))
            else:
                port = server.add_insecure_port(f"{bind}:{self._port}")
        except RuntimeError:  # grpc.aio raises where grpc returns 0
            port = 0
        if port == 0:
            # gRPC says "failed to bind" for a key that does not match the certificate too.
            hint = "; or tls_key is not the private key of tls_cert's first certificate" if self._tls else ""
            raise OSError(f"TrackerService could not bind {bind}:{self._port} (address in use?{hint})")
        await server.start()
        self._server = server
        self._address = f"{bind}:{port}"
        self._monitor = asyncio.ensure_future(self._monitor_liveness())

    @property
    def running(self) -> bool:
        """Whether the service is serving (started and not stopped)."""
        return self._loop is not None and self._server is not None

    @property
    def address(self) -> str:
        """``host:port`` that agents connect to (after ``start()``)."""
        if self._address is None:
            raise RuntimeError("TrackerService is not started: call start() first")
        return self._address

    def stop(self, grace: float | None = None) -> None:
        """Stop serving; open streams are closed. Idempotent."""
        loop = self._loop
        if loop is None:
            return

        async def _astop() -> None:
            self._monitor.cancel()
            for q in self._subscribers.values():
                q.put_nowait(None)
            if self._server is not None:
                await self._server.stop(grace)

        try:
            asyncio.run_coroutine_threadsafe(_astop(), loop).result(timeout=30)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(timeout=30)
            loop.close()
            self._loop = None

    def __enter__(self) -> TrackerService:
        return self.start() if self._loop is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- control (in-process) ------------------------------------------------
    def register_graph(self, graph: Mapping[str, Sequence[str]]) -> None:
        """Declare the processes: ``{process: [its upstream processes]}``.

        Processes without upstream are sources and must promise every
        substream; a cycle is allowed (a process may be its own upstream).
        """
        with self._lock:
            self._table.register_graph(graph)

    def snapshot(self) -> bytes:
        """The table as bytes, for ``TrackerService(restore_from=...)``."""
        with self._lock:
            return self._table.snapshot()

    def stats(self) -> dict[str, int]:
        """Counters: messages in and out, refused calls and reports, duplicates,
        late reports, abandoned substreams; and the substreams open now."""
        with self._lock:
            out = dict(self._stats)
            out["late_reports"] = self._table.late_reports
            out["duplicate_reports"] = self._table.duplicates
            out["abandoned_substreams"] = self._table.abandoned_count
            out["open_substreams"] = self._table.open_count
            return out

    def notified(self, substream: int | bytes) -> set[str]:
        """Processes already sent NEOSS(substream)."""
        with self._lock:
            return self._table.notified(substream)

    def waiting_on(self, substream: int | bytes) -> dict[str, object]:
        """Why ``substream`` has not ended everywhere (for diagnostics)."""
        with self._lock:
            return self._table.waiting_on(substream)

    def lost_processes(self) -> dict[str, float]:
        """Processes silent for longer than ``heartbeat_timeout``: seconds silent."""
        now = self._clock.now()
        with self._lock:
            return {
                p: now - t
                for p, t in sorted(self._last_seen.items())
                if p not in self._closed and now - t > self._heartbeat_timeout
            }

    def check_liveness(self) -> list[str]:
        """Report processes that newly stopped reporting; returns their ids.

        With ``retire_lost``, also retire the substreams that cannot end
        without the processes lost now (logged and counted as abandoned).
        """
        lost = self.lost_processes()
        fresh = [p for p in lost if p not in self._lost]
        self._lost = set(lost)
        for p in fresh:
            with self._lock:
                blocked = [s for s in self._table.open_substreams()
                           if p in self._table.waiting_on(s).get("segments_in_flight", [])]
            _log.warning(
                "tracker: process %r stopped reporting: silent for %.1f s (heartbeat timeout %.1f s); "
                "%d open substream(s) have elements in flight to it",
                p, lost[p], self._heartbeat_timeout, len(blocked),
            )
            if self._on_lost is not None:
                self._on_lost(p, lost[p])
        if self._retire_lost:
            self._declare_lost(sorted(lost))
        return fresh

    def _declare_lost(self, agents: list[str]) -> None:
        """Tell the table which graph processes the lost ``agents`` host."""
        with self._lock:
            abandoned, hosts = self._set_lost_locked(agents)
        self._note_abandoned(abandoned, hosts)

    def _set_lost_locked(self, agents: list[str]) -> tuple[list, set[str]]:
        """The table's lost processes become those ``agents`` host (caller holds
        the lock); returns the substreams this abandons, and those processes."""
        hosts: set[str] = set()
        for agent in agents:
            try:
                hosts |= self._table.hosts_of(agent)
            except TableError:
                pass  # subscribed under an id the graph does not know: hosts nothing
        return self._table.set_lost(hosts), hosts

    def _back_locked(self, agent: str) -> None:
        """A lost agent calls again (caller holds the lock): its processes are
        awaited from this call on, not from the next liveness check, or the
        substreams sent to them meanwhile would be abandoned."""
        if agent not in self._lost:
            return
        self._lost.discard(agent)
        _log.warning("tracker: process %r reports again", agent)
        if self._retire_lost:
            abandoned, hosts = self._set_lost_locked(sorted(self._lost))
            self._note_abandoned(abandoned, hosts)

    def _note_abandoned(self, abandoned: list, lost: Iterable[str]) -> None:
        """Count and log substreams retired before every process was notified."""
        if not abandoned:
            return
        self._abandoned_metric.inc(len(abandoned))
        _log.warning(
            "tracker: abandoned %d substream(s) that cannot end everywhere while process(es) %s are lost; "
            "no end-of-substream notification will come for them: %s%s",
            len(abandoned), sorted(lost), abandoned[:10], " ..." if len(abandoned) > 10 else "",
        )

    async def _monitor_liveness(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat_timeout / 2)
            try:
                self.check_liveness()
            except Exception:  # a failing user callback must not stop monitoring
                _log.exception("tracker: on_process_lost callback failed")

    # -- RPC handlers (event loop thread) ---------------------------------------
    async def _authorize(self, context: grpc.aio.ServicerContext) -> None:
        sent = b""
        for key, value in context.invocation_metadata() or ():
            if key == TOKEN_KEY:
                sent = value if isinstance(value, bytes) else value.encode()
        if not hmac.compare_digest(sent, self._token):
            with self._lock:
                self._stats["rejected_calls"] += 1
            self._rejected_metric.inc()
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong job token")

    def _seen(self, process: str) -> None:
        self._last_seen[process] = self._clock.now()
        self._closed.discard(process)
        self._back_locked(process)

    async def Hello(self, request: pb.HelloRequest, context: grpc.aio.ServicerContext) -> pb.HelloReply:
        await self._authorize(context)
        agent = request.process_id
        hosts = list(request.hosts) or [agent]
        with self._lock:
            self._stats["hello_calls"] += 1
            graph = self._table.graph
            unknown = [h for h in hosts if graph and h not in graph]
            if not unknown:
                if request.hosts:
                    self._table.register_agent(agent, hosts)
                for h in hosts:
                    # An agent that listens for h keeps receiving its NEOSS when a
                    # report-only agent (an executor's) says it hosts h too.
                    routed = self._host_agent.get(h)
                    if routed is None or routed == agent or routed not in self._subscribers:
                        self._host_agent[h] = agent
                self._seen(agent)
            last = self._table._last_seq.get(agent, 0)
        if unknown:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"process(es) {unknown} of agent {agent!r} are not in the registered graph",
            )
        return pb.HelloReply(incarnation=self._incarnation, last_seq=last)

    async def Report(self, request: pb.ReportBatch, context: grpc.aio.ServicerContext) -> pb.ReportAck:
        await self._authorize(context)
        if not request.resync and request.incarnation != self._incarnation:
            # Reports made for another incarnation are deltas on a table this one
            # may not have: ask for the agent's whole state instead.
            return pb.ReportAck(incarnation=self._incarnation, resync_required=True)
        try:
            batch = decode_batch(request)
        except (TypeError, ValueError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        with self._lock:
            # A lost agent that reports is back before its report is applied.
            self._back_locked(batch.process)
            try:
                result = self._table.apply(batch)
            except TableFull as exc:
                self._stats["open_limit_refusals"] += 1
                refusal, message = grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
                result = None
            except (TableError, TypeError, ValueError) as exc:
                self._stats["invalid_reports"] += 1
                refusal, message = grpc.StatusCode.INVALID_ARGUMENT, str(exc)
                result = None
            if result is not None:
                self._seen(batch.process)
                if request.closing:
                    self._closed.add(batch.process)
                empty = not (batch.entries or batch.promises or batch.labels or batch.resync)
                self._stats["heartbeats" if empty else "report_batches"] += 1
                self._stats["resyncs"] += int(batch.resync)
                self._stats["buffered_reports"] += int(result.status == "buffered")
                retired = self._table.take_retired(batch.process)
                last = self._table._last_seq.get(batch.process, 0)
        if result is None:
            if refusal == grpc.StatusCode.RESOURCE_EXHAUSTED:
                self._refused_metric.inc()
            await context.abort(refusal, message)
        if result.late_reports:
            self._late_metric.inc(result.late_reports)
        self._note_abandoned(result.abandoned, self._table.lost)
        self._push(result.notifications)
        return pb.ReportAck(
            incarnation=self._incarnation,
            applied_seq=last,
            duplicate=result.status == "duplicate",
            retired=[encode_substream(s) for s in retired],
        )

    def _push(self, notifications: dict) -> None:
        # One Notification per agent, however many of its processes it covers.
        per_agent: dict[str, list] = {}
        for proc, ended in notifications.items():
            agent = self._host_agent.get(proc, proc)
            per_agent.setdefault(agent, []).extend((proc, s) for s in ended)
        for agent, items in per_agent.items():
            q = self._subscribers.get(agent)
            if q is not None:
                q.put_nowait(items)

    async def Subscribe(self, request: pb.SubscribeRequest, context: grpc.aio.ServicerContext):
        await self._authorize(context)
        proc = request.process_id
        q: asyncio.Queue = asyncio.Queue()
        old = self._subscribers.get(proc)
        if old is not None:
            old.put_nowait(None)
        self._subscribers[proc] = q
        with self._lock:
            # The agent that listens receives the NEOSS of every process it hosts.
            try:
                hosts = self._table.hosts_of(proc)
            except TableError:
                hosts = frozenset()
            for h in hosts:
                self._host_agent[h] = proc
            self._seen(proc)
            # Decided before this stream existed and not acknowledged: resend.
            try:
                pending = self._table.unacked_for(proc)
            except TableError:
                pending = []
        if pending:
            q.put_nowait(pending)
        try:
            while True:
                ended = await q.get()
                if ended is None:
                    return
                with self._lock:
                    self._stats["notification_messages"] += 1
                    self._stats["neoss_sent"] += len(ended)
                yield pb.Notification(ended_at=[encode_at(p, s) for p, s in ended])
        finally:
            if self._subscribers.get(proc) is q:
                del self._subscribers[proc]
