"""Exact rational arithmetic behind every randomiser's integer thresholds.

``exp_lower_bound`` is a rigorous lower bound on e**x (a truncated Taylor series, all of whose
terms are positive for x >= 0), so a mechanism whose probability ratio is at most this bound is
provably epsilon0-DP for the float epsilon0 it was given, not merely up to rounding.
"""

from __future__ import annotations

import math
from fractions import Fraction
from statistics import NormalDist
from typing import Final

PROBABILITY_BITS: Final = 64
_TAIL_BITS: Final = 96


def exp_lower_bound(x: float) -> Fraction:
    """A rational r with r <= e**x, within 2**-64 relative; x must be finite and >= 0."""
    if not math.isfinite(x) or x < 0:
        raise ValueError("exponent must be finite and non-negative")
    exact_x = Fraction(x)
    total = Fraction(0)
    term = Fraction(1)
    k = 0
    tolerance = Fraction(1, 1 << _TAIL_BITS)
    while True:
        total += term
        k += 1
        term = term * exact_x / k
        if k > exact_x and term < tolerance * total:
            break
        if k > 10_000:
            raise ValueError("exponent too large")
    scale = 1 << PROBABILITY_BITS
    return Fraction(math.floor(total * scale), scale)


def z_score(confidence: float) -> float:
    """Two-sided normal quantile: 1.959964 for 0.95."""
    if not 0 < confidence < 1:
        raise ValueError("confidence must lie in (0, 1)")
    return NormalDist().inv_cdf(0.5 + confidence / 2)
