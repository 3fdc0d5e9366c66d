"""Binomial pmfs (Loader's saddle-point form), pmf runs and the Chernoff windows of the C sums."""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import binom

from deniable.core.amplification._binomial import chernoff_window, kl_bernoulli, log_pmf, pmf, pmf_run


def exact_log_pmf(k: int, n: int, p: Fraction) -> float:
    """ln P[Bin(n, p) = k] from exact integers and rationals (binary exponent split off exactly)."""
    value = math.comb(n, k) * p**k * (1 - p) ** (n - k)
    shift = value.numerator.bit_length() - value.denominator.bit_length()
    mantissa = value / Fraction(2) ** shift if shift >= 0 else value * Fraction(2) ** -shift
    with localcontext() as ctx:
        ctx.prec = 40
        return float(Decimal(math.log(float(mantissa))) + shift * Decimal(2).ln())


@pytest.mark.parametrize("n", [1, 2, 15, 16, 17, 40, 300, 2000])
@pytest.mark.parametrize("p", [Fraction(1, 2), Fraction(3, 10), Fraction(9, 10), Fraction(1, 1000)])
def test_log_pmf_matches_exact_rationals(n: int, p: Fraction) -> None:
    ks = sorted({0, 1, n // 3, n // 2, int(n * p), n - 1, n})
    ours = log_pmf(np.array(ks), n, float(p))
    for k, value in zip(ks, ours, strict=True):
        expected = exact_log_pmf(k, n, p)
        # float(p) differs from p by 1e-17 relative: allow that times the exponent size.
        assert value == pytest.approx(expected, rel=1e-13, abs=1e-12 + 1e-15 * n)


def test_log_pmf_is_accurate_where_lgamma_differences_are_not() -> None:
    """At n = 10^5 lgamma differences lose ~3e-10; Bin(n, 1/2) is comb(n, k) / 2^n exactly."""
    n = 10**5
    ks = [n // 2 - 1000, n // 2 - 7, n // 2, n // 2 + 234]
    for k, value in zip(ks, log_pmf(np.array(ks), n, 0.5), strict=True):
        count = math.comb(n, k)
        drop = count.bit_length() - 60
        # comb = mantissa * 2^drop (mantissa exact to 2^-60), and drop - n is small.
        expected = math.log(count >> drop) + (drop - n) * math.log(2)
        assert value == pytest.approx(expected, abs=1e-12)


def test_outside_support_is_zero() -> None:
    assert np.all(pmf(np.array([-1, 6, 100]), 5, 0.3) == 0)
    assert pmf(np.array([0]), 0, 0.3)[0] == 1.0
    assert pmf(np.array([0, 5]), 5, 0.3) == pytest.approx([0.7**5, 0.3**5], rel=1e-14)


@pytest.mark.parametrize(
    ("start", "count", "n", "p"), [(0, 41, 40, 0.5), (100, 3000, 5000, 0.3), (7, 3, 9, 0.9)]
)
def test_pmf_run_matches_pointwise_values(start: int, count: int, n: int, p: float) -> None:
    run = pmf_run(start, count, n, p)
    ks = np.arange(start, start + count)
    pointwise = pmf(ks, n, p)
    mask = pointwise > 1e-250
    assert np.allclose(run[mask], pointwise[mask], rtol=1e-11, atol=0)
    assert np.all(run[ks > n] == 0)


@pytest.mark.parametrize(("n", "q"), [(10, 0.5), (999, 0.001), (99_999, math.exp(-4)), (10**6, 0.9)])
def test_chernoff_window_bounds_the_dropped_mass(n: int, q: float) -> None:
    lo, hi, neglected = chernoff_window(n, q, 46.0)
    assert 0 <= lo <= n * q <= hi <= n
    dropped = float(binom.cdf(lo - 1, n, q) + binom.sf(hi, n, q))
    assert dropped <= neglected + 1e-300
    assert neglected <= 2 * math.exp(-46.0) * 1.0000001


def test_kl_bernoulli() -> None:
    assert kl_bernoulli(0.5, 0.5) == 0
    assert kl_bernoulli(0.0, 0.25) == pytest.approx(math.log(4 / 3))
    assert kl_bernoulli(1.0, 0.25) == pytest.approx(math.log(4))
