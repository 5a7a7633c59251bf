"""Exact running sums of floats as scaled integers.

Every finite float is ``m / 2**e``. Keeping ``sum(x) * 2**E`` (and
``sum(x*x) * 2**(2E)``) as Python integers, with ``E`` the largest exponent
seen, makes add and remove exact inverses: no rounding residue survives a
removal, whatever the magnitudes (1e300 next to 1e-3, amounts around 1e9 with
cents). Answers are then correctly rounded by Python's int/int division.
Infinities are counted apart, since they have no integer form.
"""
from __future__ import annotations

import math


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
            return math.copysign(math.inf, self._s1)

    def mean(self) -> float | None:
        if self.n == 0:
            return None
        inf = self._inf()
        if inf is not None:
            return inf
        try:
            return self._s1 / (self.n << self._e)
        except OverflowError:
            return math.copysign(math.inf, self._s1)

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
