"""Window sums and means in int64 limbs: equal to the exact rational answer, correctly rounded.

The oracle is ``fractions.Fraction``: the exact sum (or mean) of the
window's floats, converted to the nearest float with ties to even.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_ext.transforms.aggregators._columnar import Column
from beam_ext.transforms.aggregators._exact import _ExactPrefix


def _nearest(value: Fraction) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _oracle(values: list[float], lo: list[int], hi: list[int]) -> tuple[list, list]:
    totals, means = [], []
    for a, b in zip(lo, hi):
        window = [Fraction(v) for v in values[a:b]]
        totals.append(_nearest(sum(window, Fraction(0))))
        means.append(_nearest(sum(window, Fraction(0)) / len(window)) if window else None)
    return totals, means


def _limb_path(values: list[float], lo: list[int], hi: list[int]) -> tuple[list, list]:
    col = Column(np.array(values, dtype=np.float64), np.zeros(len(values), dtype=np.int64))
    prefix = _ExactPrefix(col)
    assert prefix._limbs is not None, "these values should take the int64 limb path"
    lo_a, hi_a = np.array(lo, dtype=np.int64), np.array(hi, dtype=np.int64)
    return prefix.totals(lo_a, hi_a), prefix.means(lo_a, hi_a, col.count(lo_a, hi_a))


def _same(got: list, want: list) -> bool:
    # Bit for bit: 0.0 and -0.0 differ.
    return [None if g is None else (g, math.copysign(1.0, g)) for g in got] == \
           [None if w is None else (w, math.copysign(1.0, w)) for w in want]


# Finite floats whose binary exponents span at most ~150 bits, so the limb
# path takes them (it leaves wider spans to Python integers): a random
# mantissa of up to 53 bits, a sign and an exponent in a band that moves.
@st.composite
def _banded_floats(draw) -> list[float]:
    width = draw(st.integers(0, 100))
    base = draw(st.integers(-1070, 1023 - width))  # below 2**1024: finite
    n = draw(st.integers(1, 40))
    out = []
    for _ in range(n):
        mantissa = draw(st.integers(-(1 << 53) + 1, (1 << 53) - 1))
        out.append(math.ldexp(mantissa, draw(st.integers(base, base + width)) - 52))
    return out


@settings(max_examples=300, deadline=None)
@given(_banded_floats(), st.data())
def test_limb_sums_and_means_equal_the_exact_answer_rounded(values, data):
    n = len(values)
    lo = data.draw(st.lists(st.integers(0, n), min_size=1, max_size=20))
    hi = [data.draw(st.integers(a, n)) for a in lo]
    assert _same_pair(_limb_path(values, lo, hi), _oracle(values, lo, hi))


def _same_pair(got: tuple[list, list], want: tuple[list, list]) -> bool:
    return _same(got[0], want[0]) and _same(got[1], want[1])


@pytest.mark.parametrize("values", [
    [2.0 ** 53, 1.0],                   # sum 2**53 + 1: a tie, to the even 2**53
    [2.0 ** 53, 3.0],                   # 2**53 + 3: a tie, to the even 2**53 + 4
    [2.0 ** 53, 1.0, 2.0 ** -40],       # just above the tie: rounds up
    [-(2.0 ** 53), -1.0, 2.0 ** -40],   # just below the negative tie: rounds towards zero
    [2.0 ** 54, 2.0, 1.0],              # mean (2**54 + 3) / 3 = 6004799503160662.33...
    [1.0, -1.0, 2.0 ** -30, -(2.0 ** -30)],   # cancels to +0.0
    [5e-324, 0.0],                      # mean 2**-1075: subnormal, to the even 0.0
    [5e-324, 5e-324, 5e-324, 0.0],      # mean 3 * 2**-1076: subnormal
    [2.0 ** -1022, -(2.0 ** -1074)],    # sum just below the smallest normal
    [1.7e308, 1.7e308],                 # overflows to inf, as Python's int / int does
    [-1.7e308, -1.7e308, 2.0 ** 1000],   # to -inf
    [0.1, 0.2, 0.3, 0.7, 1e-3],         # decimals, each inexact
])
def test_limb_path_rounds_ties_subnormals_and_overflow_as_the_exact_answer(values):
    n = len(values)
    lo = [a for a in range(n) for _ in range(a, n + 1)]
    hi = [b for a in range(n) for b in range(a, n + 1)]
    got, want = _limb_path(values, lo, hi), _oracle(values, lo, hi)
    assert _same(got[0], want[0]), (got[0], want[0])
    assert _same(got[1], want[1]), (got[1], want[1])


def test_values_spanning_too_many_orders_of_magnitude_take_python_integers():
    values = [1e300, 1e-300, -1e300]
    col = Column(np.array(values), np.zeros(3, dtype=np.int64))
    prefix = _ExactPrefix(col)
    assert prefix._limbs is None
    lo, hi = np.array([0, 0, 1]), np.array([3, 2, 2])
    assert prefix.totals(lo, hi) == [1e-300, 1e300, 1e-300]


def test_a_long_column_of_cents_matches_the_exact_answer():
    # The sliding benchmark's amounts: lognormal, rounded to cents.
    rng = np.random.default_rng(7)
    values = np.round(rng.lognormal(3.5, 1.0, 5_000), 2).tolist()
    lo = rng.integers(0, 5_000, 400)
    hi = np.minimum(lo + rng.integers(0, 3_000, 400), 5_000)
    got = _limb_path(values, lo.tolist(), hi.tolist())
    assert _same_pair(got, _oracle(values, lo.tolist(), hi.tolist()))
