"""The tracker table against a brute-force model, under seeded random actions."""
import random

import pytest

from beam_ext.watermark._table import Batch, TableError, TableFull, TrackerTable

GRAPH = {
    "src/0": [],
    "src/1": [],
    "a/0": ["src/0", "src/1"],
    "a/1": ["src/0", "src/1"],
    "b/0": ["a/0", "a/1", "b/0"],  # an iteration loop
}
DOWN = {p: [q for q, ups in GRAPH.items() if p in ups] for p in GRAPH}
SOURCES = ["src/0", "src/1"]
TARGETS = ["a/0", "a/1", "b/0"]


def _closure(p):
    seen, stack = {p}, [p]
    while stack:
        for u in GRAPH[stack.pop()]:
            if u not in seen:
                seen.add(u)
                stack.append(u)
    return seen


class Model:
    """Which elements are really in flight, and so which NEOSS are allowed;
    which substreams are open, and which the table may retire."""

    def __init__(self):
        self.in_flight = []  # (substream, destination, token)
        self.promised = {}  # substream -> set of sources
        self.acked = {}  # substream -> targets that acknowledged its NEOSS
        self.open = set()
        self.retired = set()
        self.lost = set()

    def ready(self, t, s):
        if set(self.promised.get(s, ())) != set(SOURCES):
            return False
        up = _closure(t)
        return not any(ss == s and dest in up for ss, dest, _ in self.in_flight)

    def new_ids(self, batch):
        ids = {e[0] for e in batch.entries} | {x[0] for x in batch.promises}
        ids |= {x[0] for x in batch.labels}
        return ids - self.open - self.retired

    def done(self, s):
        live = set(TARGETS) - self.lost
        return self.promised.get(s, set()) >= set(SOURCES) and live <= self.acked.get(s, set())

    def blocked(self, s):
        if any(src in self.lost and src not in self.promised.get(s, ()) for src in SOURCES):
            return True
        return any(ss == s and dest in self.lost for ss, dest, _ in self.in_flight)

    def retire(self, which):
        for s in sorted(self.open, key=str):
            if which(s):
                self.open.discard(s)
                self.retired.add(s)


def _run(seed, consistent_order, max_open=None, lose=False, substreams=(0, 1, 2, b"k")):
    rng = random.Random(seed)
    table = TrackerTable(consistent_order=consistent_order, max_open_substreams=max_open)
    table.register_graph(GRAPH)
    model = Model()
    seq = dict.fromkeys(GRAPH, 0)
    substreams = list(substreams)
    last_batch = None
    refusals = abandoned = 0

    def send(batch, new=frozenset()):
        """Apply ``batch``; False if the bound refused it (nothing of it applied)."""
        nonlocal last_batch, refusals
        if max_open is not None and new and len(model.open) + len(new) > max_open:
            before = table.snapshot()
            with pytest.raises(TableFull, match=f"max_open_substreams={max_open}"):
                table.apply(batch)
            assert table.snapshot() == before
            seq[batch.process] -= 1  # an agent resends the same numbers
            refusals += 1
            return False
        res = table.apply(batch)
        assert res.status == "applied"
        # Only a lost target (held back by the order) can be left unnotified by an apply.
        assert all(table.is_abandoned(s) and s in model.open for s in res.abandoned)
        assert model.lost or not res.abandoned
        model.open |= new
        last_batch = batch
        if consistent_order:
            # Released in key order: nothing known with a smaller key is still unreleased.
            for t, ended in res.notifications.items():
                for s in ended:
                    k = (table._entries[s].key(s) if s in table._entries else None)
                    for s2, e2 in table._entries.items():
                        if k is not None and e2.key(s2) < k:
                            assert t in e2.notified, (seed, t, s, s2)
        return True

    def next_batch(p, **kw):
        seq[p] += 1
        return Batch(p, seq[p], **kw)

    for step in range(300):
        action = rng.random()
        if action < 0.3:
            src = rng.choice(SOURCES)
            s = rng.choice(substreams)
            if src in model.promised.get(s, ()):
                continue
            dest = rng.choice(DOWN[src])
            tok = rng.getrandbits(64) | 1
            batch = next_batch(src, entries=[(s, dest, tok)], labels=[(s, step)])
            if send(batch, model.new_ids(batch)):
                model.in_flight.append((s, dest, tok))
        elif action < 0.6 and model.in_flight:
            s, q, tok = model.in_flight.pop(rng.randrange(len(model.in_flight)))
            outs = []
            # Loops stop with probability 1/2 per pass, so substreams end.
            for _ in range(rng.choice([0, 0, 1, 2]) if q != "b/0" else rng.choice([0, 1])):
                if DOWN[q]:
                    d = rng.choice(DOWN[q])
                    t = rng.getrandbits(64) | 1
                    outs.append((s, d, t))
            model.in_flight.extend(outs)
            # An element in flight belongs to an open or retired substream: this opens nothing.
            if rng.random() < 0.5:
                send(next_batch(q, entries=outs + [(s, q, tok)]))
            else:
                # SND and RCV in two flushes, the second arriving first.
                b1 = next_batch(q, entries=outs)
                b2 = next_batch(q, entries=[(s, q, tok)])
                assert table.apply(b2).status == "buffered"
                table._check()
                send(b1)
        elif action < 0.75:
            src = rng.choice(SOURCES)
            s = rng.choice(substreams)
            batch = next_batch(src, promises=[s])
            if send(batch, model.new_ids(batch)):
                model.promised.setdefault(s, set()).add(src)
        elif action < 0.85:
            t = rng.choice(TARGETS)
            acks = [s for s in substreams if t in table.notified(s) and not table.is_retired(s)]
            send(next_batch(t, acks=acks))
            for s in acks:
                model.acked.setdefault(s, set()).add(t)
        elif action < 0.92 and last_batch is not None:
            assert table.apply(last_batch).status == "duplicate"
        elif lose and action < 0.96:
            # Lost processes may still report afterwards, as a slow one would.
            model.lost = set(rng.sample(sorted(GRAPH), rng.choice([0, 1, 1, 2])))
            before = {s: table.notified(s) for s in model.open}
            got = table.set_lost(model.lost)
            expected = {s for s in model.open if model.blocked(s) or model.done(s)}
            # Abandoned: retired before every target was told it ended.
            expected_abandoned = {s for s in expected if before[s] != set(TARGETS)}
            assert set(got) == expected_abandoned, (seed, step, got, expected)
            assert all(table.is_abandoned(s) for s in got)
            model.retire(expected.__contains__)
            abandoned += len(got)
        else:
            table = TrackerTable.restore(table.snapshot(), max_open_substreams=max_open)
            model.lost = set()  # who is lost is the service's knowledge, not the table's
        model.retire(model.done)
        table._check()
        assert set(table.open_substreams()) == model.open, (seed, step)
        assert max_open is None or len(model.open) <= max_open
        for s in substreams:
            notified = table.notified(s)
            for t in TARGETS:
                if consistent_order or table.is_abandoned(s):
                    # Order may hold a ready substream back, never release an unready one;
                    # an abandoned substream is never released again.
                    assert t not in notified or model.ready(t, s), (seed, step, t, s)
                else:
                    assert (t in notified) == model.ready(t, s), (seed, step, t, s)
    return refusals, abandoned


@pytest.mark.parametrize("seed", range(12))
def test_random_actions_match_model(seed):
    _run(seed, consistent_order=False)


@pytest.mark.parametrize("seed", range(6))
def test_random_actions_consistent_order(seed):
    _run(seed, consistent_order=True)


@pytest.mark.parametrize("seed", range(8))
def test_random_actions_with_lost_processes_and_a_bound(seed):
    refusals, abandoned = _run(seed, consistent_order=seed % 2 == 0, max_open=3, lose=True,
                               substreams=(0, 1, 2, 3, 4, b"k"))
    assert refusals and abandoned  # both paths were taken


def test_neoss_waits_for_segments_upstream_only():
    t = TrackerTable(consistent_order=False)
    t.register_graph({"s": [], "x": ["s"], "y": ["s"], "z": ["x"]})
    t.apply(Batch("s", 1, entries=[(1, "x", 9)], promises=[1]))
    # y is not downstream of x's in-flight element: it ends at once.
    res = t.apply(Batch("y", 1))
    assert t.notified(1) == {"y"}
    res = t.apply(Batch("x", 1, entries=[(1, "z", 4), (1, "x", 9)]))
    assert res.notifications == {"x": [1]}
    res = t.apply(Batch("z", 1, entries=[(1, "z", 4)]))
    assert res.notifications == {"z": [1]}


def test_bad_reports_are_refused_whole():
    t = TrackerTable()
    with pytest.raises(TableError, match="no graph"):
        t.apply(Batch("s", 1))
    t.register_graph({"s": [], "x": ["s"]})
    with pytest.raises(TableError, match="not upstream"):
        t.apply(Batch("x", 1, entries=[(1, "s", 3)]))
    with pytest.raises(TableError, match="not a source"):
        t.apply(Batch("x", 1, promises=[1]))
    with pytest.raises(TableError, match="not in the registered graph"):
        t.apply(Batch("ghost", 1))
    with pytest.raises(ValueError, match="upstream 'nope'"):
        TrackerTable().register_graph({"a": ["nope"]})
    with pytest.raises(ValueError, match="no source"):
        TrackerTable().register_graph({"a": ["a"]})
    with pytest.raises(TypeError, match="substream"):
        t.apply(Batch("s", 1, promises=[True]))
    assert t._last_seq.get("s", 0) == 0
    t._check()


# -- bound on open substreams ------------------------------------------------------

CHAIN = {"s": [], "x": ["s"]}


def _chain_table(**kw):
    t = TrackerTable(**kw)
    t.register_graph(CHAIN)
    return t


def test_bound_refuses_a_batch_that_opens_too_many_substreams_whole():
    t = _chain_table(max_open_substreams=2)
    t.apply(Batch("s", 1, entries=[(0, "x", 5)]))
    before = t.snapshot()
    with pytest.raises(TableFull, match=r"'s' would open 2 more .*max_open_substreams=2"):
        t.apply(Batch("s", 2, entries=[(1, "x", 6), (2, "x", 7), (0, "x", 9)]))
    assert t.snapshot() == before  # nothing applied, not even the entry on the open 0
    assert t.open_count == 1
    # Reports on open substreams and one new one fit.
    t.apply(Batch("s", 2, entries=[(0, "x", 9), (1, "x", 6)]))
    assert t.open_substreams() == [0, 1]
    with pytest.raises(TableFull):
        t.apply(Batch("s", 3, labels=[(2, 10)]))  # a label alone opens a substream too
    with pytest.raises(TableFull):
        t.apply(Batch("s", 3, promises=[2]))
    # Once 0 ends and is acknowledged there is room again.
    t.apply(Batch("s", 3, promises=[0]))
    t.apply(Batch("x", 1, entries=[(0, "x", 5 ^ 9)]))
    t.apply(Batch("x", 2, acks=[0]))
    assert t.is_retired(0)
    t.apply(Batch("s", 4, promises=[2]))
    assert t.open_substreams() == [1, 2]
    t._check()


def test_bound_counts_the_buffered_batches_a_report_releases():
    t = _chain_table(max_open_substreams=2)
    assert t.apply(Batch("s", 2, entries=[(1, "x", 3)])).status == "buffered"
    assert t.apply(Batch("s", 3, entries=[(2, "x", 3)])).status == "buffered"
    with pytest.raises(TableFull, match="would open 3 more"):
        t.apply(Batch("s", 1, entries=[(0, "x", 3)]))
    assert t.open_count == 0 and t._last_seq.get("s", 0) == 0
    t._check()


def test_bound_is_checked_for_a_resync():
    t = _chain_table(max_open_substreams=1)
    t.apply(Batch("s", 1, entries=[(0, "x", 5)]))
    with pytest.raises(TableFull):
        t.apply(Batch("s", 2, entries=[(0, "x", 5), (1, "x", 6)], resync=True))
    # Resynced state that replaces what s reported on 0 by what it reports on 1 still opens 1.
    with pytest.raises(TableFull):
        t.apply(Batch("s", 2, entries=[(1, "x", 6)], resync=True))
    t.apply(Batch("s", 2, entries=[(0, "x", 7)], resync=True))
    assert t.waiting_on(0)["segments_in_flight"] == ["x"]
    t._check()


def test_bound_argument_is_checked():
    for bad in (0, -1, 1.5, True, "10"):
        with pytest.raises(ValueError, match="max_open_substreams"):
            TrackerTable(max_open_substreams=bad)


def test_bounded_table_memory_stays_flat_under_never_promised_substreams():
    import tracemalloc

    graph = {f"src/{i}": [] for i in range(2)}
    graph.update({f"mid/{i}": ["src/0", "src/1"] for i in range(4)})
    t = TrackerTable(max_open_substreams=500)
    t.register_graph(graph)
    tracemalloc.start()
    try:
        refused = 0
        for k in range(5000):
            try:
                t.apply(Batch("src/0", k + 1, entries=[(k, "mid/0", 2 * k + 1)], labels=[(k, k)]))
            except TableFull:
                refused += 1
                t.apply(Batch("src/0", k + 1))  # the agent's next batch keeps the numbering
        grown = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert refused == 4500 and t.open_count == 500
    # About 2.5 kB per open substream here: 5,000 unbounded would take ~12 MB.
    assert grown < 2_500_000, grown
    # Declaring the source lost retires them all and their ordering rows too.
    assert len(t.set_lost(["src/0"])) == 500
    assert t.open_count == 0
    assert all(len(h) <= 64 for h in t._heaps.values())
    t._check()


# -- processes declared lost --------------------------------------------------------


def test_lost_source_or_receiver_abandons_the_substreams_it_blocks():
    t = TrackerTable(consistent_order=False)
    t.register_graph({"s0": [], "s1": [], "x": ["s0", "s1"], "y": ["x"]})
    t.apply(Batch("s0", 1, entries=[(1, "x", 3), (2, "x", 5)], promises=[1, 2, 3, 4]))
    t.apply(Batch("s1", 1, promises=[1, 2]))  # s1 never promises 3 and 4
    t.apply(Batch("x", 1, entries=[(2, "y", 9), (2, "x", 5)]))
    assert t.notified(2) == {"x"}  # 2 is still in flight to y
    t.apply(Batch("x", 2, acks=[2]))
    t.apply(Batch("s0", 2, entries=[(5, "x", 7)]))  # 5: nobody promised it
    # y lost: 2 (in flight to y) cannot end; 1 (in flight to x) and 3, 4, 5 still can.
    assert t.set_lost(["y"]) == [2]
    assert t.is_abandoned(2) and t.is_retired(2)
    assert t.notified(2) == {"x"}  # abandonment notifies no one
    assert t.open_substreams() == [1, 3, 4, 5]
    # s1 lost too: 3, 4 and 5 wait for its promise.
    assert t.set_lost(["y", "s1"]) == [3, 4, 5]
    assert t.open_substreams() == [1]
    # Reports on an abandoned substream are counted as late, never applied.
    t.apply(Batch("y", 1, entries=[(2, "y", 9)]))
    assert t.late_reports == 1
    # Reporters learn the retirement so their agents can forget it.
    assert t.take_retired("s0") == [2, 3, 4, 5]
    assert t.take_retired("x") == [2]
    t._check()
    r = TrackerTable.restore(t.snapshot())
    assert r.is_abandoned(3) and r.notified(2) == {"x"} and not r.is_abandoned(1)


def test_lost_target_is_not_waited_for_to_retire():
    t = TrackerTable(consistent_order=False)
    t.register_graph({"s": [], "x": ["s"], "y": ["s"]})
    t.apply(Batch("s", 1, promises=[1, 2]))
    assert t.notified(1) == {"x", "y"}
    t.apply(Batch("x", 1, acks=[1, 2]))
    assert t.open_substreams() == [1, 2]  # y never acknowledges
    assert t.set_lost(["y"]) == []  # nothing abandoned: 1 and 2 ended everywhere
    assert t.is_retired(1) and not t.is_abandoned(1)
    t.apply(Batch("s", 2, promises=[3]))
    t.apply(Batch("x", 2, acks=[3]))
    assert t.is_retired(3)
    # y is back: its acknowledgement is awaited again.
    t.set_lost([])
    t.apply(Batch("s", 3, promises=[4]))
    t.apply(Batch("x", 3, acks=[4]))
    assert t.open_substreams() == [4]
    with pytest.raises(TableError, match="'ghost'"):
        t.set_lost(["ghost"])
    t._check()


def test_apply_abandons_what_only_a_lost_target_still_waits_for():
    t = TrackerTable(consistent_order=False)
    t.register_graph({"s": [], "x": ["s"], "y": ["x"]})
    assert t.set_lost(["y"]) == []
    t.apply(Batch("s", 1, entries=[(1, "x", 3)], promises=[1]))
    # After y was declared lost, x forwards an element of 1 to it.
    res = t.apply(Batch("x", 1, entries=[(1, "y", 8), (1, "x", 3)]))
    assert res.notifications == {"x": [1]} and res.abandoned == []
    res = t.apply(Batch("x", 2, acks=[1]))
    assert res.abandoned == [1]  # x, the only live target, is done with it
    assert t.notified(1) == {"x"} and t.abandoned_count == 1
    t._check()
