"""An in-process dataflow simulator: threads over queues, trAcker or punctuations.

Runs the RR-N workload of 004 section 5 (a source stage and N stages of
``parallelism`` processes; every stage repartitions round-robin to the next)
or a cyclic one (an iteration loop), with seeded random channel delays.
Channels are FIFO, as the punctuation scheme needs; delays differ per
channel, so elements and reports from different processes reorder.

What counts as one service message:

- ``punctuation``: one punctuation put on one data channel.
- ``tracker*``: one protobuf message over gRPC between an agent and the
  TrackerService: a report batch, a heartbeat, or one Notification pushed to
  an agent (it may carry several NEOSS). The one-time Hello of each agent is
  counted apart (``setup_messages``).

  - ``tracker``: an agent per process, every SND/RCV/PROMISE its own message.
  - ``tracker_agent``: an agent per process, XOR-aggregated for ``flush_interval``.
  - ``tracker_local``: a local agent per executor (partition ``j`` of every
    stage runs in executor ``j``, like the paper's VMs), XOR-aggregated for
    ``flush_interval``; one Notification carries the NEOSS of all its processes.

Example::

    r = simulate(Workload(stages=5, parallelism=4, elements=200, granularity=10),
                 "tracker_local", seed=1)
    r.service_messages, r.completed, r.violations
"""
from __future__ import annotations

import heapq
import itertools
import queue
import random
import threading
from dataclasses import dataclass, field

from beam_ext.clock import Clock, SystemClock
from beam_ext.watermark.agent import LocalAgent
from beam_ext.watermark.punctuation import PunctuationTracker
from beam_ext.watermark.service import TrackerService

MECHANISMS = ("punctuation", "tracker", "tracker_agent", "tracker_local")
_TOKEN = b"simulator-job"


@dataclass(frozen=True)
class Workload:
    """RR-N (``cyclic=False``) or source -> loop -> sink (``cyclic=True``).

    ``elements`` input elements; substream of element ``i`` is
    ``i // granularity``. In the cyclic workload each element makes a seeded
    random number (0..``max_passes``) of extra passes through the loop stage.
    """

    stages: int
    parallelism: int
    elements: int
    granularity: int
    cyclic: bool = False
    max_passes: int = 3
    rate: float | None = None  # input elements per second, None: as fast as possible

    def __post_init__(self) -> None:
        for name in ("stages", "parallelism", "elements", "granularity"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"Workload.{name} must be a positive int, got {v!r}")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"Workload.rate must be > 0 or None, got {self.rate!r}")

    @property
    def substreams(self) -> int:
        return -(-self.elements // self.granularity)

    def graph(self) -> dict[str, list[str]]:
        """process -> upstream processes."""
        P = self.parallelism
        g: dict[str, list[str]] = {f"src/{j}": [] for j in range(P)}
        if self.cyclic:
            loop = [f"loop/{j}" for j in range(P)]
            for j in range(P):
                g[f"loop/{j}"] = [f"src/{i}" for i in range(P)] + loop
            for j in range(P):
                g[f"sink/{j}"] = list(loop)
            return g
        prev = [f"src/{j}" for j in range(P)]
        for k in range(1, self.stages + 1):
            cur = [f"s{k}/{j}" for j in range(P)]
            for p in cur:
                g[p] = list(prev)
            prev = cur
        return g


@dataclass
class SimResult:
    mechanism: str
    workload: Workload
    completed: bool  # every non-source process saw every substream end
    stalled: bool  # all data done but some ends never came
    violations: int  # elements received after their substream ended there
    service_messages: int
    setup_messages: int
    message_breakdown: dict[str, int]
    latencies: list[float]  # last source promise -> end seen, per (process, substream)
    elapsed: float
    data_messages: int
    ends: int = 0
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        return self.workload.elements / self.elapsed if self.elapsed > 0 else float("inf")


class _Network:
    """Delivers messages after a random delay; FIFO per channel."""

    def __init__(self, rng: random.Random, delay: tuple[float, float], clock: Clock) -> None:
        self._rng = rng
        self._delay = delay
        self._clock = clock
        self._heap: list = []
        self._last: dict[tuple[str, str], float] = {}
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._stopped = False
        self.queues: dict[str, queue.SimpleQueue] = {}
        self._thread = threading.Thread(target=self._run, name="sim-network", daemon=True)
        self._thread.start()

    def send(self, src: str, dst: str, msg: tuple) -> None:
        lo, hi = self._delay
        if hi <= 0:
            self.queues[dst].put(msg)
            return
        with self._cond:
            at = self._clock.now() + self._rng.uniform(lo, hi)
            at = max(at, self._last.get((src, dst), 0.0))
            self._last[(src, dst)] = at
            heapq.heappush(self._heap, (at, next(self._seq), dst, msg))
            self._cond.notify()

    def _run(self) -> None:
        with self._cond:
            while not self._stopped:
                if not self._heap:
                    self._cond.wait()
                    continue
                wait = self._heap[0][0] - self._clock.now()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                _, _, dst, msg = heapq.heappop(self._heap)
                self.queues[dst].put(msg)

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()
        self._thread.join()


def simulate(
    workload: Workload,
    mechanism: str,
    seed: int = 0,
    *,
    delay: tuple[float, float] = (0.0, 0.001),
    flush_interval: float = 0.01,
    time_slack: float = 0.01,
    stall_grace: float = 1.0,
    timeout: float = 120.0,
    clock: Clock | None = None,
) -> SimResult:
    """Run ``workload`` with ``mechanism`` ('punctuation', 'tracker', 'tracker_local').

    See the module docstring for the three trAcker set-ups.
    Cost: one thread per process (plus two per agent with trAcker).
    """
    if mechanism not in MECHANISMS:
        raise ValueError(f"mechanism must be one of {MECHANISMS}, got {mechanism!r}")
    if len(delay) != 2 or not 0 <= delay[0] <= delay[1]:
        raise ValueError(f"delay must be (low, high) seconds with 0 <= low <= high, got {delay!r}")
    clock = clock or SystemClock()
    rng = random.Random(seed)
    graph = workload.graph()
    down = {p: [q for q, ups in graph.items() if p in ups] for p in graph}
    sources = [p for p, ups in graph.items() if not ups]
    targets = [p for p, ups in graph.items() if ups]
    K = workload.substreams
    net = _Network(random.Random(rng.getrandbits(64)), delay, clock)
    for p in graph:
        net.queues[p] = queue.SimpleQueue()

    lock = threading.Lock()
    ended_at: dict[str, dict[int, float]] = {p: {} for p in targets}
    promised_at: dict[int, float] = {}
    counters = {"violations": 0, "data": 0, "in_flight": 0, "punctuation": 0}
    all_done = threading.Event()
    data_done = threading.Event()
    remaining_ends = [len(targets) * K]

    def record_end(p: str, s: int) -> None:
        now = clock.now()
        with lock:
            if s in ended_at[p] or s >= K:
                return
            ended_at[p][s] = now
            remaining_ends[0] -= 1
            if remaining_ends[0] == 0:
                all_done.set()

    def in_flight(delta: int) -> None:
        with lock:
            counters["in_flight"] += delta
            if delta > 0:
                counters["data"] += delta
            if counters["in_flight"] == 0 and sources_done[0] == len(sources):
                data_done.set()

    sources_done = [0]
    svc = None
    agents: dict = {}
    owners: list[LocalAgent] = []
    puncts: dict[str, PunctuationTracker] = {}
    if mechanism == "punctuation":
        for p in graph:
            def send_punct(to: str, wm: int, p: str = p) -> None:
                with lock:
                    counters["punctuation"] += 1
                net.send(p, to, ("punct", p, wm))
            puncts[p] = PunctuationTracker(p, graph[p], down[p], send_punct)
    else:
        svc = TrackerService(token=_TOKEN).start()
        svc.register_graph(graph)
        interval = 0 if mechanism == "tracker" else flush_interval
        if mechanism == "tracker_local":
            executors: dict[str, list[str]] = {}
            for p in graph:
                executors.setdefault(p.rsplit("/", 1)[1], []).append(p)
            for j, hosted in sorted(executors.items()):
                ex = LocalAgent(svc.address, f"exec/{j}", _TOKEN, flush_interval=interval,
                                time_slack=time_slack, clock=clock, hosts=hosted)
                owners.append(ex)
                for p in hosted:
                    agents[p] = ex.for_process(p)
        else:
            for p in graph:
                agents[p] = LocalAgent(svc.address, p, _TOKEN, flush_interval=interval,
                                       time_slack=time_slack, clock=clock)
                owners.append(agents[p])
        for p in targets:
            agents[p].on_end_of_substream(lambda s, p=p: record_end(p, s))

    passes_rng = random.Random(rng.getrandbits(64))
    passes = [passes_rng.randint(0, workload.max_passes) if workload.cyclic else 0 for _ in range(workload.elements)]
    tok_rngs = {p: random.Random(rng.getrandbits(64)) for p in graph}

    def source(j: int, p: str) -> None:
        rr = itertools.cycle(down[p])
        tr = tok_rngs[p]
        P = len(sources)
        per_source_gap = (P / workload.rate) if workload.rate else 0.0
        ev = threading.Event()
        i = j
        for s in range(K):
            while i < workload.elements and i // workload.granularity == s:
                to = next(rr)
                label = agents[p].label_now() if agents else 0
                msg = ("data", s, tr.getrandbits(64), label, i, passes[i])
                in_flight(1)
                if agents:
                    agents[p].sent(s, msg[2], to=to, label=label)
                net.send(p, to, msg)
                i += P
                if per_source_gap:
                    ev.wait(per_source_gap)
            now = clock.now()
            with lock:
                promised_at[s] = max(promised_at.get(s, now), now)
            if agents:
                agents[p].promise(s)
            else:
                puncts[p].emit(s + 1)
        with lock:
            sources_done[0] += 1
        in_flight(0)

    def worker(p: str) -> None:
        q = net.queues[p]
        nexts = [d for d in down[p] if not d.startswith("sink/")] if workload.cyclic else down[p]
        sinks = [d for d in down[p] if d.startswith("sink/")]
        rr = itertools.cycle(nexts) if nexts else None
        rr_sink = itertools.cycle(sinks) if sinks else None
        tr = tok_rngs[p]
        agent = agents.get(p)
        while True:
            msg = q.get()
            if msg[0] == "stop":
                return
            if msg[0] == "punct":
                old = puncts[p].watermark
                new = puncts[p].on_punctuation(msg[1], msg[2])
                if new is not None:
                    for s in range(old, new):
                        record_end(p, s)
                continue
            _, s, tok, label, i, left = msg
            with lock:
                if s in ended_at[p]:
                    counters["violations"] += 1
            out = None
            if workload.cyclic and p.startswith("loop/"):
                out = (next(rr), left - 1) if left > 0 else (next(rr_sink), 0)
            elif rr is not None:
                out = (next(rr), 0)
            if out is not None:
                t2 = tr.getrandbits(64)
                in_flight(1)
                if agent:
                    agent.sent(s, t2, to=out[0], label=label)
                net.send(p, out[0], ("data", s, t2, label, i, out[1]))
            if agent:
                agent.received(s, tok, label=label)
            in_flight(-1)

    threads = [threading.Thread(target=worker, args=(p,), daemon=True) for p in targets]
    for t in threads:
        t.start()
    t0 = clock.now()
    src_threads = [threading.Thread(target=source, args=(j, p), daemon=True) for j, p in enumerate(sources)]
    for t in src_threads:
        t.start()
    while not all_done.is_set() and clock.now() - t0 < timeout:
        if data_done.is_set():
            # All data consumed: ends that stop coming for a grace period are a stall.
            with lock:
                before = remaining_ends[0]
            all_done.wait(stall_grace)
            with lock:
                if remaining_ends[0] == before:
                    break
            continue
        all_done.wait(0.02)
    elapsed = clock.now() - t0
    completed = all_done.is_set()
    stalled = not completed and data_done.is_set()
    breakdown: dict[str, int] = {}
    setup = 0
    if svc is not None:
        st = svc.stats()
        breakdown = {
            "reports": st["report_batches"],
            "heartbeats": st["heartbeats"],
            "notifications": st["notification_messages"],
        }
        setup = st["hello_calls"]
    else:
        breakdown = {"punctuations": counters["punctuation"]}
    for p in targets:
        net.queues[p].put(("stop",))
    for t in threads + src_threads:
        t.join(timeout=10)
    for a in owners:
        a.close()
    if svc is not None:
        svc.stop()
    net.stop()
    latencies = [
        ended_at[p][s] - promised_at[s]
        for p in targets
        for s in ended_at[p]
        if s in promised_at
    ]
    return SimResult(
        mechanism=mechanism,
        workload=workload,
        completed=completed,
        stalled=stalled,
        violations=counters["violations"],
        service_messages=sum(breakdown.values()),
        setup_messages=setup,
        message_breakdown=breakdown,
        latencies=latencies,
        elapsed=elapsed,
        data_messages=counters["data"],
        ends=sum(len(v) for v in ended_at.values()),
        extra={"latency_by_stage": _by_stage(ended_at, promised_at)},
    )


def _by_stage(ended_at: dict, promised_at: dict) -> dict[str, float]:
    """Median notification latency per stage (the part of a process id before '/')."""
    per: dict[str, list[float]] = {}
    for p, ends in ended_at.items():
        for s, t in ends.items():
            if s in promised_at:
                per.setdefault(p.split("/")[0], []).append(t - promised_at[s])
    return {k: sorted(v)[len(v) // 2] for k, v in per.items()}
