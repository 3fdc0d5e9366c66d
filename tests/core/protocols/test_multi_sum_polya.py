"""multi_message_sum with Polya noise: the exact sampler, the discrete-Laplace total, the estimator.

The sampler is checked against the exact law (``polya_probability``, ``Fraction``), and that law
against its defining property: ``shares`` draws add up to a geometric, so at expected_n devices
the total noise is exactly discrete Laplace. The accountant's float law is checked against the
exact one. The share-splitting, tally and decoder are the same code as the binomial variant
(test_multi_sum.py). Statistical assertions state their false-failure rates.
"""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np
import pytest
from scipy import stats
from support.stats import created

from deniable.core import audit, mechanisms
from deniable.core.amplification.protocols import (
    MULTI_SUM_POLYA,
    multi_sum_guarantee,
    noise_delta,
    polya_difference,
    polya_law,
)
from deniable.core.mechanisms.multi_sum import MultiMessageSum
from deniable.core.rng import Csprng, polya_alpha_bounds, polya_probability
from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:  # the kit fixture's type only
    from support.stats import Kit

ALPHA = 1e-6  # false-failure rate of each statistical assertion


def build(eps: float = 1.0, **params: float) -> MultiMessageSum:
    return created(MultiMessageSum, epsilon0=eps, domain_size=2, **params)


def exact_alpha(nonzero: Fraction, shares: int) -> Fraction:
    return 1 - (1 - nonzero) ** shares


# --------------------------------------------------------------------------- the exact law


@pytest.mark.parametrize(
    ("nonzero", "shares"), [(Fraction(1, 3), 4), (Fraction(1, 1000), 1), (Fraction(7, 2**40), 10**6)]
)
def test_alpha_bounds_bracket_the_exact_value_and_tighten(nonzero: Fraction, shares: int) -> None:
    widths = []
    for precision in (64, 128, 256):
        low, high = polya_alpha_bounds(nonzero, shares, precision)
        if shares <= 1000:
            assert low <= exact_alpha(nonzero, shares) <= high
        assert 0 <= low <= high <= 1
        widths.append(high - low)
    assert widths[2] < widths[1] < widths[0]
    # a from floats agrees with the bracket (10**6-th power: never formed exactly)
    a = -math.expm1(shares * math.log1p(-float(nonzero)))
    assert float(low) == pytest.approx(a, rel=1e-9)


@pytest.mark.parametrize(
    ("nonzero", "shares"), [(Fraction(1, 3), 2), (Fraction(1, 5), 3), (Fraction(2, 7), 5)]
)
def test_shares_draws_add_up_to_exactly_a_geometric(nonzero: Fraction, shares: int) -> None:
    """Convolving ``shares`` copies of the exact NB(1/shares, a) pmf gives (1 - a) a^k exactly
    (indices <= K only need the first K + 1 terms of each factor)."""
    top = 12
    single = [polya_probability(k, nonzero, shares) for k in range(top + 1)]
    assert single[0] == 1 - nonzero  # P[draw = 0] is exactly 1 - nonzero
    total = single
    for _ in range(shares - 1):
        total = [sum((total[i] * single[k - i] for i in range(k + 1)), Fraction(0)) for k in range(top + 1)]
    a = exact_alpha(nonzero, shares)
    assert total == [(1 - a) * a**k for k in range(top + 1)]


def chi_square_against_law(draws: np.ndarray, law: list[Fraction]) -> tuple[float, float]:
    """Pearson statistic of integer draws against an exact pmf on 0..len-1 (the rest lumped)."""
    n = len(draws)
    expected = [n * float(p) for p in law] + [n * float(1 - sum(law, Fraction(0)))]
    counts = Counter(np.minimum(draws, len(law)).tolist())
    observed = [counts.get(k, 0) for k in range(len(law) + 1)]
    statistic = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
    return statistic, float(stats.chi2.isf(ALPHA, len(law)))


def test_sampler_fits_the_exact_law_and_a_wrong_shape_is_rejected() -> None:
    """40,000 CSPRNG draws at nonzero = 1/3, shares = 4 (about 13,000 positive): chi-square
    against the exact pmf (bins 0..11, tail lumped, every expected count >= 5) at 1e-6; the same
    draws must fail against the law of shape 1/5 (a sampler with the wrong shape)."""
    nonzero, shares = Fraction(1, 3), 4
    draws = Csprng().polya_many(nonzero, shares, 40_000)
    assert draws.min() >= 0
    statistic, critical = chi_square_against_law(
        draws, [polya_probability(k, nonzero, shares) for k in range(12)]
    )
    assert statistic <= critical
    wrong, _ = chi_square_against_law(draws, [polya_probability(k, nonzero, 5) for k in range(12)])
    assert wrong > critical


def test_exact_routine_alone_fits_the_law_given_positive() -> None:
    """The table only short-cuts the exact inversion: the exact routine by itself (20,000 draws)
    must fit P[k | k >= 1] (chi-square at 1e-6; bins 1..10, tail lumped)."""
    nonzero, shares = Fraction(1, 3), 4
    rng = Csprng()
    draws = np.array([rng._polya_positive(nonzero, shares) for _ in range(20_000)]) - 1
    law = [polya_probability(k + 1, nonzero, shares) / nonzero for k in range(10)]
    statistic, critical = chi_square_against_law(draws, law)
    assert draws.min() >= 0 and statistic <= critical


def test_sampler_rejects_bad_parameters() -> None:
    rng = Csprng()
    for nonzero, shares in ((Fraction(0), 3), (Fraction(1), 3), (Fraction(1, 2), 0)):
        with pytest.raises(ValueError):
            rng.polya_many(nonzero, shares, 3)


# --------------------------------------------------------------------------- the accountant's law


@pytest.mark.parametrize(("n", "shares"), [(1, 3), (2, 3), (3, 3), (2, 5)])
def test_float_noise_law_matches_the_exact_difference(n: int, shares: int) -> None:
    """polya_law(n, shares, p) against the exact law of the difference of two sums of n draws."""
    nonzero = Fraction(1, 8)
    top = 60  # a <= 0.49 here: the exact sums miss < a^60 < 1e-18 of mass
    single = [polya_probability(k, nonzero, shares) for k in range(top + 1)]
    total = [Fraction(int(k == 0)) for k in range(top + 1)]
    for _ in range(n):
        total = [sum((total[i] * single[k - i] for i in range(k + 1)), Fraction(0)) for k in range(top + 1)]
    offset, pmf, neglected = polya_law(n, shares, float(nonzero))
    assert neglected <= 1e-20 and pmf.sum() == pytest.approx(1.0, abs=1e-12)
    for w in range(-10, 11):
        exact = sum(
            (total[k] * total[k - w] for k in range(max(w, 0), top + 1) if 0 <= k - w <= top), Fraction(0)
        )
        assert pmf[w - offset] == pytest.approx(float(exact), rel=1e-9, abs=1e-300)


def test_total_noise_at_expected_n_is_pure_and_discrete_laplace() -> None:
    """At n = shares the difference is exactly discrete Laplace: ratio a between neighbours, so
    delta is 0 at ln(1/a) and positive just below; fewer devices are less private."""
    shares, nonzero = 1000, 1e-3
    a = -math.expm1(shares * math.log1p(-nonzero))
    offset, pmf, _ = polya_difference(shares, shares, nonzero)
    w = np.arange(pmf.size) + offset
    dlap = (1 - a) / (1 + a) * a ** np.abs(w)
    assert np.allclose(pmf, dlap, rtol=1e-9, atol=1e-25)  # the window edges lose < e^-60
    assert noise_delta(shares, nonzero, math.log(1 / a) * (1 + 1e-9), shares) <= 1e-30
    assert noise_delta(shares, nonzero, math.log(1 / a) * 0.99, shares) > 1e-4
    # more devices: better, evaluated at the real n up to 8 x shares (ADR 0041), then frozen; fewer: worse
    assert noise_delta(5 * shares, nonzero, 0.5, shares) < noise_delta(shares, nonzero, 0.5, shares)
    assert noise_delta(5 * shares, nonzero, 0.5, shares) > noise_delta(8 * shares, nonzero, 0.5, shares)
    assert noise_delta(20 * shares, nonzero, 0.5, shares) == noise_delta(8 * shares, nonzero, 0.5, shares)
    assert noise_delta(shares // 2, nonzero, math.log(1 / a), shares) > 1e-3


# --------------------------------------------------------------------------- the mechanism


def test_defaults_meet_the_target_with_central_accuracy() -> None:
    mech = build(1.0, expected_n=5000.0, delta=1e-6)
    bound = mech.central_guarantee(5000, 1e-6)
    assert bound.amplified and bound.epsilon <= 1.0 and bound.analysis == MULTI_SUM_POLYA
    smaller = float(mech.noise * Fraction(63, 64))
    assert multi_sum_guarantee(5000, smaller, mech.messages, mech.modulus, 1e-6, 5000).epsilon > 1.0
    # the error is the discrete Laplace's: at most the central Laplace's sqrt(2)/eps
    sd = math.sqrt(5000 * mech.noise_variance_per_device)
    a = mech.noise_alpha
    assert sd == pytest.approx(math.sqrt(2 * a) / (1 - a), rel=1e-9)
    assert sd <= math.sqrt(2) and a >= math.exp(-1.0)
    assert mech.central_guarantee(2500, 1e-6).epsilon > 1.2  # half the devices: weaker, stated
    assert mech.central_guarantee(20_000, 1e-6).epsilon <= bound.epsilon


def test_registry_round_trip_and_refusals() -> None:
    mech = build(1.0, expected_n=5000.0, delta=1e-6)
    assert mechanisms.name_for_proto(pb.MULTI_MESSAGE_SUM) == "multi_message_sum"
    again = build(1.0, **{k: float(v) for k, v in mech.parameters().items()})
    assert (again.noise, again.messages, again.modulus) == (mech.noise, mech.messages, mech.modulus)
    with pytest.raises(ValueError, match="too large"):
        build(1.0, expected_n=5000.0, noise_probability=0.5)
    with pytest.raises(ValueError, match="infinite support"):
        mech.output_distribution(0)


def test_estimator_exact_noise_law_and_coverage_through_the_real_randomiser(kit: Kit) -> None:
    """1,500 rounds of 200 real devices (CSPRNG, every message through tally and the decoder) at
    expected_n = 200: the decoded sum minus the truth must be exactly discrete Laplace(a)
    (chi-square, |w| > 4 lumped, every expected count >= 10) and the exact intervals must cover
    at least 95% (one-sided binomial); Bonferroni over the two, total false-failure rate 1e-6."""
    mech = build(1.0, expected_n=200.0, delta=1e-6)
    rounds = 1500
    ones, covers = kit.decoded_sums(mech, [1] * 80 + [0] * 120, rounds)
    noise = np.round(ones).astype(np.int64) - 80
    covered = sum(covers)
    a = mech.noise_alpha
    bins = list(range(-4, 5))
    law = [(1 - a) / (1 + a) * a ** abs(w) for w in bins]
    expected = [rounds * p for p in law] + [rounds * (1 - sum(law))]
    counts = Counter(np.clip(noise, -5, 5).tolist())
    observed = [counts.get(w, 0) for w in bins] + [counts.get(-5, 0) + counts.get(5, 0)]
    statistic = sum((o - e) ** 2 / e for o, e in zip(observed, expected, strict=True))
    assert statistic <= stats.chi2.isf(ALPHA / 2, len(bins))
    assert covered >= stats.binom.ppf(ALPHA / 2, rounds, 0.95)


# --------------------------------------------------------------------------- central audit


def released_sums(mech: MultiMessageSum, truth: int, noisy_devices: int, runs: int) -> np.ndarray:
    """``runs`` releases S + W where ``noisy_devices`` devices each add y - y' (CSPRNG draws)."""
    rng = Csprng()
    out = np.empty(runs, dtype=np.int64)
    chunk = max(1, 1_000_000 // (2 * noisy_devices))
    for start in range(0, runs, chunk):
        rows = min(chunk, runs - start)
        draws = rng.polya_many(mech.noise, mech.expected_n, 2 * noisy_devices * rows)
        sums = draws.reshape(rows, 2, noisy_devices).sum(axis=2)
        out[start : start + rows] = truth + sums[:, 0] - sums[:, 1]
    return out


def central_epsilon_lower_bound(a: np.ndarray, b: np.ndarray, cuts: list[int], delta: float) -> float:
    """Lower confidence bound (level 1 - ALPHA, Clopper-Pearson, Bonferroni over events and
    directions) on max over the events {release >= c} of ln((P_a - delta) / P_b), both ways."""
    level = ALPHA / (4 * len(cuts))
    best = -math.inf
    for cut in cuts:
        xa, xb = int((a >= cut).sum()), int((b >= cut).sum())
        for top, top_n, bottom, bottom_n in ((xa, a.size, xb, b.size), (xb, b.size, xa, a.size)):
            low = audit.clopper_pearson_lower(top, top_n, level) - delta
            if low > 0:
                best = max(best, math.log(low / audit.clopper_pearson_upper(bottom, bottom_n, level)))
    return best


def test_central_audit_never_refutes_the_stated_epsilon_and_catches_half_the_noise() -> None:
    """Neighbouring sums s and s + 1 released with the exact noise of 100 devices (40,000 runs
    each): the audit's lower bound on eps (events {release >= s + t}, t = 0..2) stays below the
    stated central eps (false-failure rate 1e-6). A mutant where only half the devices add noise
    (stated eps unchanged) is refuted: its true ratio at t = 1 is about e^1.5."""
    mech = build(1.0, expected_n=100.0, delta=1e-6)
    claimed = mech.central_guarantee(100, 1e-6).epsilon
    cuts = [40, 41, 42]
    honest = central_epsilon_lower_bound(
        released_sums(mech, 41, 100, 40_000), released_sums(mech, 40, 100, 40_000), cuts, 1e-6
    )
    assert honest <= claimed
    lazy = central_epsilon_lower_bound(
        released_sums(mech, 41, 50, 40_000), released_sums(mech, 40, 50, 40_000), cuts, 1e-6
    )
    assert lazy > claimed
