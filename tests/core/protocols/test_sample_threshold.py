"""sample_and_threshold: parameters, exact laws, the released histogram's privacy, the estimator.

Privacy is checked exactly: for every pair of neighbouring datasets (one user's value replaced)
of up to 6 users over 3 buckets, the hockey-stick divergence of the released (thresholded)
histogram at the claimed epsilon, in exact rational arithmetic with a lower bound on e^eps
(so the computed divergence is an upper bound), is at most the claimed delta. Statistical
assertions state their false-failure rates.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats
from support.stats import created

from deniable.core import mechanisms
from deniable.core.amplification.protocols import sample_threshold_add_delta, sample_threshold_guarantee
from deniable.core.mechanisms.exact import exp_lower_bound
from deniable.core.mechanisms.sample_threshold import (
    MAX_THRESHOLD,
    PLANNING_SHARES,
    PLANNING_TAU_TOLERANCE,
    SampleAndThreshold,
    refusal,
    sample_rate_for,
)
from deniable.v1 import deniable_pb2 as pb

ALPHA = 1e-6  # false-failure rate of each statistical assertion


def build(eps: float = 20.0, d: int = 4, **params: float) -> SampleAndThreshold:
    return created(SampleAndThreshold, epsilon0=eps, domain_size=d, **params)


# --------------------------------------------------------------------------- parameters


def test_registry_round_trip_from_float_params() -> None:
    mech = build(1.0, 5, sample_rate=0.1, threshold=10.0)
    assert mechanisms.name_for_proto(pb.SAMPLE_AND_THRESHOLD) == "sample_and_threshold"
    assert mechanisms.proto_for_name("sample_and_threshold") == pb.SAMPLE_AND_THRESHOLD
    params = mech.parameters()
    assert params == {"sample_rate": 0.1, "threshold": 10.0, "delta": 1e-6}
    again = build(1.0, 5, **{k: float(v) for k, v in params.items()})
    assert (again.rate, again.threshold, again.delta) == (mech.rate, mech.threshold, mech.delta)
    assert not mech.local_privacy and not mech.multi_message
    assert mech.count_cells == 6 and mech.payload_length == 1


def test_refuses_s_to_the_tau_above_delta_with_a_clear_message() -> None:
    with pytest.raises(ValueError, match=r"s\^tau .* > delta"):
        build(20.0, 3, sample_rate=0.5, threshold=3.0, delta=0.1)  # 0.125 > 0.1
    build(20.0, 3, sample_rate=0.5, threshold=4.0, delta=0.1)  # 0.0625 <= 0.1


def test_refuses_parameters_above_the_central_target() -> None:
    guarantee = sample_threshold_guarantee(0.1, 10, 1e-6)
    with pytest.raises(ValueError, match="above the target"):
        build(guarantee.epsilon * 0.99, 3, sample_rate=0.1, threshold=10.0)
    assert build(guarantee.epsilon * 1.01, 3, sample_rate=0.1, threshold=10.0).threshold == 10


def test_smallest_threshold_is_chosen_when_absent() -> None:
    mech = build(1.0, 3, sample_rate=0.1)
    assert mech.guarantee.epsilon <= 1.0
    tau = mech.threshold
    below = sample_threshold_guarantee(0.1, tau - 1, 1e-6)
    assert Fraction(0.1) ** (tau - 1) > Fraction(1e-6) or below.epsilon > 1.0


@pytest.mark.parametrize(
    "params",
    [
        {"sample_rate": 0.0, "threshold": 5.0},
        {"sample_rate": 1.0, "threshold": 5.0},
        {"sample_rate": math.nan, "threshold": 5.0},
        {"sample_rate": 0.1, "threshold": 2.5},
        {"sample_rate": 0.1, "threshold": -1.0},
        {"sample_rate": 0.1, "threshold": 10.0, "delta": 0.0},
        {"sample_rate": 0.1, "threshold": 10.0, "bogus": 1.0},
    ],
)
def test_bad_parameters_are_value_errors(params: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        build(20.0, 3, **params)


# --------------------------------------------------------------------------- planning parameters


@pytest.mark.parametrize(
    ("eps", "delta", "n", "k"), [(1.0, 1e-6, 100_000, 200), (1.0, 1e-6, 20_000, 8), (0.3, 1e-9, 50_000, 5)]
)
def test_planning_parameters_meet_the_target_with_nearly_the_smallest_threshold(
    eps: float, delta: float, n: int, k: int
) -> None:
    """Every proposed (s, tau) is accepted at epsilon0 = target, and tau minus 1/32 of it is refused."""
    proposed = SampleAndThreshold.planning_parameters(eps, delta, n, k)
    assert len(proposed) >= 3
    rates = [p["sample_rate"] for p in proposed]
    assert rates == sorted(set(rates))  # one pair per share, s strictly increasing
    for p in proposed:
        assert set(p) == {"sample_rate", "threshold"}
        s, tau = p["sample_rate"], int(p["threshold"])
        assert p["threshold"] == tau and (s * 2**16).is_integer()  # exact as Campaign.params doubles
        assert Fraction(s) ** tau <= Fraction(delta)
        bound = sample_threshold_guarantee(s, tau, delta)
        assert bound.amplified and bound.epsilon <= eps * (1 + 1e-9)
        assert build(eps, k, sample_rate=s, threshold=float(tau), delta=delta).threshold == tau
        smaller = tau - max(1, math.floor(tau * PLANNING_TAU_TOLERANCE))
        assert refusal(Fraction(s), smaller, delta, eps) is not None, (s, tau)
        # After the first pair, tau stays below the sampled count of a uniform bucket.
        assert p is proposed[0] or tau <= n / k * s
    default = build(eps, k, delta=delta)  # s spends half the target; the smallest tau
    same = [p for p in proposed if p["sample_rate"] == default.sample_rate]
    assert same and same[0]["threshold"] <= default.threshold


def test_planning_parameters_stop_where_a_uniform_bucket_would_be_suppressed() -> None:
    """n/k = 5 reports per bucket: only the smallest share's pair, whose tau suppresses them all."""
    proposed = SampleAndThreshold.planning_parameters(1.0, 1e-6, 1000, 200)
    assert len(proposed) == 1
    assert proposed[0]["sample_rate"] == sample_rate_for(PLANNING_SHARES[0] * 1.0)
    assert proposed[0]["threshold"] > 5


def test_an_impossible_target_yields_no_planning_parameters() -> None:
    """eps = 5e-4: the smallest share's s misses it even at MAX_THRESHOLD (so not a search failure)."""
    eps, delta = 5e-4, 1e-6
    assert SampleAndThreshold.planning_parameters(eps, delta, 100_000, 10) == []
    rate = sample_rate_for(PLANNING_SHARES[0] * eps)
    assert rate > 0
    assert "above the target" in (refusal(Fraction(rate), MAX_THRESHOLD, delta, eps) or "")
    assert SampleAndThreshold.planning_parameters(1e-5, delta, 100_000, 10) == []  # s rounds to 0


# --------------------------------------------------------------------------- exact laws


def test_output_distribution_and_payloads() -> None:
    mech = build(20.0, 3, sample_rate=0.25, threshold=2.0, delta=0.1)
    law = mech.output_distribution(1)
    assert law == {b"\x01": Fraction(1, 4), b"\x03": Fraction(3, 4)}
    assert mech.realised_epsilon == math.inf  # not locally private: the true value is sent


@pytest.mark.parametrize("vectorised", [False, True])
def test_randomise_fits_its_exact_law(vectorised: bool) -> None:
    """40,000 reports of value 2 through randomise / randomise_many; exact binomial acceptance
    region for the number of non-null messages; false-failure rate 1e-6."""
    mech = build(20.0, 3, sample_rate=0.25, threshold=2.0, delta=0.1)
    n = 40_000
    reports = mech.randomise_many([2] * n) if vectorised else [mech.randomise(2) for _ in range(n)]
    counts = Counter(reports)
    assert set(counts) <= {b"\x02", b"\x03"}
    lo, hi = stats.binom.ppf(ALPHA / 2, n, 0.25), stats.binom.isf(ALPHA / 2, n, 0.25)
    assert lo <= counts[b"\x02"] <= hi


def test_tally_flags_malformed_payloads() -> None:
    mech = build(20.0, 3, sample_rate=0.25, threshold=2.0, delta=0.1)
    payloads = [b"\x00", b"\x01", b"\x02", b"\x03", b"\x04", b"\xff", b"", b"\x00\x00", b"\x03"]
    tally = mech.tally(payloads)
    assert tally.invalid.tolist() == [False] * 4 + [True] * 4 + [False]
    assert tally.counts.tolist() == [1, 1, 1, 2]
    assert tally.valid_count == 5


# --------------------------------------------------------------------------- privacy, exactly


def released_law(counts: tuple[int, ...], s: Fraction, tau: int) -> dict[tuple[int, ...], Fraction]:
    """Exact law of the released histogram: each bucket Bin(m_j, s), zeroed at or below tau."""
    per_bucket = []
    for m in counts:
        law: dict[int, Fraction] = {}
        for c in range(m + 1):
            p = math.comb(m, c) * s**c * (1 - s) ** (m - c)
            key = c if c > tau else 0
            law[key] = law.get(key, Fraction(0)) + p
        per_bucket.append(law)
    out: dict[tuple[int, ...], Fraction] = {}
    for combo in itertools.product(*(sorted(law.items()) for law in per_bucket)):
        outcome = tuple(k for k, _ in combo)
        out[outcome] = out.get(outcome, Fraction(0)) + math.prod((p for _, p in combo), start=Fraction(1))
    return out


def hockey(
    p: dict[tuple[int, ...], Fraction], q: dict[tuple[int, ...], Fraction], factor: Fraction
) -> Fraction:
    return sum((max(Fraction(0), pv - factor * q.get(k, Fraction(0))) for k, pv in p.items()), Fraction(0))


def neighbouring_histograms(n: int, d: int) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Every (histogram, histogram with one user moved to another bucket) over d buckets."""
    pairs = []
    for cut in itertools.combinations(range(n + d - 1), d - 1):
        bounds = (-1, *cut, n + d - 1)
        hist = tuple(bounds[i + 1] - bounds[i] - 1 for i in range(d))
        for a, b in itertools.permutations(range(d), 2):
            if hist[a] > 0:
                moved = list(hist)
                moved[a] -= 1
                moved[b] += 1
                pairs.append((hist, tuple(moved)))
    return pairs


@pytest.mark.parametrize(("s", "tau", "delta"), [(0.5, 2, 0.3), (0.5, 3, 0.15), (0.25, 2, 0.07)])
def test_released_histogram_meets_the_claimed_guarantee_exactly(s: float, tau: int, delta: float) -> None:
    """All replacement neighbours of n <= 6 users over 3 buckets, exact rational laws."""
    mech = build(64.0, 3, sample_rate=s, threshold=float(tau), delta=delta)
    claim = mech.central_guarantee(6, delta)
    assert claim.amplified and claim.delta == delta
    factor = exp_lower_bound(claim.epsilon)
    rate = Fraction(s)
    worst = Fraction(0)
    for n in range(1, 7):
        for hist, moved in neighbouring_histograms(n, 3):
            worst = max(worst, hockey(released_law(hist, rate, tau), released_law(moved, rate, tau), factor))
    assert worst <= Fraction(delta)
    assert worst > 0  # the check is not vacuous: something is released


@pytest.mark.parametrize(("s", "tau"), [(0.5, 2), (0.25, 1), (0.1, 3)])
def test_add_one_user_profile_matches_brute_force(s: float, tau: int) -> None:
    """The analysis's sup over m of D(T(Bin(m+1, s)) || T(Bin(m, s))) against exact Fractions for
    m < 60: never below any of them, and equal (to 1e-9) where the worst m lies inside."""
    rate = Fraction(s)
    for eps in (0.3, 0.8, 1.5):
        factor = exp_lower_bound(eps)
        brute = [
            hockey(released_law((m + 1,), rate, tau), released_law((m,), rate, tau), factor)
            for m in range(60)
        ]
        claimed = sample_threshold_add_delta(s, tau, eps)
        assert claimed >= float(max(brute)) * (1 - 1e-12)
        if int(np.argmax([float(b) for b in brute])) < 50:
            assert claimed == pytest.approx(float(max(brute)), rel=1e-8)


def test_delta_below_s_to_the_tau_plus_one_is_impossible_and_refused() -> None:
    """Teeth for the refusal rule: tau + 1 users sharing a value are all released with
    probability s^(tau+1) whatever epsilon, so the exact divergence at eps = 30 is at least
    s^(tau+1); the analysis then says "not applicable" and the constructor refuses."""
    s, tau = 0.5, 2
    rate = Fraction(s)
    worst = max(
        hockey(released_law(hist, rate, tau), released_law(moved, rate, tau), exp_lower_bound(30.0))
        for n in range(1, 5)
        for hist, moved in neighbouring_histograms(n, 3)
    )
    assert worst >= rate ** (tau + 1)
    assert not sample_threshold_guarantee(s, tau, 0.1).amplified
    assert math.isinf(sample_threshold_guarantee(s, tau, 0.1).epsilon)
    with pytest.raises(ValueError):
        build(64.0, 3, sample_rate=s, threshold=float(tau), delta=0.1)


def test_guarantee_does_not_depend_on_n_and_states_what_it_covers() -> None:
    mech = build(1.0, 3, sample_rate=0.1, threshold=10.0)
    a, b = mech.central_guarantee(10, 1e-6), mech.central_guarantee(10**6, 1e-6)
    assert a == b and a.amplified
    assert "released histogram" in a.note
    # the two buckets composed jointly (ADR 0041): never above eps_add + ln(1/(1-s)), the separate composition
    assert a.epsilon <= sample_threshold_guarantee(0.1, 10, 1e-6).epsilon


# --------------------------------------------------------------------------- estimator


def exact_moments(x: int, s: float, tau: int) -> tuple[float, float]:
    """Mean and variance of (c/s) 1{c > tau}, c ~ Bin(x, s), by direct enumeration."""
    c = np.arange(x + 1)
    pmf = stats.binom.pmf(c, x, s)
    value = np.where(c > tau, c / s, 0.0)
    mean = float(pmf @ value)
    return mean, float(pmf @ (value - mean) ** 2)


@pytest.mark.parametrize("truth", [0, 3, 8, 40, 150, 3000])
def test_bias_and_variance_are_exact(truth: int) -> None:
    mech = build(1.0, 3, sample_rate=0.1, threshold=10.0)
    mean, var = exact_moments(truth, 0.1, 10)
    assert float(mech.bias([truth])[0]) == pytest.approx(mean - truth, rel=1e-9, abs=1e-9)
    assert float(mech.variance([truth], truth)[0]) == pytest.approx(var, rel=1e-7, abs=1e-9)


def test_estimator_mean_and_coverage_by_simulation() -> None:
    """4,000 rounds with counts drawn from the exact law (numpy, seeded: the truth-side simulation
    only). Mean within z sqrt(var / R) of truth + bias for every bucket, Bonferroni over 4
    buckets at 1e-6 total; 95% CI coverage of the two well-released buckets inside the exact
    Binomial(R, 0.95) region; suppressed buckets' intervals cover with probability >= 0.975
    (one-sided binomial check). False-failure rate 1e-6 overall."""
    mech = build(1.0, 4, sample_rate=0.1, threshold=10.0)
    truth = np.array([3000, 500, 150, 0])
    rounds = 4000
    generator = np.random.default_rng(20_261_102)
    level = ALPHA / 12
    estimates = np.empty((rounds, 4))
    covered = np.zeros(4, dtype=np.int64)
    for r in range(rounds):
        counts = generator.binomial(truth, 0.1)
        nulls = int(truth.sum() - counts.sum())
        rows = mech.estimate([*counts.tolist(), nulls], int(truth.sum()))
        estimates[r] = [row.estimate for row in rows]
        covered += [row.ci_low <= x <= row.ci_high for row, x in zip(rows, truth, strict=True)]
        assert all(row.raw_count == (c if c > 10 else 0) for row, c in zip(rows, counts, strict=True))
    expected = truth + mech.bias(truth)
    z = float(stats.norm.isf(level / 2))
    sd = np.sqrt(mech.variance(truth, int(truth.sum())) / rounds)
    assert np.all(np.abs(estimates.mean(axis=0) - expected) <= z * sd + 1e-12)
    assert np.all(estimates[:, 3] == 0)
    lo, hi = stats.binom.ppf(level / 2, rounds, 0.95), stats.binom.isf(level / 2, rounds, 0.95)
    assert np.all((lo <= covered[:2]) & (covered[:2] <= hi)), covered / rounds
    assert covered[2] >= stats.binom.ppf(level, rounds, 0.95) and covered[3] == rounds


def test_estimator_through_the_real_randomiser() -> None:
    """300 rounds of 4,000 real reports (CSPRNG) through randomise_many and tally: the mean of the
    well-released bucket within 5.3 sigma (Bonferroni-free single test at 1e-7), nothing
    invalid, the null cell counts the unsampled devices."""
    mech = build(1.0, 3, sample_rate=0.1, threshold=10.0)
    values = [0] * 3000 + [1] * 1000
    ests = []
    for _ in range(300):
        tally = mech.tally(mech.randomise_many(values))
        assert not tally.invalid.any() and int(tally.counts.sum()) == 4000 and tally.counts[2] == 0
        ests.append(mech.estimate(tally.counts.tolist(), 4000)[0].estimate)
    sd = math.sqrt(float(mech.variance([3000], 4000)[0]) / 300)
    assert abs(np.mean(ests) - 3000 - float(mech.bias([3000])[0])) <= 5.3 * sd


@pytest.mark.slow
@pytest.mark.parametrize(
    ("s", "tau", "delta"), [(0.5, 2, 0.3), (0.5, 5, 0.05), (0.25, 3, 0.02), (0.75, 6, 0.2), (0.125, 2, 0.05)]
)
def test_released_histogram_meets_the_claimed_guarantee_exactly_large(
    s: float, tau: int, delta: float
) -> None:
    """As the default-run check with up to 8 users over 3 buckets."""
    mech = build(64.0, 3, sample_rate=s, threshold=float(tau), delta=delta)
    claim = mech.central_guarantee(8, delta)
    factor = exp_lower_bound(claim.epsilon)
    rate = Fraction(s)
    for n in range(1, 9):
        for hist, moved in neighbouring_histograms(n, 3):
            assert hockey(released_law(hist, rate, tau), released_law(moved, rate, tau), factor) <= Fraction(
                delta
            )
