"""Exact running sums of floats as scaled integers.

Every finite float is ``m / 2**e``. Keeping ``sum(x) * 2**E`` (and
``sum(x*x) * 2**(2E)``) as Python integers, with ``E`` the largest exponent
seen, makes add and remove exact inverses: no rounding residue survives a
removal, whatever the magnitudes (1e300 next to 1e-3, amounts around 1e9 with
cents). Answers are then correctly rounded by Python's int/int division.
Infinities are counted apart, since they have no integer form.

:class:`_ExactPrefix` is the batch twin: the same integers as prefix sums over
a whole column, so a window's sums are two subtractions and the answers equal
the incremental ones bit for bit.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from beam_ext.transforms.aggregators import _exact_limbs
from beam_ext.transforms.aggregators._columnar import Column, _none_where_empty, _prefix


def _overflowed(num: int, den: int = 1) -> float:
    """The infinity that a quotient too large for a float rounds to.

    Not ``math.copysign(math.inf, num)``: that converts ``num`` to a float,
    which overflows for the integers that get here.
    """
    return math.inf if (num > 0) == (den > 0) else -math.inf


class _ExactMoments:
    """Count, exact sum and (optionally) exact sum of squares of finite floats."""

    __slots__ = ("n", "_s1", "_s2", "_e", "_squares", "_pinf", "_ninf")

    def __init__(self, squares: bool) -> None:
        self.n = 0
        self._s1 = 0
        self._s2 = 0
        self._e = 0
        self._squares = squares
        self._pinf = 0
        self._ninf = 0

    def _scaled(self, x: float) -> int | None:
        if x == math.inf:
            return None
        if x == -math.inf:
            return None
        num, den = float(x).as_integer_ratio()
        e = den.bit_length() - 1
        if e > self._e:
            shift = e - self._e
            self._s1 <<= shift
            self._s2 <<= 2 * shift
            self._e = e
        return num << (self._e - e)

    def update(self, x: float, sign: int) -> None:
        """Add (sign=1) or remove (sign=-1) one value. Validation is the caller's."""
        self.n += sign
        if self.n == 0:
            self._s1 = self._s2 = self._e = self._pinf = self._ninf = 0
            return
        v = self._scaled(x)
        if v is None:
            if x > 0:
                self._pinf += sign
            else:
                self._ninf += sign
            return
        self._s1 += sign * v
        if self._squares:
            self._s2 += sign * v * v

    def _inf(self) -> float | None:
        if self._pinf and self._ninf:
            return math.nan
        if self._pinf:
            return math.inf
        if self._ninf:
            return -math.inf
        return None

    def total(self) -> float:
        inf = self._inf()
        if inf is not None:
            return inf
        try:
            return self._s1 / (1 << self._e)
        except OverflowError:
            return _overflowed(self._s1)

    def mean(self) -> float | None:
        if self.n == 0:
            return None
        inf = self._inf()
        if inf is not None:
            return inf
        try:
            return self._s1 / (self.n << self._e)
        except OverflowError:
            return _overflowed(self._s1)

    def variance(self) -> float | None:
        if self.n == 0:
            return None
        if self._pinf or self._ninf:
            return math.nan
        n = self.n
        # n*S2 - S1^2 >= 0 exactly (Cauchy-Schwarz), so no clamping is needed.
        try:
            return (n * self._s2 - self._s1 * self._s1) / ((n * n) << (2 * self._e))
        except OverflowError:
            return math.inf


class _MomentsAggregator:
    """add/remove/n over exact moments; subclasses say which moments and ``get``."""

    fifo_only = False
    _squares = False

    def __init__(self) -> None:
        self._m = _ExactMoments(squares=self._squares)

    @property
    def n(self) -> int:
        return self._m.n

    def add(self, x: float) -> None:
        self._m.update(x, 1)

    def remove(self, x: float) -> None:
        from beam_ext.transforms.aggregators.base import _check_not_empty

        _check_not_empty(self._m.n, type(self).__name__)
        self._m.update(x, -1)


def _divide(num: np.ndarray, den: Any) -> list:
    """Correctly rounded int/int division, elementwise; overflow gives +-inf."""
    try:
        return np.true_divide(num, den).tolist()
    except OverflowError:
        out = []
        for a, b in zip(num.tolist(), den.tolist() if isinstance(den, np.ndarray) else [den] * len(num)):
            try:
                out.append(a / b)
            except OverflowError:
                out.append(_overflowed(a, b))
        return out


class _ExactPrefix:
    """Exact prefix sums of x and x^2 (nulls as 0) at a common binary scale.

    Built once per column (``column.shared(_ExactPrefix)``) in O(n); each
    window then costs two subtractions and one division. Sums and means use
    int64 limbs (:mod:`._exact_limbs`) when the values span few enough binary
    orders of magnitude; otherwise, and for squares, Python integers.
    """

    def __init__(self, col: Column) -> None:
        x = col.values
        finite = np.isfinite(x)
        xf = np.where(finite, x, 0.0)
        mant, exp = np.frexp(xf)
        m = (mant * (1 << 53)).astype(np.int64)
        # x = m * 2**(exp - 53); bring all to the finest scale 2**-E.
        scale = 53 - exp.astype(np.int64)
        scale[m == 0] = np.iinfo(np.int64).min
        self.e = int(max(scale.max(initial=0), 0))
        shift = np.where(m == 0, 0, self.e - scale)
        self._m, self._shift = m, shift
        # The limbs need no integer part: their scale is the finest value's,
        # even for values that are all large.
        self._limb_e = int(scale[m != 0].max()) if (m != 0).any() else 0
        limb_shift = np.where(m == 0, 0, self._limb_e - scale)
        limbs = _exact_limbs.limbs_needed(53, int(limb_shift.max(initial=0)))
        self._limbs = (_exact_limbs.LimbPrefix(m, limb_shift, limbs)
                       if limbs <= _exact_limbs.MAX_LIMBS and len(x) < _exact_limbs.MAX_ROWS else None)
        self._ints: np.ndarray | None = None
        self._p1: np.ndarray | None = None
        self._p2: np.ndarray | None = None
        self.pinf = _prefix(x == np.inf)
        self.ninf = _prefix(x == -np.inf)

    @property
    def ints(self) -> np.ndarray:
        """Each value times 2**E, as Python integers."""
        if self._ints is None:
            self._ints = self._m.astype(object) << self._shift.astype(object)
        return self._ints

    @property
    def p1(self) -> np.ndarray:
        if self._p1 is None:
            self._p1 = _prefix(self.ints, object)
        return self._p1

    @property
    def p2(self) -> np.ndarray:
        if self._p2 is None:  # only variance and stddev need squares
            self._p2 = _prefix(self.ints * self.ints, object)
        return self._p2

    def _slow_quotients(self, lo: np.ndarray, hi: np.ndarray, divisors: np.ndarray) -> list:
        """``sum / divisor`` of each window by Python integers, from the limbs' exact sums."""
        sums = np.array(self._limbs.exact_sums(lo, hi), dtype=object)
        divisors = divisors.astype(object)
        if self._limb_e >= 0:
            return _divide(sums, divisors << self._limb_e)
        return _divide(sums << -self._limb_e, divisors)

    def _infinities(self, out: list, lo: np.ndarray, hi: np.ndarray, spread: bool) -> list:
        # As _ExactMoments: +-inf for sums of one sign, NaN for both signs or for a spread.
        pinf = self.pinf[hi] - self.pinf[lo]
        ninf = self.ninf[hi] - self.ninf[lo]
        for i in np.flatnonzero((pinf > 0) | (ninf > 0)).tolist():
            if spread or (pinf[i] and ninf[i]):
                out[i] = math.nan
            else:
                out[i] = math.inf if pinf[i] else -math.inf
        return out

    def totals(self, lo: np.ndarray, hi: np.ndarray) -> list:
        """The sum of each window (0.0 when empty), as ``_ExactMoments.total``."""
        if self._limbs is None:
            out = _divide(self.p1[hi] - self.p1[lo], 1 << self.e)
        else:
            rounded, slow = _exact_limbs.rounded_sums(self._limbs.windows(lo, hi), -self._limb_e)
            out = _with_slow_rows(rounded, slow, lambda: self._slow_quotients(
                lo[slow], hi[slow], np.ones(int(slow.sum()), dtype=np.int64)))
        return self._infinities(out, lo, hi, False)

    def means(self, lo: np.ndarray, hi: np.ndarray, cnt: np.ndarray) -> list:
        """The mean of each window of ``cnt`` values (None when empty)."""
        if self._limbs is None:
            out = _divide(self.p1[hi] - self.p1[lo], np.maximum(cnt.astype(object), 1) << self.e)
        else:
            n = np.maximum(cnt, 1).astype(np.int64)
            rounded, slow = _exact_limbs.rounded_quotients(self._limbs.windows(lo, hi), n, -self._limb_e)
            out = _with_slow_rows(rounded, slow, lambda: self._slow_quotients(lo[slow], hi[slow], n[slow]))
        return _none_where_empty(self._infinities(out, lo, hi, False), cnt)

    def variances(self, lo: np.ndarray, hi: np.ndarray, cnt: np.ndarray) -> list:
        """The population variance of each window of ``cnt`` values (None when empty)."""
        s1 = self.p1[hi] - self.p1[lo]
        s2 = self.p2[hi] - self.p2[lo]
        n = cnt.astype(object)
        nz = np.maximum(n, 1)
        out = _divide(n * s2 - s1 * s1, (nz * nz) << (2 * self.e))
        return _none_where_empty(self._infinities(out, lo, hi, True), cnt)


def _with_slow_rows(rounded: np.ndarray, slow: np.ndarray, exact: Any) -> list:
    """``rounded`` as a list, with the rows marked ``slow`` replaced by ``exact()``'s values."""
    out = rounded.tolist()
    if slow.any():
        for i, value in zip(np.flatnonzero(slow).tolist(), exact()):
            out[i] = value
    return out
