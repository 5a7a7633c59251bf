"""Aggregators: every registered kind, exact against its oracle after every add/remove.

The kinds come from the registry, so a kind added there is checked here
(incremental and vectorised forms, pickling, removal from empty, docs)
without editing this file; it only needs an oracle in ``_sliding_oracle``.
"""
from __future__ import annotations

import copy
import inspect
import math
import pathlib
import pickle
import random
import re
import zlib
from collections import deque

import numpy as np
import pytest
from _sliding_oracle import ORACLES

from beam_ext.transforms import agg, aggregators
from beam_ext.transforms.aggregators import Sum, Variance
from beam_ext.transforms.aggregators._columnar import Column
from beam_ext.transforms.aggregators.registry import KINDS, Kind, _table, lookup

VECTORISED = [name for name, kind in KINDS.items() if kind.vectorised is not None]
REGIMES = ["small", "around_1e9", "mixed_magnitudes"]


def _rng(*parts: str) -> random.Random:
    # str hashes are salted per process: seed from a stable checksum instead.
    return random.Random(zlib.crc32("/".join(parts).encode()))


def _draw(rng: random.Random, regime: str) -> float:
    if regime == "small":
        return float(rng.randint(-5, 5))
    if regime == "around_1e9":
        return 1e9 + rng.uniform(0, 1)
    return rng.choice([1e15, -3e12, 0.001, rng.uniform(-1, 1), 7.0])


def test_every_kind_has_an_oracle():
    assert set(ORACLES) == set(KINDS), "every registered kind needs an oracle in _sliding_oracle.ORACLES"


def test_every_exported_aggregator_is_a_registered_kind():
    exported = {cls for _, cls in inspect.getmembers(aggregators, inspect.isclass)
                if cls is not aggregators.Aggregator}
    assert exported == {kind.factory for kind in KINDS.values()}


def test_agg_has_one_builder_per_kind():
    builders = set(agg.__all__) - {"AggSpec", "custom"}
    assert builders == set(KINDS)
    for name, kind in KINDS.items():
        spec = getattr(agg, name)("x")
        assert spec.kind == name and spec.numeric is kind.numeric and spec.vectorised is kind.vectorised
        assert type(spec.make()) is kind.factory


@pytest.mark.parametrize("name", KINDS)
def test_every_kind_builds_an_aggregator(name):
    a = KINDS[name].factory()
    assert isinstance(a, aggregators.Aggregator) and isinstance(a.fifo_only, bool)


def test_empty_window_answers_match_the_docs():
    doc = (pathlib.Path(__file__).parents[1] / "docs" / "sliding.md").read_text()
    table = re.search(r"\| aggregation \| empty window \|.*?\n\n", doc, re.S).group(0)
    documented = {}
    for row in filter(None, table.splitlines()[2:]):
        names, empty = (c.strip() for c in row.strip("|").split("|")[:2])
        for name in names.split(" / "):
            documented[name] = empty
    assert set(documented) == set(KINDS), "docs/sliding.md lists every kind, and only those"
    for name, kind in KINDS.items():
        assert repr(kind.factory().get()) == repr(ORACLES[name]([])) == documented[name], name


def test_unknown_kinds_are_refused_by_name():
    with pytest.raises(ValueError, match=r"unknown aggregation 'median'; known: \['count', "):
        lookup("median")
    with pytest.raises(ValueError, match="unknown aggregation 'median'"):
        agg.AggSpec("median", "x")


@pytest.mark.parametrize("entries, error, match", [
    (lambda: [Kind("sum", Sum, numeric=True, vectorised=None)] * 2, ValueError, "'sum' is listed twice"),
    (lambda: [Kind("custom", Sum, numeric=True, vectorised=None)], ValueError, "agg.custom"),
    (lambda: [Kind("p 99", Sum, numeric=True, vectorised=None)], ValueError, "identifier"),
    (lambda: [Kind("p99", None, numeric=True, vectorised=None)], TypeError, "factory must be callable"),
    (lambda: [Kind("p99", Sum, numeric=1, vectorised=None)], TypeError, "numeric must be a bool"),
    (lambda: [Kind("p99", Sum, numeric=True, vectorised="fast")], TypeError, "vectorised must be"),
])
def test_bad_registry_entries_are_refused(entries, error, match):
    with pytest.raises(error, match=match):
        _table(entries())


@pytest.mark.parametrize("name", KINDS)
@pytest.mark.parametrize("regime", REGIMES)
def test_aggregator_equals_oracle_after_every_operation(name, regime):
    rng = _rng(name, regime)
    a, window = KINDS[name].factory(), deque()
    for _ in range(400):
        if window and rng.random() < 0.45:
            a.remove(window.popleft())  # FIFO: the window's tail
        else:
            x = _draw(rng, regime)
            a.add(x)
            window.append(x)
        assert a.get() == ORACLES[name](list(window)), (list(window), a.get())


def _column(values: list, numeric: bool, keys: np.ndarray) -> Column:
    if numeric:
        return Column(np.array([math.nan if v is None else v for v in values]), keys)
    codes: dict = {}
    return Column(np.array([-1 if v is None else codes.setdefault(v, len(codes)) for v in values],
                           dtype=np.int64), keys)


@pytest.mark.parametrize("name", VECTORISED)
@pytest.mark.parametrize("regime", REGIMES)
def test_vectorised_form_equals_oracle_on_every_window(name, regime):
    kind = KINDS[name]
    rng = _rng(name, regime, "vectorised")
    # Two keys, rows sorted by key; windows stay inside one key, nulls included.
    values = [None if rng.random() < 0.15 else _draw(rng, regime) for _ in range(150)]
    keys = np.array([0] * 70 + [1] * 80, dtype=np.int64)
    bounds = []
    for _ in range(300):
        start, end = rng.choice([(0, 70), (70, 150)])
        lo = rng.randint(start, end)
        bounds.append((lo, rng.randint(lo, end)))
    lo, hi = (np.array(b, dtype=np.int64) for b in zip(*bounds))
    got = kind.vectorised(_column(values, kind.numeric, keys), lo, hi)
    want = [ORACLES[name]([v for v in values[a:b] if v is not None]) for a, b in bounds]
    assert got == want


@pytest.mark.parametrize("name", VECTORISED)
def test_vectorised_form_equals_the_aggregator_with_infinities(name):
    kind = KINDS[name]
    rng = _rng(name, "infinities")
    values = [rng.choice([math.inf, -math.inf, None, 1e300, -1e308, -2.5, 0.125]) for _ in range(120)]
    keys = np.zeros(len(values), dtype=np.int64)
    bounds = [(lo, rng.randint(lo, len(values))) for lo in (rng.randint(0, len(values)) for _ in range(200))]
    lo, hi = (np.array(b, dtype=np.int64) for b in zip(*bounds))
    got = kind.vectorised(_column(values, kind.numeric, keys), lo, hi)
    for (a, b), g in zip(bounds, got):
        incremental = kind.factory()
        for v in values[a:b]:
            if v is not None:
                incremental.add(v)
        assert repr(g) == repr(incremental.get()), (values[a:b], g)  # repr: NaN equals NaN


def test_variance_survives_a_window_sliding_from_huge_to_small_values():
    v = Variance()
    for x in (1e9, 1e9 + 1, 3.0, 5.0):
        v.add(x)
    v.remove(1e9)
    v.remove(1e9 + 1)
    assert v.get() == 1.0  # Welford-with-removal gives garbage here


@pytest.mark.parametrize("name", KINDS)
def test_aggregators_pickle_and_copy(name):
    a = KINDS[name].factory()
    for x in (3.0, 1.0, 2.0):
        a.add(x)
    a.remove(3.0)
    for clone in (lambda x: pickle.loads(pickle.dumps(x)), copy.deepcopy):
        b = clone(a)
        assert b.get() == a.get()
        b.add(9.0)
        assert b.get() == ORACLES[name]([1.0, 2.0, 9.0])
    assert a.get() == ORACLES[name]([1.0, 2.0])


@pytest.mark.parametrize("name", KINDS)
def test_remove_from_empty_raises_and_leaves_state(name):
    a = KINDS[name].factory()
    with pytest.raises(ValueError, match="nothing to remove|not in the window"):
        a.remove(1.0)
    a.add(2.0)
    assert a.get() == ORACLES[name]([2.0])


def test_infinities_are_counted_apart():
    s, v = Sum(), Variance()
    for x in (1.0, math.inf):
        s.add(x)
        v.add(x)
    assert s.get() == math.inf and math.isnan(v.get())
    s.remove(1.0)
    s.remove(math.inf)
    assert s.get() == 0.0


def test_results_beyond_the_float_range_are_infinite_in_both_forms():
    # The exact sum of 1e308 + 1e308 rounds to inf; it used to raise OverflowError.
    s = Sum()
    for x in (1e308, 1e308):
        s.add(x)
    assert s.get() == math.inf
    s.remove(1e308)
    assert s.get() == 1e308
    col = Column(np.array([1e308, 1e308, -1e308, -1e308, -1e308, 1e300, -2.5]), np.zeros(7, dtype=np.int64))
    lo, hi = np.array([0, 2, 0, 5]), np.array([2, 5, 5, 7])
    assert KINDS["sum"].vectorised(col, lo, hi) == [math.inf, -math.inf, -1e308, 1e300]
    assert KINDS["variance"].vectorised(col, lo, hi) == [0.0, 0.0, math.inf, math.inf]
