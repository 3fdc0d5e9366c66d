"""cheu_binary_sum: gamma from the exact shuffled profile, exact laws, shuffled privacy, estimator.

The privacy check is on the SHUFFLED output: the aggregator sees only the number of ones K. For
n <= 6 and every configuration of the other users' bits, the exact law of K for the victim's
bit 1 vs 0 is computed with Fractions and its hockey-stick divergence at the claimed epsilon
(e^eps bounded from below, so the computed divergence is an upper bound) must not exceed the
claimed delta. Statistical assertions state their false-failure rates.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats
from support.stats import created

from deniable.core import mechanisms
from deniable.core.amplification.protocols import GRID, cheu_guarantee
from deniable.core.mechanisms.cheu_binary import CheuBinarySum
from deniable.core.mechanisms.exact import exp_lower_bound
from deniable.v1 import deniable_pb2 as pb

ALPHA = 1e-6  # false-failure rate of each statistical assertion


def build(eps: float = 1.0, **params: float) -> CheuBinarySum:
    return created(CheuBinarySum, epsilon0=eps, domain_size=2, **params)


# --------------------------------------------------------------------------- parameters


def test_gamma_is_the_smallest_meeting_the_target_with_the_exact_analysis() -> None:
    mech = build(1.0, expected_n=1000.0, delta=1e-6)
    assert mech.central_guarantee(1000, 1e-6).epsilon <= 1.0
    smaller = mech.flip * Fraction(63, 64)
    assert cheu_guarantee(smaller, 1000, 1e-6).epsilon > 1.0
    assert mech.flip.denominator <= GRID  # a multiple of 2**-52: exact as a double parameter
    assert mech.keep_probability == 1 - mech.flip / 2 and mech.other_probability == mech.flip / 2
    assert mech.local_epsilon == pytest.approx(math.log((2 - mech.flip) / mech.flip))
    # The exact profile needs less noise than the local guarantee alone would: eps_L > target.
    assert mech.local_epsilon > 1.0


def test_registry_round_trip_from_float_params() -> None:
    mech = build(1.0, expected_n=1000.0, delta=1e-6)
    assert mechanisms.name_for_proto(pb.CHEU_BINARY_SUM) == "cheu_binary_sum"
    params = mech.parameters()
    assert set(params) == {"expected_n", "delta", "flip_probability"}
    again = build(1.0, **{k: float(v) for k, v in params.items()})
    assert again.flip == mech.flip and again.expected_n == 1000
    assert not mech.local_privacy and not mech.multi_message


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"expected_n": 1.0},
        {"expected_n": 100.5},
        {"expected_n": 1000.0, "delta": 1.0},
        {"expected_n": 1000.0, "flip_probability": 0.0},
        {"expected_n": 1000.0, "flip_probability": 1.5},
        {"expected_n": 1000.0, "other": 1.0},
    ],
)
def test_bad_parameters_are_value_errors(params: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        build(1.0, **params)


def test_domain_must_be_binary() -> None:
    with pytest.raises(ValueError):
        mechanisms.create("cheu_binary_sum", epsilon0=1.0, domain_size=3, expected_n=100.0)


# --------------------------------------------------------------------------- exact laws


@pytest.mark.parametrize("vectorised", [False, True])
def test_randomise_fits_its_exact_law(vectorised: bool) -> None:
    """100,000 reports of each bit; exact binomial acceptance region for the flips; false-failure
    rate 1e-6 per bit."""
    mech = build(1.0, expected_n=1000.0, flip_probability=0.25)
    assert mech.output_distribution(1) == {b"\x01": Fraction(7, 8), b"\x00": Fraction(1, 8)}
    n = 100_000
    for bit in (0, 1):
        reports = mech.randomise_many([bit] * n) if vectorised else [mech.randomise(bit) for _ in range(n)]
        assert set(reports) <= {b"\x00", b"\x01"}
        flips = sum(r != bytes((bit,)) for r in reports)
        assert stats.binom.ppf(ALPHA / 2, n, 0.125) <= flips <= stats.binom.isf(ALPHA / 2, n, 0.125)


# --------------------------------------------------------------------------- shuffled privacy


def binomial_law(m: int, p: Fraction) -> list[Fraction]:
    return [math.comb(m, k) * p**k * (1 - p) ** (m - k) for k in range(m + 1)]


def convolve(a: list[Fraction], b: list[Fraction]) -> list[Fraction]:
    out = [Fraction(0)] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            out[i + j] += x * y
    return out


def shuffled_count_law(n: int, ones_among_others: int, victim: int, keep: Fraction) -> list[Fraction]:
    """Exact law of K = number of ones among n shuffled reports."""
    others = convolve(
        binomial_law(ones_among_others, keep), binomial_law(n - 1 - ones_among_others, 1 - keep)
    )
    victim_law = [1 - keep, keep] if victim else [keep, 1 - keep]
    return convolve(others, victim_law)


def worst_divergence(n: int, keep: Fraction, factor: Fraction) -> Fraction:
    worst = Fraction(0)
    for m in range(n):
        one, zero = shuffled_count_law(n, m, 1, keep), shuffled_count_law(n, m, 0, keep)
        for p, q in ((one, zero), (zero, one)):
            worst = max(
                worst, sum((max(Fraction(0), a - factor * b) for a, b in zip(p, q, strict=True)), Fraction(0))
            )
    return worst


@pytest.mark.parametrize("flip", [0.25, 0.5, 0.8])
@pytest.mark.parametrize("delta", [1e-3, 0.05])
def test_shuffled_count_meets_the_claimed_guarantee_exactly(flip: float, delta: float) -> None:
    mech = build(1.0, expected_n=1000.0, flip_probability=flip)
    keep = mech.keep_probability
    amplified = 0
    for n in range(2, 7):
        claim = mech.central_guarantee(n, delta)
        assert claim.epsilon <= mech.local_epsilon + 1e-12
        amplified += claim.amplified
        assert worst_divergence(n, keep, exp_lower_bound(claim.epsilon)) <= Fraction(claim.delta)
    assert amplified > 0  # some n actually amplifies: the check is not only of the local bound


def test_claiming_less_than_the_exact_profile_is_refuted() -> None:
    """Teeth: 10% less epsilon than the exact analysis gives at n = 6 is refuted exactly."""
    mech = build(1.0, expected_n=1000.0, flip_probability=0.5)
    claim = mech.central_guarantee(6, 0.05)
    assert claim.amplified
    assert worst_divergence(6, mech.keep_probability, exp_lower_bound(0.9 * claim.epsilon)) > Fraction(0.05)


# --------------------------------------------------------------------------- estimator


def test_estimator_unbiased_exact_variance_and_coverage() -> None:
    """4,000 rounds of 5,000 reports, counts from the exact law (numpy, seeded: the simulation of
    the truth side only). Mean, variance (chi-square band) and 95% CI coverage as in
    test_mechanisms_statistical.check_estimator; Bonferroni over 3 checks x 2 buckets, total
    false-failure rate 1e-6."""
    mech = build(1.0, expected_n=5000.0, delta=1e-6)
    truth = np.array([3500, 1500])
    n, rounds = int(truth.sum()), 4000
    keep = float(mech.keep_probability)
    generator = np.random.default_rng(20_261_103)
    ones = generator.binomial(truth[1], keep, rounds) + generator.binomial(truth[0], 1 - keep, rounds)
    estimates = np.empty((rounds, 2))
    covered = np.zeros(2, dtype=np.int64)
    for r in range(rounds):
        rows = mech.estimate([n - int(ones[r]), int(ones[r])], n)
        estimates[r] = [row.estimate for row in rows]
        covered += [row.ci_low <= x <= row.ci_high for row, x in zip(rows, truth, strict=True)]
    variance = mech.variance(truth, n)
    gamma = float(mech.flip)
    assert variance == pytest.approx(n * (gamma / 2) * (1 - gamma / 2) / (1 - gamma) ** 2, rel=1e-12)
    level = ALPHA / 6
    z = float(stats.norm.isf(level / 2))
    assert np.all(np.abs(estimates.mean(axis=0) - truth) <= z * np.sqrt(variance / rounds))
    ratio = estimates.var(axis=0, ddof=1) / variance
    lo = stats.chi2.ppf(level / 2, rounds - 1) / (rounds - 1)
    hi = stats.chi2.isf(level / 2, rounds - 1) / (rounds - 1)
    assert np.all((lo <= ratio) & (ratio <= hi))
    cov_lo, cov_hi = stats.binom.ppf(level / 2, rounds, 0.95), stats.binom.isf(level / 2, rounds, 0.95)
    assert np.all((cov_lo <= covered) & (covered <= cov_hi))


def test_estimator_through_the_real_randomiser() -> None:
    """200 rounds of 4,000 real reports: mean of the ones estimate within 5.3 sigma (one test at
    about 1e-7) and nothing invalid."""
    mech = build(1.0, expected_n=4000.0, delta=1e-6)
    values = [1] * 1000 + [0] * 3000
    ests = []
    for _ in range(200):
        tally = mech.tally(mech.randomise_many(values))
        assert not tally.invalid.any()
        ests.append(mech.estimate(tally.counts.tolist(), 4000)[1].estimate)
    sd = math.sqrt(float(mech.variance([3000, 1000], 4000)[1]) / 200)
    assert abs(float(np.mean(ests)) - 1000) <= 5.3 * sd
