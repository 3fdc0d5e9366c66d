"""Exact samplers of the CSPRNG: Bernoulli(exp(-gamma)), geometric, discrete Laplace, Bernoulli arrays.

Each law is checked with a Pearson chi-square goodness-of-fit test against the exact
probabilities (cells with small expectation pooled into a tail cell). Every statistical
assertion states its false-failure rate: the probability that a correct sampler fails it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from deniable.core.rng import Csprng, default_rng

ALPHA = 1e-6  # false-failure rate of each statistical assertion


def fits(observed: Counter[int], law: Callable[[int], float], support: range, alpha: float = ALPHA) -> bool:
    """Chi-square fit of integer samples to ``law``: one cell per k in ``support`` expected at least
    10 times, and one cell pooling every other outcome (grown until expected at least 5 times)."""
    n = sum(observed.values())
    assert all(isinstance(k, int) for k in observed), "non-integer outcome"
    kept = [k for k in support if n * law(k) >= 10]
    while kept and n * (1 - sum(law(k) for k in kept)) < 5:
        kept.pop()  # pool the smallest kept cell into the tail until the tail is large enough
    expected = [n * law(k) for k in kept]
    counts = [observed.get(k, 0) for k in kept]
    cells_e = [*expected, n - sum(expected)]
    cells_o = [*counts, n - sum(counts)]
    assert len(kept) >= 2 and cells_e[-1] >= 5, "test mis-sized"
    statistic = sum((o - e) ** 2 / e for o, e in zip(cells_o, cells_e, strict=True))
    return statistic <= float(stats.chi2.isf(alpha, len(cells_e) - 1))


def binomial_ok(successes: int, trials: int, p: float, alpha: float = ALPHA) -> bool:
    """Exact two-sided binomial acceptance region at level alpha."""
    lo = int(stats.binom.ppf(alpha / 2, trials, p))
    hi = int(stats.binom.isf(alpha / 2, trials, p))
    return lo <= successes <= hi


# --------------------------------------------------------------------------- Bernoulli(exp(-gamma))


@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(5, 2), Fraction(7, 2)])
def test_bernoulli_exp_has_probability_exp_minus_gamma(gamma: Fraction) -> None:
    """20,000 draws; exact binomial acceptance region, false-failure rate 1e-6."""
    rng = default_rng()
    trials = 20_000
    successes = sum(rng.bernoulli_exp(gamma) for _ in range(trials))
    assert binomial_ok(successes, trials, math.exp(-gamma))


def test_bernoulli_exp_zero_is_certain_and_rejects_negative() -> None:
    rng = default_rng()
    assert all(rng.bernoulli_exp(Fraction(0)) for _ in range(1000))
    with pytest.raises(ValueError):
        rng.bernoulli_exp(Fraction(-1, 2))


def test_bernoulli_exp_detects_a_wrong_probability() -> None:
    """Teeth: 60,000 draws at gamma = 1/3 fall outside the acceptance region for exp(-0.36)
    (0.0189 away: 10 sigma; the region's half-width is 4.9 sigma), unless the draw deviates by
    over 5.1 sigma: failure rate < 1e-6."""
    rng = default_rng()
    trials = 60_000
    successes = sum(rng.bernoulli_exp(Fraction(1, 3)) for _ in range(trials))
    assert not binomial_ok(successes, trials, math.exp(-0.36))


# --------------------------------------------------------------------------- geometric


def geometric_law(scale: Fraction) -> Callable[[int], float]:
    rate = 1 / float(scale)
    return lambda x: -math.expm1(-rate) * math.exp(-rate * x) if x >= 0 else 0.0


@pytest.mark.parametrize("scale", [Fraction(1, 2), Fraction(1), Fraction(3), Fraction(10, 3)])
def test_geometric_fits_its_exact_law(scale: Fraction) -> None:
    """12,000 draws, a cell per value expected >= 10 times and a pooled tail; false-failure 1e-6."""
    rng = default_rng()
    samples = Counter(rng.geometric(scale) for _ in range(12_000))
    assert min(samples) >= 0
    assert fits(samples, geometric_law(scale), range(60))


def test_geometric_rejects_a_non_positive_scale() -> None:
    with pytest.raises(ValueError):
        default_rng().geometric(Fraction(0))
    with pytest.raises(ValueError):
        default_rng().geometric(Fraction(-2))


# --------------------------------------------------------------------------- discrete Laplace


def laplace_law(scale: Fraction) -> Callable[[int], float]:
    rate = 1 / float(scale)
    norm = math.tanh(rate / 2)  # (1 - e^-r) / (1 + e^-r)
    return lambda z: norm * math.exp(-rate * abs(z))


@pytest.mark.parametrize("scale", [Fraction(1), Fraction(5, 2)])
def test_discrete_laplace_fits_its_exact_law(scale: Fraction) -> None:
    """12,000 draws, a cell per value expected >= 10 times and a pooled tail; false-failure 1e-6."""
    rng = default_rng()
    samples = Counter(rng.discrete_laplace(scale) for _ in range(12_000))
    assert fits(samples, laplace_law(scale), range(-40, 41))


def test_discrete_laplace_is_symmetric_and_rejects_the_law_of_a_doubled_zero() -> None:
    """Teeth: the sampler without the "negative zero" rejection would put mass
    2 tanh(r/2) / (1 + ...) at 0; the fit to the correct law passes (false-failure 1e-6) and the
    fit to the law with zero counted twice fails (its zero cell is off by ~40 sigma at scale 1)."""
    rng = default_rng()
    scale = Fraction(1)
    samples = Counter(rng.discrete_laplace(scale) for _ in range(12_000))
    good = laplace_law(scale)
    rate = 1.0
    # Magnitude geometric, sign fair, zero not rejected: P(0) = 1 - e^-r, P(z) = (1 - e^-r) e^-r|z| / 2.
    wrong = lambda z: -math.expm1(-rate) * (1.0 if z == 0 else 0.5 * math.exp(-rate * abs(z)))  # noqa: E731
    assert fits(samples, good, range(-40, 41))
    assert not fits(samples, wrong, range(-40, 41))


def test_discrete_laplace_many_has_the_same_law() -> None:
    """10,000 draws of the array form; false-failure rate 1e-6."""
    draws = default_rng().discrete_laplace_many(Fraction(2), 10_000)
    assert draws.dtype == np.int64 and draws.shape == (10_000,)
    assert fits(Counter(int(z) for z in draws), laplace_law(Fraction(2)), range(-40, 41))


# --------------------------------------------------------------------------- Bernoulli arrays


@pytest.mark.parametrize("p", [Fraction(0), Fraction(1), Fraction(1, 3), Fraction(3, 1 << 40), Fraction(0.1)])
def test_bernoulli_array_is_exact(p: Fraction) -> None:
    """200,000 draws; exact binomial acceptance region (degenerate p checked exactly);
    false-failure rate 1e-6."""
    draws = default_rng().bernoulli_array(p, 200_000)
    assert draws.dtype == np.bool_
    successes = int(draws.sum())
    if p in (0, 1):
        assert successes == int(p) * 200_000
    else:
        assert binomial_ok(successes, 200_000, float(p))


def test_bernoulli_array_rejects_bad_probabilities() -> None:
    with pytest.raises(ValueError):
        default_rng().bernoulli_array(Fraction(3, 2), 10)
    with pytest.raises(ValueError):
        default_rng().bernoulli_array(Fraction(1, 3 << 62), 10)


def test_keyed_streams_make_the_samplers_reproducible() -> None:
    key = bytes(range(32))
    a, b = Csprng(key), Csprng(key)
    assert [a.discrete_laplace(Fraction(3, 2)) for _ in range(50)] == [
        b.discrete_laplace(Fraction(3, 2)) for _ in range(50)
    ]
