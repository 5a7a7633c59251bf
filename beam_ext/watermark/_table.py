"""The tracking agent's table (trAcker, 004 sections 3.1-4.2).

Per substream it keeps the XOR of the 64-bit tokens reported per segment
(a segment is the process the elements were sent to), the sources that
promised the substream, the smallest coarse time label, and which processes
were notified and acknowledged. A process ``p`` gets NEOSS(s) once every
source promised ``s`` and every segment upstream of ``p`` (``p`` included)
XORs to zero (lemma 4). With ``consistent_order`` the notifications of each
process are released in (label, substream) order (table 5).

A substream retires once every target acknowledged its NEOSS. Processes
declared lost are not waited for; a substream that cannot end without one
(a lost source did not promise it, or elements are in flight to a lost
process) is retired at once, *abandoned*: no NEOSS will be sent for it.
``max_open_substreams`` bounds the substreams open at once.

The table is pure logic: no clock, no I/O. ``TrackerService`` wraps it.
"""
from __future__ import annotations

import heapq
import json
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from beam_ext.errors import BeamExtError

Substream = int | bytes

_MAX_TOKEN = (1 << 64) - 1
_MIN_INT_ID = -(1 << 63)
_MAX_INT_ID = (1 << 63) - 1


def check_substream(value: object, name: str = "substream") -> Substream:
    """Return ``value`` if it is a valid substream id (int in int64 or bytes)."""
    if isinstance(value, bool) or not isinstance(value, (int, bytes)):
        raise TypeError(
            f"{name} must be an int or bytes, got {type(value).__name__}: {value!r}"
        )
    if isinstance(value, int) and not _MIN_INT_ID <= value <= _MAX_INT_ID:
        raise ValueError(f"{name} must fit in a signed 64-bit integer, got {value}")
    return value


def check_token(value: object, name: str = "token") -> int:
    """Return ``value`` if it is a 64-bit unsigned token."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}: {value!r}")
    if not 0 <= value <= _MAX_TOKEN:
        raise ValueError(f"{name} must be in [0, 2**64), got {value}")
    return value


def order_key(substream: Substream) -> tuple:
    """A total order over int and bytes ids (ints first), for tie-breaking."""
    if isinstance(substream, int):
        return (0, substream, b"")
    return (1, 0, substream)


class TableError(BeamExtError, ValueError):
    """A report the table refuses; nothing of the batch was applied."""


class TableFull(TableError):
    """A report that would open more substreams than ``max_open_substreams``."""


@dataclass
class _Entry:
    xor: dict[str, int] = field(default_factory=dict)  # segment -> non-zero XOR
    contrib: dict[str, dict[str, int]] = field(default_factory=dict)  # process -> segment -> XOR
    promised: set[str] = field(default_factory=set)
    label: int | None = None
    notified: set[str] = field(default_factory=set)
    acked: set[str] = field(default_factory=set)
    reporters: set[str] = field(default_factory=set)  # agents that reported on it

    def key(self, substream: Substream) -> tuple:
        # Substreams without a label sort after every labelled one.
        label = self.label if self.label is not None else _MAX_INT_ID
        return (label, order_key(substream))


@dataclass
class Batch:
    """One agent flush, decoded: the table's unit of atomic application.

    ``process`` is the reporting agent: a process of the graph, or an
    executor registered with ``register_agent``. Entries are
    ``(substream, sender, segment, xor)``; promises and acks are
    ``(substream, process)``. Shorter forms ``(substream, segment, xor)`` and
    a bare substream mean ``process`` itself.
    """

    process: str
    seq: int
    entries: list = field(default_factory=list)
    promises: list = field(default_factory=list)
    labels: list[tuple[Substream, int]] = field(default_factory=list)
    acks: list = field(default_factory=list)
    resync: bool = False
    retired: list[Substream] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.entries = [e if len(e) == 4 else (e[0], self.process, e[1], e[2]) for e in self.entries]
        self.promises = [x if isinstance(x, tuple) else (x, self.process) for x in self.promises]
        self.acks = [x if isinstance(x, tuple) else (x, self.process) for x in self.acks]


@dataclass
class ApplyResult:
    status: str  # "applied", "duplicate" or "buffered"
    notifications: dict[str, list[Substream]] = field(default_factory=dict)
    late_reports: int = 0
    abandoned: list[Substream] = field(default_factory=list)  # retired before all were notified


class TrackerTable:
    """In-flight XORs per (substream, segment) and the NEOSS decisions.

    Cost: applying a batch is O(entries + |targets|) plus O(|W_p|) per
    readiness check of a promised substream.

    >>> t = TrackerTable()
    >>> t.register_graph({"src": [], "sink": ["src"]})
    >>> t.apply(Batch("src", 1, entries=[(7, "sink", 5)], promises=[7])).notifications
    {}
    >>> t.apply(Batch("sink", 1, entries=[(7, "sink", 5)])).notifications
    {'sink': [7]}
    """

    def __init__(self, consistent_order: bool = True, max_open_substreams: int | None = None) -> None:
        if max_open_substreams is not None and (
            isinstance(max_open_substreams, bool)
            or not isinstance(max_open_substreams, int)
            or max_open_substreams < 1
        ):
            raise ValueError(f"max_open_substreams must be an int >= 1 or None, got {max_open_substreams!r}")
        self.consistent_order = bool(consistent_order)
        self.max_open_substreams = max_open_substreams
        self._upstream: dict[str, frozenset[str]] = {}
        self._sources: frozenset[str] = frozenset()
        self._targets: tuple[str, ...] = ()
        self._watch: dict[str, frozenset[str]] = {}  # p -> segments upstream of p, p included
        self._entries: dict[Substream, _Entry] = {}
        self._retired: set[Substream] = set()
        # Retired before every target was notified: who had been, for notified().
        self._abandoned: dict[Substream, frozenset[str]] = {}
        self._abandoned_now: list[Substream] = []  # by the current apply() or set_lost()
        self._lost: frozenset[str] = frozenset()
        self._live_targets: frozenset[str] = frozenset()
        self._last_seq: dict[str, int] = {}
        self._buffered: dict[str, dict[int, Batch]] = {}
        self._heaps: dict[str, list[tuple[tuple, Substream]]] = {}
        self._retire_outbox: dict[str, list[Substream]] = {}
        self._agents: dict[str, frozenset[str]] = {}  # executor agent -> hosted processes
        self._target_set: frozenset[str] = frozenset()
        self._reach: dict[str, frozenset[str]] = {}
        self.late_reports = 0
        self.duplicates = 0

    # -- graph ---------------------------------------------------------------
    @property
    def graph(self) -> dict[str, list[str]]:
        return {p: sorted(up) for p, up in self._upstream.items()}

    @property
    def sources(self) -> frozenset[str]:
        return self._sources

    def register_graph(self, graph: Mapping[str, Sequence[str]]) -> None:
        """Set the process graph (process -> its upstream processes), once."""
        if not isinstance(graph, Mapping) or not graph:
            raise ValueError(f"graph must be a non-empty mapping process -> upstream list, got {graph!r}")
        upstream: dict[str, frozenset[str]] = {}
        for proc, ups in graph.items():
            if not isinstance(proc, str) or not proc:
                raise ValueError(f"graph: process ids must be non-empty strings, got {proc!r}")
            if isinstance(ups, (str, bytes)) or not isinstance(ups, Iterable):
                raise ValueError(f"graph[{proc!r}] must be a list of upstream process ids, got {ups!r}")
            ups = list(ups)
            for u in ups:
                if u not in graph:
                    raise ValueError(f"graph[{proc!r}] names upstream {u!r}, which is not a process of the graph")
            upstream[proc] = frozenset(ups)
        if self._upstream:
            if upstream != self._upstream:
                raise ValueError("a different graph is already registered; the graph cannot change")
            return
        sources = frozenset(p for p, ups in upstream.items() if not ups)
        if not sources:
            raise ValueError("graph has no source (a process with no upstream), so no substream can ever end")
        self._upstream = upstream
        self._sources = sources
        self._targets = tuple(sorted(p for p in upstream if p not in sources))
        self._target_set = frozenset(self._targets)
        self._live_targets = self._target_set - self._lost
        self._watch = {p: self._closure(p) for p in upstream}
        # segment -> targets that watch it: a non-zero segment blocks exactly these.
        reach: dict[str, set[str]] = {p: set() for p in upstream}
        for t in self._targets:
            for seg in self._watch[t]:
                reach[seg].add(t)
        self._reach = {seg: frozenset(ts) for seg, ts in reach.items()}
        for p in upstream:
            self._heaps.setdefault(p, [])

    def register_agent(self, agent: str, hosts: Sequence[str]) -> None:
        """Let ``agent`` report for the graph processes ``hosts``."""
        if not isinstance(agent, str) or not agent:
            raise ValueError(f"agent id must be a non-empty string, got {agent!r}")
        hosts = frozenset(hosts)
        if self._upstream:
            unknown = sorted(h for h in hosts if h not in self._upstream)
            if unknown:
                raise TableError(f"agent {agent!r} hosts {unknown}, which are not in the registered graph")
        self._agents[agent] = hosts

    def hosts_of(self, agent: str) -> frozenset[str]:
        """The processes ``agent`` reports for."""
        hosts = self._agents.get(agent)
        if hosts is not None:
            return hosts
        if agent in self._upstream:
            return frozenset((agent,))
        raise TableError(f"process {agent!r} is not in the registered graph")

    def _closure(self, proc: str) -> frozenset[str]:
        seen = {proc}
        stack = [proc]
        while stack:
            for u in self._upstream[stack.pop()]:
                if u not in seen:
                    seen.add(u)
                    stack.append(u)
        return frozenset(seen)

    # -- reports -------------------------------------------------------------
    def apply(self, batch: Batch) -> ApplyResult:
        """Apply one flush of ``batch.process``, in sequence order.

        A batch whose ``seq`` was already applied is a duplicate and is
        ignored; one that arrives ahead of a gap is held until the gap fills.
        """
        self._validate(batch)
        p = batch.process
        notes: dict[str, list[Substream]] = {}
        late_before = self.late_reports
        self._abandoned_now = []
        if batch.resync:
            self._check_capacity([batch])
            for seq in [s for s in self._buffered.get(p, {}) if s <= batch.seq]:
                del self._buffered[p][seq]
            touched = self._apply_resync(batch)
            self._last_seq[p] = max(self._last_seq.get(p, 0), batch.seq)
            self._release(touched, notes)
        else:
            last = self._last_seq.get(p, 0)
            if batch.seq <= last or batch.seq in self._buffered.get(p, {}):
                self.duplicates += 1
                return ApplyResult("duplicate")
            if batch.seq > last + 1:
                self._buffered.setdefault(p, {})[batch.seq] = batch
                return ApplyResult("buffered")
            # The batch releases the held ones that follow it: all fit, or none is applied.
            held = self._buffered.get(p, {})
            chain = [batch]
            while chain[-1].seq + 1 in held:
                chain.append(held[chain[-1].seq + 1])
            self._check_capacity(chain)
            touched: set[Substream] = set()
            for b in chain:
                held.pop(b.seq, None)
                touched |= self._apply_delta(b)
                self._last_seq[p] = b.seq
            self._release(touched, notes)
        self._compact_heaps()
        return ApplyResult("applied", notes, self.late_reports - late_before, self._abandoned_now)

    def _check_capacity(self, batches: list[Batch]) -> None:
        """Raise TableFull if applying ``batches`` would exceed the bound."""
        limit = self.max_open_substreams
        if limit is None:
            return
        closing: set[Substream] = set()
        new: set[Substream] = set()
        for b in batches:
            if b.resync:
                closing.update(s for s in b.retired if s in self._entries)
            for s in (*(e[0] for e in b.entries), *(x[0] for x in b.promises), *(x[0] for x in b.labels)):
                if s not in self._entries and s not in self._retired:
                    new.add(s)
        open_now = len(self._entries)
        if new and open_now - len(closing) + len(new) > limit:
            example = sorted(new, key=order_key)[:3]
            raise TableFull(
                f"{open_now} substreams are open and this report of {batches[0].process!r} would open "
                f"{len(new)} more (e.g. {example}), over max_open_substreams={limit}. A substream stays "
                f"open until every source promised it and every target acknowledged its end: look for a "
                f"source that never promises, or raise max_open_substreams"
            )

    def _validate(self, batch: Batch) -> None:
        p = batch.process
        if not self._upstream:
            raise TableError("no graph is registered yet: call TrackerService.register_graph first")
        hosts = self.hosts_of(p)
        if not isinstance(batch.seq, int) or batch.seq < 0:
            raise TableError(f"batch seq must be a non-negative int, got {batch.seq!r}")
        for s, sender, seg, x in batch.entries:
            check_substream(s)
            check_token(x, "xor")
            if sender not in hosts:
                raise TableError(f"agent {p!r} reported for {sender!r}, which it does not host")
            if seg not in self._upstream:
                raise TableError(f"process {sender!r} reported sending to {seg!r}, which is not in the graph")
            if seg != sender and sender not in self._upstream[seg]:
                raise TableError(
                    f"process {sender!r} reported sending to {seg!r}, but {sender!r} is not upstream of "
                    f"{seg!r} in the registered graph"
                )
        for s, src in batch.promises:
            check_substream(s)
            if src not in hosts:
                raise TableError(f"agent {p!r} promised for {src!r}, which it does not host")
            if src not in self._sources:
                raise TableError(
                    f"process {src!r} promised a substream but is not a source (it has upstream processes)"
                )
        for _s, proc in batch.acks:
            if proc not in hosts:
                raise TableError(f"agent {p!r} acknowledged for {proc!r}, which it does not host")
        for s, label in batch.labels:
            check_substream(s)
            if not isinstance(label, int):
                raise TableError(f"label of substream {s!r} must be an int, got {label!r}")

    def _entry(self, s: Substream) -> _Entry:
        e = self._entries.get(s)
        if e is None:
            e = self._entries[s] = _Entry()
            if self.consistent_order:
                k = e.key(s)
                for t in self._targets:
                    heapq.heappush(self._heaps[t], (k, s))
        return e

    def _xor_into(self, e: _Entry, proc: str, seg: str, x: int) -> None:
        if not x:
            return
        v = e.xor.get(seg, 0) ^ x
        if v:
            e.xor[seg] = v
        else:
            e.xor.pop(seg, None)
        c = e.contrib.setdefault(proc, {})
        v = c.get(seg, 0) ^ x
        if v:
            c[seg] = v
        else:
            c.pop(seg, None)
            if not c:
                del e.contrib[proc]

    def _set_label(self, e: _Entry, s: Substream, label: int) -> None:
        if e.label is not None and e.label <= label:
            return
        e.label = label
        if self.consistent_order:
            k = e.key(s)
            for t in self._targets:
                if t not in e.notified:
                    heapq.heappush(self._heaps[t], (k, s))

    def _apply_delta(self, batch: Batch) -> set[Substream]:
        p = batch.process
        touched: set[Substream] = set()
        for s, label in batch.labels:
            if s not in self._retired:
                self._set_label(self._entry(s), s, label)
        for s, sender, seg, x in batch.entries:
            if s in self._retired:
                self.late_reports += 1
                continue
            e = self._entry(s)
            if seg != sender and seg in e.notified:
                # An element sent to a process already told the substream ended.
                self.late_reports += 1
            self._xor_into(e, p, seg, x)
            e.reporters.add(p)
            touched.add(s)
        self._apply_promises(batch, touched)
        self._apply_acks(batch, touched)
        return touched

    def _apply_promises(self, batch: Batch, touched: set[Substream]) -> None:
        for s, src in batch.promises:
            if s not in self._retired:
                e = self._entry(s)
                e.promised.add(src)
                e.reporters.add(batch.process)
                touched.add(s)

    def _apply_acks(self, batch: Batch, touched: set[Substream]) -> None:
        for s, proc in batch.acks:
            e = self._entries.get(s)
            if e is not None and proc in e.notified:
                e.acked.add(proc)
                touched.add(s)

    def _apply_resync(self, batch: Batch) -> set[Substream]:
        """Replace everything ``batch.process`` ever reported with its full state."""
        p = batch.process
        touched: set[Substream] = set()
        for s in batch.retired:
            # Retired by an earlier incarnation: every process had acknowledged it.
            if s in self._entries:
                self._retire(s)
        wanted: dict[Substream, dict[str, int]] = {}
        for s, _sender, seg, x in batch.entries:
            if s in self._retired:
                continue
            d = wanted.setdefault(s, {})
            d[seg] = d.get(seg, 0) ^ x
        for s, e in list(self._entries.items()):
            if p in e.contrib and s not in wanted:
                wanted[s] = {}
        for s, segs in wanted.items():
            e = self._entry(s)
            old = dict(e.contrib.get(p, {}))
            for seg in set(old) | set(segs):
                self._xor_into(e, p, seg, old.get(seg, 0) ^ segs.get(seg, 0))
            e.reporters.add(p)
            touched.add(s)
        for s, label in batch.labels:
            if s not in self._retired:
                self._set_label(self._entry(s), s, label)
        self._apply_promises(batch, touched)
        self._apply_acks(batch, touched)
        return touched

    # -- decisions -----------------------------------------------------------
    def _ready(self, e: _Entry, proc: str) -> bool:
        return len(e.promised) == len(self._sources) and e.xor.keys().isdisjoint(self._watch[proc])

    def _release(self, touched: set[Substream], notes: dict[str, list[Substream]]) -> None:
        n_sources = len(self._sources)
        for s in touched:
            e = self._entries.get(s)
            if e is None or len(e.promised) != n_sources or len(e.notified) == len(self._targets):
                continue
            blocked: set[str] = set()
            for seg in e.xor:
                blocked |= self._reach[seg]
            ready = self._target_set - e.notified - blocked
            if self.consistent_order:
                for t in sorted(ready):
                    self._release_in_order(t, notes)
            else:
                for t in sorted(ready):
                    e.notified.add(t)
                    notes.setdefault(t, []).append(s)
        for s in touched:
            e = self._entries.get(s)
            if e is not None and self._done(e):
                self._retire(s)

    def _done(self, e: _Entry) -> bool:
        """Every source promised and every live target acknowledged."""
        return len(e.promised) == len(self._sources) and self._live_targets <= e.acked

    def _blocked_by_lost(self, e: _Entry) -> bool:
        """A lost source has not promised, or elements are in flight to a lost process."""
        return not (self._lost & self._sources <= e.promised) or not self._lost.isdisjoint(e.xor)

    def _release_in_order(self, t: str, notes: dict[str, list[Substream]]) -> None:
        heap = self._heaps[t]
        while heap:
            k, s = heap[0]
            e = self._entries.get(s)
            if e is None or t in e.notified or e.key(s) != k:
                heapq.heappop(heap)  # stale: retired, done, or re-keyed
                continue
            if not self._ready(e, t):
                return
            heapq.heappop(heap)
            e.notified.add(t)
            notes.setdefault(t, []).append(s)

    def _retire(self, s: Substream) -> None:
        e = self._entries.pop(s)
        self._retired.add(s)
        if len(e.notified) < len(self._targets):
            self._abandoned[s] = frozenset(e.notified)
            self._abandoned_now.append(s)
        for agent in e.reporters:
            self._retire_outbox.setdefault(agent, []).append(s)

    def _compact_heaps(self) -> None:
        """Rebuild a target's order heap once stale rows (retired or re-keyed
        substreams) outnumber the open ones, so memory follows the open count."""
        if not self.consistent_order:
            return
        limit = 2 * len(self._entries) + 64
        for t in self._targets:
            if len(self._heaps[t]) > limit:
                rows = [(e.key(s), s) for s, e in self._entries.items() if t not in e.notified]
                heapq.heapify(rows)
                self._heaps[t] = rows

    # -- lost processes ----------------------------------------------------------
    def set_lost(self, processes: Iterable[str]) -> list[Substream]:
        """Declare the graph processes now lost (replacing the previous set).

        Their acknowledgements are no longer awaited, and every open substream
        that cannot end without one of them (a lost source has not promised it,
        or elements are in flight to a lost process) is retired. Returns the
        substreams retired before every target was notified (*abandoned*: no
        NEOSS will be sent for them), in id order. Cost: O(open substreams).
        """
        lost = frozenset(processes)
        unknown = sorted(p for p in lost if p not in self._upstream)
        if unknown:
            raise TableError(f"lost processes {unknown} are not in the registered graph")
        self._lost = lost
        self._live_targets = self._target_set - lost
        self._abandoned_now = []
        if lost:
            for s, e in list(self._entries.items()):
                if self._blocked_by_lost(e) or self._done(e):
                    self._retire(s)
            self._compact_heaps()
        return sorted(self._abandoned_now, key=order_key)

    @property
    def lost(self) -> frozenset[str]:
        """The graph processes last declared lost."""
        return self._lost

    def take_retired(self, process: str) -> list[Substream]:
        """Substreams retired since the last call that ``process`` reported on."""
        out = self._retire_outbox.get(process, [])
        self._retire_outbox[process] = []
        return out

    def unacked_for(self, agent: str) -> list[tuple[str, Substream]]:
        """(process, substream) NEOSS decided for ``agent``'s processes, not acknowledged, in order."""
        hosts = self.hosts_of(agent)
        rows = [
            (e.key(s), p, s)
            for s, e in self._entries.items()
            for p in hosts
            if p in e.notified and p not in e.acked
        ]
        return [(p, s) for _, p, s in sorted(rows)]

    def open_substreams(self) -> list[Substream]:
        return sorted(self._entries, key=order_key)

    @property
    def open_count(self) -> int:
        """How many substreams are open (O(1))."""
        return len(self._entries)

    @property
    def abandoned_count(self) -> int:
        """How many substreams were retired before every target was notified."""
        return len(self._abandoned)

    def is_retired(self, s: Substream) -> bool:
        return s in self._retired

    def is_abandoned(self, s: Substream) -> bool:
        """Whether ``s`` was retired before every target was notified."""
        return s in self._abandoned

    def notified(self, s: Substream) -> set[str]:
        """Processes told that ``s`` ended (all targets once retired, unless abandoned)."""
        if s in self._abandoned:
            return set(self._abandoned[s])
        if s in self._retired:
            return set(self._targets)
        e = self._entries.get(s)
        return set(e.notified) if e else set()

    def waiting_on(self, s: Substream) -> dict[str, object]:
        """Why ``s`` has not ended everywhere: missing promises, busy segments."""
        e = self._entries.get(s)
        if e is None:
            return {}
        return {
            "missing_promises": sorted(self._sources - e.promised),
            "segments_in_flight": sorted(e.xor),
            "not_notified": sorted(set(self._targets) - e.notified),
        }

    # -- persistence -----------------------------------------------------------
    def snapshot(self) -> bytes:
        """Everything needed to resume; buffered out-of-order batches excepted
        (their agents resend them after the restart)."""
        def enc(s: Substream) -> list:
            return ["i", s] if isinstance(s, int) else ["b", s.hex()]

        doc = {
            "version": 1,
            "consistent_order": self.consistent_order,
            "graph": self.graph if self._upstream else None,
            "last_seq": self._last_seq,
            "retired": [enc(s) for s in self._retired],
            "abandoned": [[enc(s), sorted(n)] for s, n in self._abandoned.items()],
            "late_reports": self.late_reports,
            "duplicates": self.duplicates,
            "entries": [
                {
                    "s": enc(s),
                    "contrib": {p: {seg: x for seg, x in c.items()} for p, c in e.contrib.items()},
                    "promised": sorted(e.promised),
                    "label": e.label,
                    "notified": sorted(e.notified),
                    "acked": sorted(e.acked),
                    "reporters": sorted(e.reporters),
                }
                for s, e in self._entries.items()
            ],
            "retire_outbox": {p: [enc(s) for s in v] for p, v in self._retire_outbox.items()},
            "agents": {a: sorted(h) for a, h in self._agents.items()},
        }
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def restore(cls, data: bytes, max_open_substreams: int | None = None) -> TrackerTable:
        """Rebuild a table from ``snapshot()``; no process is lost in it.

        The bound is not part of the snapshot: a table restored over a smaller
        one keeps its open substreams and refuses only new ones.
        """
        try:
            doc = json.loads(data)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"restore_from is not a tracker snapshot: {exc}") from None
        if not isinstance(doc, dict) or doc.get("version") != 1:
            raise ValueError("restore_from is not a version-1 tracker snapshot")

        def dec(v: list) -> Substream:
            return v[1] if v[0] == "i" else bytes.fromhex(v[1])

        t = cls(consistent_order=doc["consistent_order"], max_open_substreams=max_open_substreams)
        if doc["graph"] is not None:
            t.register_graph(doc["graph"])
        t._last_seq.update({p: int(v) for p, v in doc["last_seq"].items()})
        t._retired = {dec(v) for v in doc["retired"]}
        t._abandoned = {dec(v): frozenset(n) for v, n in doc.get("abandoned", [])}
        t.late_reports = doc["late_reports"]
        t.duplicates = doc["duplicates"]
        for row in doc["entries"]:
            s = dec(row["s"])
            e = t._entry(s)
            for p, c in row["contrib"].items():
                for seg, x in c.items():
                    t._xor_into(e, p, seg, x)
            e.promised = set(row["promised"])
            if row["label"] is not None:
                t._set_label(e, s, row["label"])
            e.notified = set(row["notified"])
            e.acked = set(row["acked"])
            e.reporters = set(row["reporters"])
        t._agents = {a: frozenset(h) for a, h in doc["agents"].items()}
        for p, v in doc["retire_outbox"].items():
            t._retire_outbox[p] = [dec(x) for x in v]
        t._check()
        return t

    # -- invariants ------------------------------------------------------------
    def _check(self) -> None:
        """Assert every invariant of the table (for tests)."""
        procs = set(self._upstream)
        targets = set(self._targets)
        assert self._sources == {p for p, u in self._upstream.items() if not u}
        assert targets == procs - self._sources
        assert not (self._retired & set(self._entries))
        assert self._abandoned.keys() <= self._retired
        assert all(n < self._target_set for n in self._abandoned.values())
        assert self._lost <= procs and self._live_targets == self._target_set - self._lost
        for s, e in self._entries.items():
            recomputed: dict[str, int] = {}
            for p, c in e.contrib.items():
                assert p in procs and c, (s, p)
                for seg, x in c.items():
                    assert seg in procs and 0 < x <= _MAX_TOKEN, (s, p, seg)
                    recomputed[seg] = recomputed.get(seg, 0) ^ x
            assert {k: v for k, v in recomputed.items() if v} == e.xor, s
            assert all(e.xor.values())
            assert e.promised <= self._sources, s
            assert e.notified <= targets, s
            assert e.acked <= e.notified, s
            assert set(e.contrib) <= e.reporters, s
            assert not self._done(e), s  # done substreams retire at once
            if self.consistent_order:
                for t in targets - e.notified:
                    assert (e.key(s), s) in self._heaps[t], (s, t)
        if self.consistent_order:
            assert all(len(h) <= 2 * len(self._entries) + 64 for h in self._heaps.values())
        for p, buf in self._buffered.items():
            assert all(seq > self._last_seq.get(p, 0) + 1 for seq in buf), p
