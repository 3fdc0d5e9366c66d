"""Exact profile of shuffled binary randomised response, against brute force over neighbouring pairs."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import binom

from deniable.core.accounting import BinaryRRExact, realised_probabilities
from deniable.core.amplification._binary_rr import exact_delta, exact_epsilon
from deniable.core.amplification.analyses import GRID_TOLERANCE


def count_law(bits: tuple[int, ...], keep: Fraction) -> list[Fraction]:
    """Exact law of the number of ones among the randomised reports of these bits."""
    law = [Fraction(1)]
    for bit in bits:
        one = keep if bit else 1 - keep
        nxt = [Fraction(0)] * (len(law) + 1)
        for ones, prob in enumerate(law):
            nxt[ones] += prob * (1 - one)
            nxt[ones + 1] += prob * one
        law = nxt
    return law


def brute_profile(keep: Fraction, n: int, eps: float) -> Fraction:
    """sup over every dataset in {0,1}^n and every one-position change of D_{e^eps}, exactly."""
    e = Fraction(math.exp(eps))
    worst = Fraction(0)
    for data in itertools.product((0, 1), repeat=n):
        p = count_law(data, keep)
        for i in range(n):
            q = count_law((*data[:i], 1 - data[i], *data[i + 1 :]), keep)
            worst = max(
                worst, sum((max(a - e * b, Fraction(0)) for a, b in zip(p, q, strict=True)), Fraction(0))
            )
    return worst


def scipy_profile_per_configuration(keep: float, n: int, eps: float) -> np.ndarray:
    """D_{e^eps}, both directions, for each number m of ones among the others (scipy pmfs)."""
    e, out = math.exp(eps), []
    for m in range(n):
        y = np.convolve(
            binom.pmf(np.arange(m + 1), m, keep), binom.pmf(np.arange(n - m), n - 1 - m, 1 - keep)
        )
        lower, upper = np.append(y, 0.0), np.insert(y, 0, 0.0)
        one = keep * upper + (1 - keep) * lower
        zero = (1 - keep) * upper + keep * lower
        out.append(max(np.maximum(one - e * zero, 0).sum(), np.maximum(zero - e * one, 0).sum()))
    return np.array(out)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7])
@pytest.mark.parametrize("eps0", [0.7, 2.0])
def test_matches_brute_force_over_all_neighbouring_datasets(n: int, eps0: float) -> None:
    keep = realised_probabilities("binary_rr", eps0, 2)[0]
    for eps in (0.0, 0.1, 0.4, 0.9 * eps0):
        ours = exact_delta(float(keep), n, eps)
        brute = float(brute_profile(keep, n, eps))
        assert ours >= brute - 1e-15
        assert ours == pytest.approx(brute, rel=1e-9, abs=1e-14)


@pytest.mark.parametrize(
    ("n", "eps0", "delta"), [(4, 1.0, 0.05), (6, 2.0, 0.01), (7, 3.0, 0.1), (7, 0.5, 1e-3)]
)
def test_exact_epsilon_is_not_below_brute_force(n: int, eps0: float, delta: float) -> None:
    """Brute force over all neighbouring pairs certifies our eps, and nothing 1e-5 smaller."""
    keep = realised_probabilities("binary_rr", eps0, 2)[0]
    ours = exact_epsilon(float(keep), n, delta)
    assert 0 < ours < eps0
    assert brute_profile(keep, n, ours) <= delta
    assert brute_profile(keep, n, ours * (1 - 1e-5)) > delta


@pytest.mark.parametrize("n", [10, 33, 60])
@pytest.mark.parametrize("eps0", [0.5, 1.5, 4.0])
def test_matches_scipy_worst_case_over_all_configurations(n: int, eps0: float) -> None:
    keep = math.exp(eps0) / (1 + math.exp(eps0))
    for eps in (0.02, 0.2, 0.6 * eps0):
        reference = scipy_profile_per_configuration(keep, n, eps).max()
        ours = exact_delta(keep, n, eps)
        assert ours >= reference * (1 - 1e-12)
        assert ours == pytest.approx(reference, rel=1e-8, abs=1e-12)


def test_the_worst_configuration_is_not_always_an_extreme() -> None:
    """Why every m is evaluated: here m = 3 ones among 4 others beats m = 0 and m = 4 by 15%."""
    keep = math.exp(1.0) / (1 + math.exp(1.0))
    per_m = scipy_profile_per_configuration(keep, 5, 1 / 7)
    assert per_m.argmax() not in (0, 4)
    assert per_m.max() > 1.1 * max(per_m[0], per_m[-1])
    assert exact_delta(keep, 5, 1 / 7) == pytest.approx(per_m.max(), rel=1e-9)


def test_extremes_are_near_worst_but_not_exactly_at_realistic_delta() -> None:
    """n = 1000, eps0 = 2, delta = 1e-6: m = 2 (not 0) is the worst; the gap is tiny but real."""
    keep = math.exp(2.0) / (1 + math.exp(2.0))
    at_extremes = exact_epsilon(keep, 1000, 1e-6, band=0)
    overall = exact_epsilon(keep, 1000, 1e-6)
    assert overall > at_extremes
    assert overall == pytest.approx(at_extremes, rel=1e-3)


def test_uses_the_realised_keep_probability() -> None:
    """The accountant passes the randomiser's own keep probability (floored below e/(1+e))."""
    from deniable.core.accounting import analyses_for

    keep = realised_probabilities("binary_rr", 1.0, 2)[0]
    assert keep <= Fraction(math.exp(1.0) / (1 + math.exp(1.0))) + Fraction(1, 2**60)
    exact = [a for a in analyses_for(1.0, 500, "binary_rr") if isinstance(a, BinaryRRExact)]
    assert len(exact) == 1
    assert exact[0].keep == float(keep)


def test_monotone_in_n_and_beyond_the_budget_the_search_runs_at_n() -> None:
    """Contract changed by issue 9 item 5: beyond the budget the analysis runs at n, not n' < n."""
    values = [BinaryRRExact(1.0, n).epsilon_for_delta(1e-6) for n in (10, 100, 1000, 3000)]
    assert all(b < a for a, b in itertools.pairwise(values))
    capped = BinaryRRExact(1.0, 3000, max_work=200_000)
    assert not capped.exhaustive and capped.evaluated_n == 3000
    assert "n'=" not in capped.detail() and "configuration search" in capped.detail()
    searched = capped.epsilon_for_delta(1e-6)
    assert values[-1] <= searched <= values[-1] * (1 + GRID_TOLERANCE)


def test_profile_decreases_in_epsilon() -> None:
    analysis = BinaryRRExact(2.0, 800)
    values = [analysis.delta_for_epsilon(float(e)) for e in np.linspace(0, 2.0, 30)]
    assert all(b <= a + 1e-15 for a, b in itertools.pairwise(values))
    assert values[-1] == 0.0


def test_delta_too_small_for_the_numerics_is_refused() -> None:
    from deniable.core.accounting import NotApplicable

    with pytest.raises(NotApplicable):
        BinaryRRExact(1.0, 1000).epsilon_for_delta(1e-13)


@pytest.mark.slow
@pytest.mark.parametrize("n", [150, 300])
def test_slow_matches_scipy_at_larger_n(n: int) -> None:
    keep = math.exp(2.0) / (1 + math.exp(2.0))
    for eps in (0.05, 0.3):
        reference = scipy_profile_per_configuration(keep, n, eps).max()
        assert exact_delta(keep, n, eps) == pytest.approx(reference, rel=1e-8, abs=1e-12)
