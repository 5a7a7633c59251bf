"""Aggregators: exact against Fraction-based oracles after every add/remove."""
from __future__ import annotations

import copy
import inspect
import math
import pickle
import random
from collections import deque
from fractions import Fraction

import pytest

from beam_ext.transforms import aggregators
from beam_ext.transforms.aggregators import (
    Count, CountDistinct, Max, Mean, Min, StdDev, Sum, Variance)

ALL = [cls for _, cls in inspect.getmembers(aggregators, inspect.isclass) if cls is not aggregators.Aggregator]


def _expected(cls, window):
    fr = [Fraction(x) for x in window]
    if cls is Count:
        return len(window)
    if cls is Sum:
        return float(sum(fr)) if fr else 0.0
    if cls is CountDistinct:
        return len(set(window))
    if not window:
        return None
    if cls is Mean:
        return float(sum(fr) / len(fr))
    if cls is Min:
        return min(window)
    if cls is Max:
        return max(window)
    m = sum(fr) / len(fr)
    var = float(sum((x - m) ** 2 for x in fr) / len(fr))
    return var if cls is Variance else math.sqrt(var)


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
@pytest.mark.parametrize("regime", ["small", "around_1e9", "mixed_magnitudes"])
def test_aggregator_equals_oracle_after_every_operation(cls, regime):
    rng = random.Random(hash((cls.__name__, regime)) & 0xFFFF)
    agg, window = cls(), deque()
    for _ in range(400):
        if window and rng.random() < 0.45:
            agg.remove(window.popleft())  # FIFO: the window's tail
        else:
            if regime == "small":
                x = float(rng.randint(-5, 5))
            elif regime == "around_1e9":
                x = 1e9 + rng.uniform(0, 1)
            else:
                x = rng.choice([1e15, -3e12, 0.001, rng.uniform(-1, 1), 7.0])
            agg.add(x)
            window.append(x)
        assert agg.get() == _expected(cls, list(window)), (list(window), agg.get())


def test_variance_survives_a_window_sliding_from_huge_to_small_values():
    v = Variance()
    for x in (1e9, 1e9 + 1, 3.0, 5.0):
        v.add(x)
    v.remove(1e9)
    v.remove(1e9 + 1)
    assert v.get() == 1.0  # Welford-with-removal gives garbage here


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_aggregators_pickle_and_copy(cls):
    a = cls()
    for x in (3.0, 1.0, 2.0):
        a.add(x)
    a.remove(3.0)
    for clone in (lambda x: pickle.loads(pickle.dumps(x)), copy.deepcopy):
        b = clone(a)
        assert b.get() == a.get()
        b.add(9.0)
        assert b.get() == _expected(cls, [1.0, 2.0, 9.0])
    assert a.get() == _expected(cls, [1.0, 2.0])


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_remove_from_empty_raises_and_leaves_state(cls):
    a = cls()
    with pytest.raises(ValueError, match="nothing to remove|not in the window"):
        a.remove(1.0)
    a.add(2.0)
    assert a.get() == _expected(cls, [2.0])


def test_infinities_are_counted_apart():
    s, v = Sum(), Variance()
    for x in (1.0, math.inf):
        s.add(x)
        v.add(x)
    assert s.get() == math.inf and math.isnan(v.get())
    s.remove(1.0)
    s.remove(math.inf)
    assert s.get() == 0.0
