"""Exact window sums in int64 limbs, correctly rounded without Python integers.

:class:`~beam_ext.transforms.aggregators._exact._ExactPrefix` holds every
value as the integer ``x * 2**E``. Its prefix sums as Python integers cost
several object operations per event; here each integer is cut into signed
32-bit limbs whose prefix sums fit in int64 (fewer than 2**30 rows), so a
window's sum is one int64 subtraction per limb.

Rounding a window's integer ``S`` (or ``S / n`` for a mean) to the nearest
float, ties to even, as Python's ``int / int`` does:

1. carries make the limbs canonical (each in ``[0, 2**32)`` below a signed
   top limb), and negative sums are negated first, so only magnitudes are
   rounded;
2. for a mean, long division of ``S * 2**96`` by ``n``, limb by limb in
   int64: the quotient then has at least 65 significant bits, and a non-zero
   remainder is a sticky bit;
3. the top 64 significant bits go into one uint64 whose lowest bit is ORed
   with "any lower bit is set". Converting it to float64 rounds at bit 11:
   the bits below the rounding bit are non-zero exactly when the true value
   is above the halfway point, so the conversion rounds as the exact value
   would; ``ldexp`` then scales exactly.

Results that would be subnormal (their scaling would round again) are left
to the caller's Python-integer path, marked in the returned mask.
"""
from __future__ import annotations

import numpy as np

LIMB_BITS = 32
_MASK = np.uint64((1 << LIMB_BITS) - 1)
# Prefix sums of limbs below 2**32 stay below 2**62 for fewer rows, leaving
# room for the carries of normalisation.
MAX_ROWS = 1 << 30
# Values spanning more binary orders of magnitude than this many limbs hold
# (about 200) take the Python-integer path.
MAX_LIMBS = 8
# Appended below a sum before dividing by a count below 2**31: the quotient
# keeps at least 65 significant bits.
_DIVISION_LIMBS = 3
_SMALLEST_NORMAL_EXPONENT = -1022


def limbs_needed(mantissa_bits: int, max_shift: int) -> int:
    """Limbs for integers of ``mantissa_bits`` shifted left by up to ``max_shift``.

    >>> limbs_needed(53, 0), limbs_needed(53, 12), limbs_needed(53, 600)
    (2, 3, 21)
    """
    # A sum's growth goes into the extra limb that normalising adds.
    return -(-(mantissa_bits + max_shift) // LIMB_BITS)


class LimbPrefix:
    """Prefix sums of ``mantissa << shift`` per row, one int64 array per limb.

    ``mantissa`` is int64 with ``|mantissa| < 2**53``, ``shift`` int64 >= 0.

    >>> p = LimbPrefix(np.array([3, -1, 5]), np.array([0, 40, 1]), 3)
    >>> [int(v) for v in p.exact_sums(np.array([0, 1]), np.array([3, 2]))]
    [-1099511627763, -1099511627776]
    """

    def __init__(self, mantissa: np.ndarray, shift: np.ndarray, limbs: int) -> None:
        magnitude = np.abs(mantissa).astype(np.uint64)
        negative = mantissa < 0
        self.limbs = limbs
        self.prefix = np.zeros((limbs, len(mantissa) + 1), dtype=np.int64)
        for k in range(limbs):
            offset = shift - LIMB_BITS * k  # where the mantissa's bit 0 lands in limb k
            up = np.left_shift(magnitude, np.clip(offset, 0, 63).astype(np.uint64))
            down = np.right_shift(magnitude, np.clip(-offset, 0, 63).astype(np.uint64))
            limb = (np.where(offset >= 0, up, down) & _MASK).astype(np.int64)
            np.cumsum(np.where(negative, -limb, limb), out=self.prefix[k, 1:])

        self._last: tuple | None = None

    def windows(self, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(canonical limbs of each window's ``|sum|``, whether the sum is negative).

        The last answer is kept: a window's sum and its mean ask for the same.
        """
        last = self._last
        if last is not None and last[0] is lo and last[1] is hi:
            return last[2]
        got = _magnitudes(self.prefix[:, hi] - self.prefix[:, lo])
        self._last = (lo, hi, got)
        return got

    def exact_sums(self, lo: np.ndarray, hi: np.ndarray) -> list[int]:
        """Each window's sum as a Python integer (the slow path's input)."""
        limbs = self.prefix[:, hi] - self.prefix[:, lo]
        return [sum(int(v) << (LIMB_BITS * k) for k, v in enumerate(column)) for column in limbs.T.tolist()]


def _normalise(limbs: np.ndarray) -> np.ndarray:
    """Canonical limbs, one more than given: each in [0, 2**32) below a signed top limb."""
    out = np.empty((limbs.shape[0] + 1, limbs.shape[1]), dtype=np.int64)
    carry = np.zeros(limbs.shape[1], dtype=np.int64)
    for k in range(limbs.shape[0]):
        total = limbs[k] + carry
        out[k] = total & np.int64(_MASK)
        carry = total >> LIMB_BITS  # arithmetic: floor division by 2**32
    out[-1] = carry
    return out


def _magnitudes(limbs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(canonical limbs of |sum|, whether the sum is negative), from un-normalised limbs."""
    canonical = _normalise(limbs)
    negative = canonical[-1] < 0
    if negative.any():
        canonical[:, negative] = _normalise(-limbs[:, negative])
    return canonical, negative


def _divide(magnitude: np.ndarray, divisor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(limbs of ``magnitude * 2**(32*_DIVISION_LIMBS) // divisor``, remainder != 0)."""
    rows = magnitude.shape[1]
    dividend = np.concatenate([np.zeros((_DIVISION_LIMBS, rows), dtype=np.int64), magnitude])
    quotient = np.empty_like(dividend)
    remainder = np.zeros(rows, dtype=np.int64)
    for k in range(dividend.shape[0] - 1, -1, -1):
        current = (remainder << LIMB_BITS) | dividend[k]  # < divisor * 2**32 <= 2**63
        quotient[k] = current // divisor
        remainder = current - quotient[k] * divisor
    return quotient, remainder != 0


def _round(magnitude: np.ndarray, exponent: int, sticky: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(nearest float64 to ``magnitude * 2**exponent``, ties to even; rows it cannot round).

    ``magnitude``: canonical non-negative limbs; ``sticky``: rows with a
    non-zero part below the last limb.
    """
    count = magnitude.shape[0]
    limbs = [magnitude[k].astype(np.uint64) for k in range(count)]
    zero = np.zeros_like(limbs[0])
    # Whether any limb below limb k is non-zero, for every k.
    below_any = [np.zeros(len(zero), dtype=bool)]
    for k in range(count - 1):
        below_any.append(below_any[-1] | (limbs[k] != 0))
    # The top non-zero limb and the two under it, found from the top: a
    # sum's extra limb is mostly zero, so this takes a pass or two.
    top = np.full(len(zero), count - 1, dtype=np.int64)
    high, middle = limbs[-1], limbs[-2] if count > 1 else zero
    low = limbs[-3] if count > 2 else zero
    lost = below_any[count - 3] if count > 2 else below_any[0]
    for k in range(count - 2, -1, -1):
        empty = high == 0
        if not empty.any():
            break
        high = np.where(empty, middle, high)
        middle = np.where(empty, low, middle)
        low = np.where(empty, limbs[k - 2] if k >= 2 else zero, low)
        lost = np.where(empty, below_any[k - 2] if k >= 2 else below_any[0], lost)
        top -= empty
    bits = np.frexp(high.astype(np.float64))[1].astype(np.uint64)  # 1..32: exact below 2**53
    window = (np.left_shift(high, np.uint64(64) - bits)
              | np.left_shift(middle, np.uint64(32) - bits)
              | np.right_shift(low, bits))
    # Any set bit below the window: in ``low`` under its kept part, or in a lower limb.
    lost = lost | ((low & (np.left_shift(np.uint64(1), bits) - np.uint64(1))) != 0)
    if sticky is not None:
        lost |= sticky
    window |= lost.astype(np.uint64)
    # The window's top bit is bit ``bits - 1`` of limb ``top``; its bit 0 is 63 below.
    scale = LIMB_BITS * top + bits.astype(np.int64) - 64 + exponent
    with np.errstate(over="ignore"):
        out = np.ldexp(window.astype(np.float64), scale)
    # Below the smallest normal float, ldexp would round a second time.
    zero_sum = high == 0
    out[zero_sum] = 0.0
    unrounded = (scale + 63 < _SMALLEST_NORMAL_EXPONENT) & ~zero_sum
    return out, unrounded


def rounded_sums(windows: tuple[np.ndarray, np.ndarray], exponent: int) -> tuple[np.ndarray, np.ndarray]:
    """(each window's ``S * 2**exponent`` correctly rounded, rows left to the caller).

    ``windows``: :meth:`LimbPrefix.windows`' answer.
    """
    magnitude, negative = windows
    out, unrounded = _round(magnitude, exponent)
    return np.where(negative, -out, out), unrounded


def rounded_quotients(windows: tuple[np.ndarray, np.ndarray], divisor: np.ndarray,
                      exponent: int) -> tuple[np.ndarray, np.ndarray]:
    """(each window's ``S * 2**exponent / divisor`` correctly rounded, rows left to the caller).

    ``divisor``: int64 in ``[1, 2**31)``.
    """
    magnitude, negative = windows
    quotient, sticky = _divide(magnitude, divisor)
    out, unrounded = _round(quotient, exponent - LIMB_BITS * _DIVISION_LIMBS, sticky)
    return np.where(negative, -out, out), unrounded
