"""The tracker table against a brute-force model, under seeded random actions."""
import random

import pytest

from beam_ext.watermark._table import Batch, TableError, TrackerTable

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
    """Which elements are really in flight, and so which NEOSS are allowed."""

    def __init__(self):
        self.in_flight = []  # (substream, destination, token)
        self.promised = {}  # substream -> set of sources

    def ready(self, t, s):
        if set(self.promised.get(s, ())) != set(SOURCES):
            return False
        up = _closure(t)
        return not any(ss == s and dest in up for ss, dest, _ in self.in_flight)


def _run(seed, consistent_order):
    rng = random.Random(seed)
    table = TrackerTable(consistent_order=consistent_order)
    table.register_graph(GRAPH)
    model = Model()
    seq = dict.fromkeys(GRAPH, 0)
    substreams = [0, 1, 2, b"k"]
    last_batch = None

    def send(batch):
        nonlocal last_batch
        res = table.apply(batch)
        assert res.status == "applied"
        last_batch = batch
        if consistent_order:
            # Released in key order: nothing known with a smaller key is still unreleased.
            for t, ended in res.notifications.items():
                for s in ended:
                    k = (table._entries[s].key(s) if s in table._entries else None)
                    for s2, e2 in table._entries.items():
                        if k is not None and e2.key(s2) < k:
                            assert t in e2.notified, (seed, t, s, s2)
        return res

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
            model.in_flight.append((s, dest, tok))
            send(next_batch(src, entries=[(s, dest, tok)], labels=[(s, step)]))
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
            model.promised.setdefault(s, set()).add(src)
            send(next_batch(src, promises=[s]))
        elif action < 0.85:
            t = rng.choice(TARGETS)
            acks = [s for s in substreams if t in table.notified(s) and not table.is_retired(s)]
            send(next_batch(t, acks=acks))
        elif action < 0.92 and last_batch is not None:
            assert table.apply(last_batch).status == "duplicate"
        else:
            table = TrackerTable.restore(table.snapshot())
        table._check()
        for s in substreams:
            notified = table.notified(s)
            for t in TARGETS:
                if consistent_order:
                    # Order may hold a ready substream back, never release an unready one.
                    assert t not in notified or model.ready(t, s), (seed, step, t, s)
                else:
                    assert (t in notified) == model.ready(t, s), (seed, step, t, s)
    return table


@pytest.mark.parametrize("seed", range(12))
def test_random_actions_match_model(seed):
    _run(seed, consistent_order=False)


@pytest.mark.parametrize("seed", range(6))
def test_random_actions_consistent_order(seed):
    _run(seed, consistent_order=True)


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
