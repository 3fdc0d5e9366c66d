"""FMT 2021 clone reduction computed exactly: against brute force, the README bracket, shape, speed."""

from __future__ import annotations

import itertools
import math
import time
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import binom

from deniable.core.accounting import FMT21NumericalClones
from deniable.core.amplification._mixtures import clone_delta


def hockey(p: list[Fraction], q: list[Fraction], e: Fraction) -> Fraction:
    """D_e(p || q) = sum of the positive parts, exactly."""
    return sum((max(a - e * b, Fraction(0)) for a, b in zip(p, q, strict=True)), Fraction(0))


def brute_clone_delta(eps: float, eps0: float, n: int) -> Fraction:
    """Sum over c of P[C = c] max(D(P_c||Q_c), D(Q_c||P_c)), pmfs by explicit enumeration of the
    c clone coins and the victim's coin, all in exact rationals (floats only for eps, eps0)."""
    e = Fraction(math.exp(eps))
    e0 = Fraction(math.exp(eps0))
    alpha = e0 / (e0 + 1)
    clone = Fraction(math.exp(-eps0))
    total = Fraction(0)
    for c in range(n):
        p = [Fraction(0)] * (c + 2)
        q = [Fraction(0)] * (c + 2)
        for coins in itertools.product((0, 1), repeat=c):
            weight = Fraction(1, 2**c)
            heads = sum(coins)
            p[heads] += alpha * weight
            p[heads + 1] += (1 - alpha) * weight
            q[heads] += (1 - alpha) * weight
            q[heads + 1] += alpha * weight
        w = math.comb(n - 1, c) * clone**c * (1 - clone) ** (n - 1 - c)
        total += w * max(hockey(p, q, e), hockey(q, p, e))
    return total


def scipy_clone_delta(eps: float, eps0: float, n: int) -> float:
    """The same sum with scipy pmfs and explicit positive parts (no CDF shortcut)."""
    e = math.exp(eps)
    alpha = math.exp(eps0) / (math.exp(eps0) + 1)
    total = 0.0
    for c in range(n):
        b = binom.pmf(np.arange(c + 1), c, 0.5)
        lower, upper = np.append(b, 0.0), np.insert(b, 0, 0.0)
        p = alpha * lower + (1 - alpha) * upper
        q = (1 - alpha) * lower + alpha * upper
        both = max(np.maximum(p - e * q, 0).sum(), np.maximum(q - e * p, 0).sum())
        total += float(binom.pmf(c, n - 1, math.exp(-eps0))) * both
    return total


@pytest.mark.parametrize("n", [1, 2, 3, 7, 12])
@pytest.mark.parametrize("eps0", [0.5, 2.0])
def test_matches_exact_rational_enumeration(n: int, eps0: float) -> None:
    for eps in (0.0, 0.05, 0.3, 0.9 * eps0):
        ours = FMT21NumericalClones(eps0, n).delta_for_epsilon(eps)
        exact = float(brute_clone_delta(eps, eps0, n))
        assert ours >= exact * (1 - 1e-12)
        assert ours == pytest.approx(exact, rel=1e-8, abs=1e-15)


@pytest.mark.parametrize("n", [20, 41, 60])
@pytest.mark.parametrize("eps0", [0.3, 1.0, 3.0])
def test_matches_scipy_enumeration(n: int, eps0: float) -> None:
    for eps in (0.01, 0.1, 0.4, 0.8 * eps0):
        ours = FMT21NumericalClones(eps0, n).delta_for_epsilon(eps)
        reference = scipy_clone_delta(eps, eps0, n)
        assert ours == pytest.approx(reference, rel=1e-8, abs=1e-14)


def test_fmt_readme_bracket() -> None:
    """apple/ml-shuffling-amplification README: n=1e5, eps0=4, delta=1e-6 lies in [0.16754, 0.17279]."""
    eps = FMT21NumericalClones(4.0, 100_000).epsilon_for_delta(1e-6)
    assert 0.16754 <= eps <= 0.17279
    assert FMT21NumericalClones(4.0, 100_000).delta_for_epsilon(eps) <= 1e-6


def test_directions_are_symmetric() -> None:
    """x -> c+1-x maps P_c to Q_c, so one direction is enough: check it numerically at n = 60."""
    e, alpha = math.exp(0.2), math.exp(1.5) / (math.exp(1.5) + 1)
    for c in (0, 1, 10, 59):
        b = binom.pmf(np.arange(c + 1), c, 0.5)
        lower, upper = np.append(b, 0.0), np.insert(b, 0, 0.0)
        p = alpha * lower + (1 - alpha) * upper
        q = (1 - alpha) * lower + alpha * upper
        assert np.maximum(p - e * q, 0).sum() == pytest.approx(np.maximum(q - e * p, 0).sum(), rel=1e-12)


@pytest.mark.parametrize(("eps0", "n"), [(0.5, 100), (2.0, 10_000), (4.0, 1_000_000)])
def test_profile_decreases_in_epsilon_and_vanishes_at_eps0(eps0: float, n: int) -> None:
    analysis = FMT21NumericalClones(eps0, n)
    grid = np.linspace(0, eps0, 41)
    values = [analysis.delta_for_epsilon(float(eps)) for eps in grid]
    assert all(b <= a for a, b in itertools.pairwise(values))
    assert values[-1] == 0.0
    assert 0 < values[0] <= 1


def test_profile_decreases_in_n() -> None:
    deltas = [FMT21NumericalClones(1.0, n).delta_for_epsilon(0.1) for n in (10, 100, 1000, 10_000, 100_000)]
    assert all(b < a for a, b in itertools.pairwise(deltas))


def test_truncated_sum_is_an_upper_bound() -> None:
    """The Chernoff-truncated sum (plus its dropped mass) is never below the full scipy sum."""
    for n, eps0, eps in ((400, 1.0, 0.2), (1500, 2.0, 0.15)):
        ours = clone_delta(eps, math.exp(eps0) / (math.exp(eps0) + 1), n - 1, math.exp(-eps0), 1.0)
        reference = scipy_clone_delta(eps, eps0, n)
        assert ours >= reference * (1 - 1e-12)
        assert ours == pytest.approx(reference, rel=1e-8)


def test_epsilon_search_lands_within_tolerance_from_above() -> None:
    analysis = FMT21NumericalClones(1.0, 50_000)
    eps = analysis.epsilon_for_delta(1e-6)
    assert analysis.delta_for_epsilon(eps) <= 1e-6
    assert analysis.delta_for_epsilon(eps * (1 - 2e-6)) > 1e-6


def test_a_million_reports_in_about_a_second() -> None:
    start = time.process_time()
    for eps0 in (0.5, 1.0, 4.0):
        FMT21NumericalClones(eps0, 1_000_000).epsilon_for_delta(1e-6)
    assert (time.process_time() - start) / 3 < 1.5
