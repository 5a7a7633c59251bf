"""LocalAgent: a process's link to the TrackerService (local trAcker agent)."""
from __future__ import annotations

import logging
import math
import random
import secrets
import threading
from typing import Callable, Sequence

import grpc

from beam_ext.clock import Clock, MonotonicClock, SystemClock
from beam_ext.errors import BeamExtError
from beam_ext.watermark import _tracker_pb2 as pb
from beam_ext.watermark._table import Substream, check_substream, check_token, order_key
from beam_ext.watermark._transport import (
    TOKEN_KEY,
    Pem,
    check_plaintext,
    client_stubs,
    decode_at,
    decode_substream,
    encode_at,
    encode_substream,
    read_pem,
)

_log = logging.getLogger(__name__)


class TrackerAuthError(BeamExtError, PermissionError):
    """The service refused the job token."""


class TrackerLimitError(BeamExtError, RuntimeError):
    """The service refused reports that would open more substreams than its
    ``max_open_substreams``; the agent cannot drop them, so it stops."""


def new_token() -> int:
    """A fresh random 64-bit token for one element on one hop."""
    return secrets.randbits(64)


class LocalAgent:
    """Reports one process's SND/RCV/PROMISE to the tracker and receives NEOSS.

    Reports are XOR-aggregated per (substream, segment) and flushed every
    ``flush_interval`` seconds (local trAcker agent, 004 section 4.1).
    ``flush_interval=0`` sends every report at once (no aggregation);
    ``None`` sends only on ``flush()`` (no background thread, no heartbeats).

    Example::

        a = LocalAgent(svc.address, process_id="mid/0", token=b"job-secret")
        tok = new_token()
        a.sent(7, tok, to="sink/0")       # before the element leaves
        a.received(7, in_token)           # after processing it and reporting its outputs
        a.on_end_of_substream(print)      # or a.wait(7, timeout=1.0)
        a.close()

    Order matters: report ``sent`` of an element's outputs before
    ``received`` of the element itself (004 section 3.1).

    Args:
        address: the service's ``host:port``.
        process_id: this process's id in the registered graph.
        token: the job's secret; a wrong one fails here with TrackerAuthError.
        flush_interval: seconds between flushes, 0 for none, None for manual.
        heartbeat_interval: seconds of idleness after which a heartbeat is sent.
        time_slack: clock synchronisation slack delta of coarse time labels.
        clock: time source for labels.
        interval_clock: the clock that times flushes and heartbeats
            (monotonic by default; tests pass a ``ManualClock``).
        connect_timeout: seconds to wait for the service at construction.
        hosts: for an executor-level agent, the graph processes it reports
            for; ``process_id`` then names the executor. Every call takes
            ``at=`` (the hosted process), or use ``for_process(p)``.
        tls_ca: connect over TLS, trusting this CA (PEM bytes or a file's
            path): the one that signed the service's certificate.
        tls_server_name: the name to check the service's certificate
            against, when it does not carry the address's host.
        allow_plaintext: connect in plaintext to a non-loopback address anyway.
        listen: subscribe to the NEOSS of the hosted processes. A report-only
            agent (False) does not: the service keeps sending those to the
            agent that listens for them (say, a driver's), and ``wait``,
            ``ended`` and ``on_end_of_substream`` raise.
    """

    def __init__(
        self,
        address: str,
        process_id: str,
        token: bytes,
        flush_interval: float | None = 0.01,
        *,
        heartbeat_interval: float = 1.0,
        time_slack: float = 0.01,
        clock: Clock | None = None,
        interval_clock: Clock | None = None,
        connect_timeout: float = 10.0,
        hosts: Sequence[str] | None = None,
        tls_ca: Pem | None = None,
        tls_server_name: str | None = None,
        allow_plaintext: bool = False,
        listen: bool = True,
    ) -> None:
        if not isinstance(address, str) or ":" not in address:
            raise ValueError(f"address must be 'host:port', got {address!r}")
        if not isinstance(process_id, str) or not process_id:
            raise ValueError(f"process_id must be a non-empty string, got {process_id!r}")
        if not isinstance(token, bytes) or not token:
            raise ValueError("token must be non-empty bytes (the job's token)")
        if flush_interval is not None and not flush_interval >= 0:
            raise ValueError(f"flush_interval must be >= 0 seconds or None, got {flush_interval!r}")
        if not heartbeat_interval > 0:
            raise ValueError(f"heartbeat_interval must be > 0 seconds, got {heartbeat_interval!r}")
        if not time_slack > 0:
            raise ValueError(f"time_slack must be > 0 seconds, got {time_slack!r}")
        if hosts is not None:
            if isinstance(hosts, str) or not hosts or not all(isinstance(h, str) and h for h in hosts):
                raise ValueError(f"hosts must be a non-empty list of process ids, got {hosts!r}")
        if tls_server_name is not None and tls_ca is None:
            raise ValueError("tls_server_name needs tls_ca: it names the certificate TLS checks")
        if tls_ca is not None:
            credentials = grpc.ssl_channel_credentials(root_certificates=read_pem(tls_ca, "tls_ca"))
        else:
            check_plaintext(address.rsplit(":", 1)[0], allow_plaintext, f"LocalAgent {process_id!r} address",
                            "tls_ca")
        self.address = address
        self.process_id = process_id
        self.hosts: tuple[str, ...] = tuple(hosts) if hosts is not None else (process_id,)
        self._default = self.hosts[0] if len(self.hosts) == 1 else None
        self._metadata = ((TOKEN_KEY, token),)
        self._flush_interval = flush_interval
        self._heartbeat_interval = float(heartbeat_interval)
        self._slack = float(time_slack)
        self._clock: Clock = clock or SystemClock()
        self._intervals: Clock = interval_clock or MonotonicClock()
        self._rng = random.Random()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._io_lock = threading.Lock()
        # Not yet flushed.
        self._pending: dict[tuple[Substream, str, str], int] = {}  # (s, sender, segment)
        self._pending_promises: list[tuple[Substream, str]] = []
        self._pending_labels: dict[Substream, int] = {}
        self._pending_acks: list[tuple[str, Substream]] = []
        self._dirty_since: float | None = None
        # Everything flushed for open substreams: resent whole after a service restart.
        self._cum: dict[Substream, dict[tuple[str, str], int]] = {}
        self._cum_promises: set[tuple[Substream, str]] = set()
        self._cum_labels: dict[Substream, int] = {}
        self._retired: set[Substream] = set()
        self._seq = 0
        self._unacked: list[pb.ReportBatch] = []
        self._delivered: set[tuple[str, Substream]] = set()
        self._callbacks: list[tuple[str, Callable[[Substream], None]]] = []
        self._error: BaseException | None = None
        self._closed = False
        self._listens = bool(listen)
        self._hello_hosts = list(hosts or ())
        self._last_contact = self._intervals.now()
        self.messages_sent = 0

        if tls_ca is not None:
            options = [("grpc.ssl_target_name_override", tls_server_name)] if tls_server_name else []
            self._channel = grpc.secure_channel(address, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(address)
        self._stubs = client_stubs(self._channel)
        try:
            reply = self._hello(pb.HelloRequest(process_id=process_id, hosts=self._hello_hosts), connect_timeout)
        except grpc.RpcError as exc:
            self._channel.close()
            raise self._translate(exc) from None
        self.messages_sent += 1
        self._incarnation = reply.incarnation
        self._seq = reply.last_seq
        self._stop = threading.Event()
        self._call = None
        self._listener = None
        if self._listens:
            self._listener = threading.Thread(target=self._listen, name=f"tracker-listen-{process_id}",
                                              daemon=True)
            self._listener.start()
        self._flusher = None
        if flush_interval is not None:
            self._flusher = threading.Thread(target=self._flush_loop, name=f"tracker-flush-{process_id}", daemon=True)
            self._flusher.start()

    def _hello(self, request: pb.HelloRequest, timeout: float) -> pb.HelloReply:
        """Hello, waiting up to ``timeout`` for the service to come up."""
        try:
            return self._stubs["Hello"](request, metadata=self._metadata, timeout=timeout, wait_for_ready=True)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
        # Waiting hides why the channel never got ready (refused connection, failed
        # TLS handshake): a call that does not wait fails with that reason.
        return self._stubs["Hello"](request, metadata=self._metadata, timeout=min(timeout, 2.0))

    def _translate(self, exc: grpc.RpcError) -> BaseException:
        code = exc.code()
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return TrackerAuthError(
                f"tracker at {self.address} refused the job token of process {self.process_id!r}: {exc.details()}"
            )
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return TrackerLimitError(
                f"tracker at {self.address} refused the reports of {self.process_id!r}: {exc.details()}"
            )
        if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
            return ValueError(f"tracker at {self.address} rejected process {self.process_id!r}: {exc.details()}")
        return ConnectionError(f"tracker at {self.address} unreachable from {self.process_id!r}: {exc.details()}")

    # -- reports ---------------------------------------------------------------
    def label_now(self) -> int:
        """The coarse time label ``ceil(clock / time_slack)`` of this moment."""
        return math.ceil(self._clock.now() / self._slack)

    def _at(self, at: str | None) -> str:
        if at is None:
            if self._default is None:
                raise ValueError(f"agent {self.process_id!r} hosts {len(self.hosts)} processes: pass at=PROCESS")
            return self._default
        if at not in self.hosts:
            raise ValueError(f"at={at!r} is not a process hosted by agent {self.process_id!r}")
        return at

    def sent(self, substream: Substream, token: int, to: str, label: int | None = None, *,
             at: str | None = None) -> None:
        """SND: an element of ``substream`` with ``token`` leaves for process ``to``."""
        check_substream(substream)
        check_token(token)
        if not isinstance(to, str) or not to:
            raise ValueError(f"to must be a process id string, got {to!r}")
        self._report(substream, self._at(at), to, token, label)

    def received(self, substream: Substream, token: int, label: int | None = None, *, at: str | None = None) -> None:
        """RCV: the element with ``token`` was processed and its outputs reported."""
        check_substream(substream)
        check_token(token)
        at = self._at(at)
        self._report(substream, at, at, token, label)

    def promise(self, substream: Substream, label: int | None = None, *, at: str | None = None) -> None:
        """PROMISE: this source will send no more elements of ``substream``."""
        check_substream(substream)
        at = self._at(at)
        with self._cond:
            self._raise_if_failed()
            self._pending_promises.append((substream, at))
            self._add_label(substream, label)
            self._mark_dirty()
        self._after_report()

    def for_process(self, process: str) -> HostedAgent:
        """A view with the single-process API for one hosted process."""
        return HostedAgent(self, self._at(process))

    def _report(self, s: Substream, sender: str, seg: str, token: int, label: int | None) -> None:
        with self._cond:
            self._raise_if_failed()
            key = (s, sender, seg)
            self._pending[key] = self._pending.get(key, 0) ^ token
            self._add_label(s, label)
            self._mark_dirty()
        self._after_report()

    def _add_label(self, s: Substream, label: int | None) -> None:
        if label is None:
            label = self.label_now()
        elif isinstance(label, bool) or not isinstance(label, int):
            raise TypeError(f"label must be an int, got {label!r}")
        old = self._pending_labels.get(s)
        if old is None or label < old:
            self._pending_labels[s] = label

    def _mark_dirty(self) -> None:
        if self._dirty_since is None:
            self._dirty_since = self._intervals.now()
            self._cond.notify_all()

    def _after_report(self) -> None:
        if self._flush_interval == 0:
            with self._io_lock:
                self._send(raise_errors=False)

    # -- NEOSS -----------------------------------------------------------------
    def on_end_of_substream(self, callback: Callable[[Substream], None], process: str | None = None) -> None:
        """Call ``callback(substream)`` on each NEOSS for the process (listener thread)."""
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {callback!r}")
        self._check_listens()
        process = self._at(process)
        with self._cond:
            self._callbacks.append((process, callback))

    def wait(self, substream: Substream, timeout: float | None = None, process: str | None = None) -> bool:
        """Block until NEOSS(substream) arrived for the process; False on timeout."""
        check_substream(substream)
        self._check_listens()
        key = (self._at(process), substream)
        with self._cond:
            self._cond.wait_for(lambda: key in self._delivered or self._error is not None or self._closed, timeout)
            self._raise_if_failed()
            return key in self._delivered

    def ended(self, substream: Substream, process: str | None = None) -> bool:
        """Whether NEOSS(substream) already arrived for the process."""
        self._check_listens()
        key = (self._at(process), substream)
        with self._cond:
            return key in self._delivered

    def _check_listens(self) -> None:
        if not self._listens:
            raise RuntimeError(f"agent {self.process_id!r} reports only (listen=False): it receives no NEOSS")

    def _listen(self) -> None:
        backoff = 0.02
        while not self._stop.is_set():
            try:
                call = self._stubs["Subscribe"](
                    pb.SubscribeRequest(process_id=self.process_id), metadata=self._metadata, wait_for_ready=True
                )
                self._call = call
                if self._stop.is_set():
                    call.cancel()
                    return
                for note in call:
                    backoff = 0.02
                    self._deliver([decode_at(x)[::-1] for x in note.ended_at])
            except grpc.RpcError as exc:
                if self._stop.is_set() or exc.code() == grpc.StatusCode.CANCELLED:
                    if self._stop.is_set():
                        return
                if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                    self._fail(self._translate(exc))
                    return
            self._stop.wait(backoff * (1 + self._rng.random()))
            backoff = min(backoff * 2, 1.0)

    def _deliver(self, ended: list[tuple[str, Substream]]) -> None:
        fresh = []
        with self._cond:
            for key in ended:
                # Acknowledge repeats too: a restarted service resends what it lost the ack of.
                self._pending_acks.append(key)
                if key not in self._delivered:
                    self._delivered.add(key)
                    fresh.append(key)
            callbacks = list(self._callbacks)
            self._cond.notify_all()
        for proc, s in fresh:
            for want, cb in callbacks:
                if want != proc:
                    continue
                try:
                    cb(s)
                except Exception:
                    _log.exception("end-of-substream callback of %r failed on %r", proc, s)

    # -- flushing ----------------------------------------------------------------
    def flush(self) -> None:
        """Send what is buffered now; raises ConnectionError if the service is down."""
        self._raise_if_failed()
        with self._io_lock:
            self._send(raise_errors=True, force=True)

    def _cut(self, force: bool, heartbeat: bool, closing: bool = False) -> pb.ReportBatch | None:
        """Move pending reports into a numbered batch (caller holds _cond)."""
        has_reports = bool(self._pending or self._pending_promises)
        if not (has_reports or heartbeat or closing or (force and self._pending_acks)):
            return None
        self._seq += 1
        batch = pb.ReportBatch(process_id=self.process_id, seq=self._seq, closing=closing)
        for (s, sender, seg), x in self._pending.items():
            if x:
                batch.entries.append(pb.XorEntry(substream=encode_substream(s), sender=sender, segment=seg, xor=x))
                segs = self._cum.setdefault(s, {})
                v = segs.get((sender, seg), 0) ^ x
                if v:
                    segs[(sender, seg)] = v
                else:
                    segs.pop((sender, seg), None)
        for s, src in self._pending_promises:
            batch.source_promises.append(encode_at(src, s))
            self._cum_promises.add((s, src))
        for s, label in self._pending_labels.items():
            batch.labels.append(pb.Label(substream=encode_substream(s), label=label))
            old = self._cum_labels.get(s)
            self._cum_labels[s] = label if old is None else min(old, label)
        batch.host_acks.extend(encode_at(p, s) for p, s in self._pending_acks)
        self._pending.clear()
        self._pending_promises.clear()
        self._pending_labels.clear()
        self._pending_acks.clear()
        self._dirty_since = None
        self._unacked.append(batch)
        return batch

    def _send(self, raise_errors: bool, force: bool = False, heartbeat: bool = False, closing: bool = False) -> None:
        """Cut a batch and deliver every unacknowledged one, in order (holds _io_lock)."""
        with self._cond:
            self._cut(force, heartbeat, closing)
        while True:
            with self._cond:
                if not self._unacked:
                    return
                batch = self._unacked[0]
                batch.incarnation = self._incarnation
            ack = self._send_batch(batch, raise_errors)
            if ack is None:
                return
            self._last_contact = self._intervals.now()
            if ack.resync_required:
                self._resync(raise_errors)
                continue
            with self._cond:
                if self._unacked and self._unacked[0] is batch:
                    self._unacked.pop(0)
                self._forget(ack.retired)

    def _send_batch(self, batch: pb.ReportBatch, raise_errors: bool):
        """Sends one batch and returns the service's ack, or None to retry later.

        An unreachable service raises ConnectionError only if ``raise_errors``;
        any other error fails the agent (recorded, then raised).
        """
        try:
            ack = self._stubs["Report"](batch, metadata=self._metadata, timeout=10.0)
        except grpc.RpcError as exc:
            err = self._translate(exc)
            if not isinstance(err, ConnectionError):
                self._fail(err)
                raise err from None
            if raise_errors:
                raise err from None
            return None
        self.messages_sent += 1
        return ack

    def _forget(self, retired) -> None:
        for m in retired:
            s = decode_substream(m)
            self._retired.add(s)
            self._cum.pop(s, None)
            self._cum_promises = {x for x in self._cum_promises if x[0] != s}
            self._cum_labels.pop(s, None)

    def _resync(self, raise_errors: bool) -> None:
        """Send the whole state of open substreams to a restarted service."""
        with self._cond:
            batch = pb.ReportBatch(process_id=self.process_id, seq=self._seq, resync=True)
            for s, segs in self._cum.items():
                for (sender, seg), x in segs.items():
                    batch.entries.append(
                        pb.XorEntry(substream=encode_substream(s), sender=sender, segment=seg, xor=x)
                    )
            batch.source_promises.extend(encode_at(src, s) for s, src in self._cum_promises)
            batch.labels.extend(pb.Label(substream=encode_substream(s), label=lab)
                                for s, lab in self._cum_labels.items())
            batch.host_acks.extend(encode_at(p, s) for p, s in self._delivered if s not in self._retired)
            batch.retired.extend(encode_substream(s) for s in sorted(self._retired, key=order_key))
        ack = self._send_batch(batch, raise_errors)
        if ack is None:
            return
        with self._cond:
            self._incarnation = ack.incarnation
            # The resync holds every batch cut so far.
            self._unacked = [b for b in self._unacked if b.seq > batch.seq]
            self._forget(ack.retired)

    def _flush_loop(self) -> None:
        interval = self._flush_interval or 0.0
        while True:
            with self._cond:
                while not self._closed:
                    now = self._intervals.now()
                    if self._unacked:
                        due = now + 0.05  # service unreachable: retry soon
                    elif self._dirty_since is not None:
                        due = self._dirty_since + interval
                    else:
                        due = self._last_contact + self._heartbeat_interval
                    if now >= due:
                        break
                    self._cond.wait(due - now)
                if self._closed:
                    return
                heartbeat = self._dirty_since is None and not self._unacked
            try:
                with self._io_lock:
                    self._send(raise_errors=False, heartbeat=heartbeat)
            except Exception:
                return  # _fail recorded it; calls raise from now on
            if self._unacked:
                self._stop.wait(0.05)

    # -- errors and shutdown -----------------------------------------------------
    def _fail(self, err: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = err
            self._cond.notify_all()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Flush what is left (best effort), stop the threads. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        if self._error is None:
            try:
                with self._io_lock:
                    self._send(raise_errors=False, closing=True)
            except Exception:
                pass
        self._stop.set()
        if self._call is not None:
            self._call.cancel()
        if self._listener is not None:
            self._listener.join(timeout=10)
        if self._flusher is not None:
            self._flusher.join(timeout=10)
        self._channel.close()

    def __enter__(self) -> LocalAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class HostedAgent:
    """One process's view of an executor-level LocalAgent (same API as a LocalAgent).

    Example::

        ex = LocalAgent(addr, "exec/0", token, hosts=["map/0", "sum/0"])
        m = ex.for_process("map/0")
        m.sent(3, new_token(), to="sum/1")
    """

    def __init__(self, agent: LocalAgent, process: str) -> None:
        self.agent = agent
        self.process_id = process

    def label_now(self) -> int:
        return self.agent.label_now()

    def sent(self, substream: Substream, token: int, to: str, label: int | None = None) -> None:
        self.agent.sent(substream, token, to, label, at=self.process_id)

    def received(self, substream: Substream, token: int, label: int | None = None) -> None:
        self.agent.received(substream, token, label, at=self.process_id)

    def promise(self, substream: Substream, label: int | None = None) -> None:
        self.agent.promise(substream, label, at=self.process_id)

    def on_end_of_substream(self, callback: Callable[[Substream], None]) -> None:
        self.agent.on_end_of_substream(callback, process=self.process_id)

    def wait(self, substream: Substream, timeout: float | None = None) -> bool:
        return self.agent.wait(substream, timeout, process=self.process_id)

    def ended(self, substream: Substream) -> bool:
        return self.agent.ended(substream, process=self.process_id)

    def flush(self) -> None:
        self.agent.flush()

    def close(self) -> None:
        """The executor's agent owns the connection: closing a view does nothing."""
