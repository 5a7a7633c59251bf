"""Incremental engine and vectorised batch path against the brute-force oracle."""
from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
from _sliding_oracle import ORACLES, assert_features_close, every_kind, oracle
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_ext.state.reservoir import EventReservoir
from beam_ext.transforms import agg
from beam_ext.transforms.sliding._engine import _SlidingEngine, compute_sorted
from beam_ext.transforms.sliding._plan import SlidingWindow, _Plan
from beam_ext.transforms.sliding._vectorised import compute_batch

# Every registered kind: numeric ones over "v", the others over "v" and "m".
KINDS = every_kind("v", "m")


def make_plan(windows, aggregations=KINDS, where=None):
    return _Plan("k", "ts", {n: SlidingWindow(s, d) for n, (s, d) in windows.items()},
                 {n: getattr(agg, kind)(f) for n, (kind, f) in aggregations.items()}, where)


def engine_batch(plan, events, reservoir_factory=None):
    out = [None] * len(events)
    for key in {e["k"] for e in events}:
        idx = sorted((i for i, e in enumerate(events) if e["k"] == key), key=lambda i: events[i]["ts"])
        res = reservoir_factory() if reservoir_factory else None
        feats = compute_sorted(plan, [events[i]["ts"] for i in idx], [events[i] for i in idx], res)
        for i, f in zip(idx, feats):
            out[i] = f
    return out


def vectorised(plan, events):
    return compute_batch(plan, [e["k"] for e in events], np.array([e["ts"] for e in events]), events)


values = st.one_of(
    st.none(), st.just(math.nan), st.integers(-5, 5).map(float),
    st.floats(-1e15, 1e15, allow_nan=False), st.floats(0, 1).map(lambda x: 1e9 + x))
events_st = st.lists(st.fixed_dictionaries({
    "k": st.sampled_from(["a", "b", 7]),
    "ts": st.integers(0, 24).map(lambda x: x / 2),  # many duplicate timestamps
    "v": values,
    "m": st.sampled_from(["x", "y", "z", None, 3]),
    "ok": st.booleans(),
}), max_size=40)
windows_st = st.dictionaries(
    st.sampled_from(["w1", "w2", "w3", "w4"]),
    st.tuples(st.sampled_from([0.5, 1, 2, 3.5, 6]), st.sampled_from([0, 0.5, 1, 2])),
    min_size=1, max_size=4)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(events_st, windows_st, st.booleans())
def test_engine_and_vectorised_equal_the_oracle_exactly(events, windows, filtered):
    where = (lambda e: e["ok"]) if filtered else None
    plan = make_plan(windows, where=where)
    want = oracle(events, "k", "ts", windows, KINDS, where=where)
    got = engine_batch(plan, events)
    assert_features_close(got, want, rel=0)
    assert_features_close(vectorised(plan, events), want, rel=0)


def test_windows_sharing_edges_share_iterators():
    # 2s ending now, 2s ending 2s ago, 4s ending now: offsets 0, 2, 4 only.
    plan = make_plan({"a": (2, 0), "b": (2, 2), "c": (4, 0)})
    assert plan.offsets == [0.0, 2.0, 4.0]
    engine = _SlidingEngine(plan)
    assert len(engine._cursors) == 3


def test_start_edge_is_exclusive_and_end_edge_inclusive():
    events = [{"k": 1, "ts": t, "v": t, "m": None, "ok": True} for t in (0.0, 1.0, 2.0, 2.0, 3.0)]
    plan = make_plan({"w": (2, 0), "d": (1, 1)})
    got = engine_batch(plan, events)
    # At t=2: (0, 2] holds 1, 2, 2 (0 sits on the start edge); delayed (0, 1] holds 1.
    assert got[2]["count_w"] == 3 and got[2]["sum_v_w"] == 5.0 and got[2]["count_d"] == 1
    assert got == vectorised(plan, events)


def test_empty_windows_give_each_kinds_empty_answer():
    # Documented per kind in docs/sliding.md (checked in test_sliding_aggregators):
    # 0 for counts, 0.0 for sum, None for the statistics.
    events = [{"k": 1, "ts": 5.0, "v": None, "m": None, "ok": True}]
    plan = make_plan({"w": (1, 3)})
    want = {f"{name}_w": ORACLES[kind]([]) for name, (kind, _) in KINDS.items()}
    assert engine_batch(plan, events)[0] == want
    assert vectorised(plan, events)[0] == want


def test_amounts_around_1e9_keep_their_spread_over_long_windows():
    rng = random.Random(3)
    events = [{"k": 0, "ts": float(i), "v": 1e9 + rng.uniform(-1, 1), "m": None, "ok": True}
              for i in range(3000)]
    aggs = {"var": ("variance", "v"), "sd": ("stddev", "v")}
    plan = make_plan({"long": (1000, 0)}, aggs)
    got = engine_batch(plan, events)
    assert got == vectorised(plan, events)
    for i in (999, 2000, 2999):
        fr = [Fraction(e["v"]) for e in events[i - 999:i + 1]]
        mean = sum(fr) / len(fr)
        var = float(sum((x - mean) ** 2 for x in fr) / len(fr))
        assert got[i] == {"var_long": var, "sd_long": math.sqrt(var)}
    assert 0.3 < got[-1]["var_long"] < 0.37  # uniform(-1, 1) has variance 1/3


def test_disk_reservoir_gives_the_same_answers(tmp_path):
    rng = random.Random(5)
    events = [{"k": rng.randint(0, 2), "ts": float(rng.randint(0, 400)), "v": rng.uniform(-5, 5),
               "m": rng.choice("pqrs"), "ok": True} for _ in range(600)]
    plan = make_plan({"w": (30, 0), "d": (50, 10)})
    counter = iter(range(100))
    got = engine_batch(plan, events, lambda: EventReservoir(
        plan.kinds, directory=str(tmp_path / str(next(counter))), chunk_size=16, cache_chunks=2))
    assert got == engine_batch(plan, events) == vectorised(plan, events)


def _arrival_oracle(events, windows, disorder, policy):
    """Immediate semantics: each event over the accepted events of its key so far."""
    seen, out, newest = [], [], {}
    for e in events:
        t = e["ts"]
        top = newest.get(e["k"], -math.inf)
        if t < top - disorder:
            if policy == "drop":
                out.append(None)
                continue
            t = top - disorder
        newest[e["k"]] = max(top, t)
        seen.append(dict(e, ts=t))
        out.append(oracle([x for x in seen if x["k"] == e["k"]][:-1] + [seen[-1]], "k", "ts",
                          windows, KINDS)[-1])
    return out


@settings(max_examples=40, deadline=None, derandomize=True)
@given(events_st, windows_st, st.sampled_from([0, 1, 3]), st.sampled_from(["drop", "rewrite"]))
def test_streaming_engine_answers_over_events_arrived_so_far(events, windows, disorder, policy):
    plan = make_plan(windows)
    engines: dict = {}
    got = []
    for e in events:
        eng = engines.setdefault(e["k"], _SlidingEngine(plan, EventReservoir(plan.kinds, chunk_size=2),
                                                         retain=disorder))
        t = e["ts"]
        if t < eng.clock - disorder:
            if policy == "drop":
                got.append(None)
                continue
            t = eng.clock - disorder
        eng.push(t, plan.row(e))
        if t >= eng.clock:
            eng.advance(t)
            got.append(eng.features())
        else:
            got.append(eng.query(t))
        eng.reservoir._check()
    want = _arrival_oracle(events, windows, disorder, policy)
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if g is not None:
            assert_features_close([g], [w], rel=0)


def _plan_with_kind(kind: str) -> _Plan:
    plan = make_plan({"w": (2, 0)}, {"x": ("mean", "v")})
    # A frozen spec is not validated again when unpickled: a plan pickled where
    # a kind exists can reach a worker where it does not.
    object.__setattr__(plan.aggs[0][1], "kind", kind)
    return plan


_ONE_EVENT = [{"k": 1, "ts": 1.0, "v": 2.0, "m": "x", "ok": True}]


def test_an_unknown_kind_reaching_the_vectorised_path_is_refused_by_name():
    with pytest.raises(ValueError, match=r"aggregations\['x'\]: unknown aggregation 'median'"):
        vectorised(_plan_with_kind("median"), _ONE_EVENT)


def test_an_unknown_kind_reaching_the_engine_is_refused_by_name():
    with pytest.raises(ValueError, match=r"unknown aggregation 'median'"):
        engine_batch(_plan_with_kind("median"), _ONE_EVENT)


def test_a_custom_aggregation_reaching_the_vectorised_path_is_refused():
    from beam_ext.transforms.aggregators import Sum

    plan = _Plan("k", "ts", {"w": SlidingWindow(2)}, {"c": agg.custom("v", Sum)}, None)
    assert not plan.vectorisable
    with pytest.raises(ValueError, match=r"aggregations\['c'\]: agg.custom\('v'\) has no vectorised form"):
        vectorised(plan, _ONE_EVENT)
