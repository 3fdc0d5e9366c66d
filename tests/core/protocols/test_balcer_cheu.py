"""balcer_cheu_histogram: the p / 1 - p direction, exact laws, shuffled privacy, the analyser.

The shuffled output's sufficient statistic is the vector of message counts (c_j) and the
presence count n: c_j = x_j + Bin(n, p) independently. Tiny n: the per-device exact laws,
convolved, are checked to give exactly that. Where the theorem applies (n >= 100 ln(2/delta_b)
/ eps_b^2) the hockey-stick divergence of one bucket at eps_b is computed exactly (Fractions,
e^eps bounded from below) and of the two changed buckets jointly in floating point. Statistical
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
from deniable.core.accounting.planner import expected_std_error
from deniable.core.amplification.protocols import balcer_cheu_exact_guarantee, balcer_cheu_guarantee
from deniable.core.mechanisms.balcer_cheu import BalcerCheuHistogram
from deniable.core.mechanisms.exact import exp_lower_bound
from deniable.v1 import deniable_pb2 as pb

ALPHA = 1e-6  # false-failure rate of each statistical assertion


def build(eps: float = 1.0, d: int = 4, **params: float) -> BalcerCheuHistogram:
    return created(BalcerCheuHistogram, epsilon0=eps, domain_size=d, **params)


# --------------------------------------------------------------------------- parameters


def test_one_minus_p_is_the_smallest_meeting_the_exact_profile() -> None:
    """1 - p is the smallest grid value (to 1/128 relative) whose exact two-bucket profile meets
    the target at expected_n, and p is the noise-message probability (close to 1): the commonly
    swapped pair, checked both ways. The paper's formula is about 70x larger."""
    mech = build(1.0, 8, expected_n=100_000.0, delta=1e-6)
    assert balcer_cheu_exact_guarantee(mech.skip, 100_000, 1e-6).epsilon <= 1.0
    smaller = mech.skip * (1 - Fraction(1, 64))
    assert balcer_cheu_exact_guarantee(smaller, 100_000, 1e-6).epsilon > 1.0
    formula = 50 * math.log(2 / 5e-7) / (0.5**2 * 100_000)
    assert float(mech.skip) < formula / 50
    assert mech.send == 1 - mech.skip and float(mech.send) > 0.99
    assert mech.expected_messages == pytest.approx(2 + 8 * float(mech.send))


def test_standard_error_at_the_issue_setting_is_at_most_ten() -> None:
    """n = 1e5, eps = 1, delta = 1e-6, d = 32: the planner's error (uniform truth) was 773.8."""
    mech = build(1.0, 32, expected_n=100_000.0, delta=1e-6)
    assert expected_std_error(mech, 100_000) <= 10.0


def test_refuses_below_the_smallest_n_and_names_it() -> None:
    """Even 1 - p = 1/2 cannot hide one device among too few: the error names the smallest n."""
    with pytest.raises(ValueError, match="smallest n that can is 148"):
        build(1.0, 4, expected_n=100.0, delta=1e-6)
    build(1.0, 4, expected_n=148.0, delta=1e-6)
    with pytest.raises(ValueError, match="smallest n"):
        build(1.0, 4, expected_n=147.0, delta=1e-6)


def test_messages_per_device_average_one_plus_d_p_plus_presence() -> None:
    """20,000 devices, d = 16: the mean number of messages is 2 + d p within 5.3 standard errors
    (variance d p (1 - p) per device); one test at about 1e-7."""
    mech = build(1.0, 16, expected_n=20_000.0, delta=1e-6)
    payloads = mech.randomise_many([i % 16 for i in range(20_000)])
    sizes = np.array([len(mech.split_messages(p)) for p in payloads])
    p = float(mech.send)
    se = math.sqrt(16 * p * (1 - p) / 20_000)
    assert abs(sizes.mean() - (2 + 16 * p)) <= 5.3 * se
    assert sizes.min() >= 2 and sizes.max() <= 18


def test_registry_round_trip_from_float_params() -> None:
    mech = build(1.0, 5, expected_n=100_000.0, delta=1e-6)
    assert mechanisms.name_for_proto(pb.BALCER_CHEU_HISTOGRAM) == "balcer_cheu_histogram"
    params = mech.parameters()
    assert set(params) == {"expected_n", "delta", "skip_probability"}
    again = build(1.0, 5, **{k: float(v) for k, v in params.items()})
    assert again.skip == mech.skip and again.count_cells == 6
    assert mech.multi_message and not mech.local_privacy


@pytest.mark.parametrize(
    ("eps", "params", "match"),
    [
        (1.0, {"expected_n": 100}, "smallest n"),
        (1.0, {"expected_n": 10**6, "skip_probability": 0.6}, "1/2"),
        (1.0, {"expected_n": 10**6, "delta": 0.0}, "delta"),
        (1.0, {}, "expected_n"),
    ],
)
def test_refuses_bad_parameters(eps: float, params: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build(eps, 4, **{k: float(v) for k, v in params.items()})


# --------------------------------------------------------------------------- exact laws


def count_vector(mech: BalcerCheuHistogram, payload: bytes) -> tuple[int, ...]:
    counts = mech.tally(mech.split_messages(payload)).counts
    return tuple(int(c) for c in counts)


def test_output_distribution_is_exact_and_randomise_fits_it() -> None:
    """d = 3, 1 - p = 1/4: 8 payloads per value; 24,000 draws each through randomise and
    randomise_many, Pearson chi-square at 1e-6 each (false-failure 2e-6 per value)."""
    mech = build(1.0, 3, expected_n=1000.0, skip_probability=0.25)
    for value in range(3):
        law = mech.output_distribution(value)
        assert len(law) == 8 and sum(law.values()) == 1
        for payload, prob in law.items():
            counts = count_vector(mech, payload)
            assert counts[3] == 1 and counts[value] >= 1
            sent = sum(counts[:3]) - 1
            assert prob == Fraction(3, 4) ** sent * Fraction(1, 4) ** (3 - sent)
        outputs = sorted(law)
        expected = np.array([24_000 * float(law[o]) for o in outputs])
        for draws in ([mech.randomise(value) for _ in range(24_000)], mech.randomise_many([value] * 24_000)):
            observed = Counter(draws)
            assert set(observed) <= set(law)
            stat = float((((np.array([observed[o] for o in outputs]) - expected) ** 2) / expected).sum())
            assert stat <= stats.chi2.isf(ALPHA, len(outputs) - 1)


def test_shuffled_multiset_is_x_plus_independent_binomials() -> None:
    """n = 3 devices, d = 3: convolving the exact per-device laws gives the law of the shuffled
    count vector, which is exactly c_j = x_j + Bin(n, p) independently, presence = n."""
    mech = build(1.0, 3, expected_n=1000.0, skip_probability=0.25)
    assert mech.count_cells == 4  # three buckets and the presence cell
    joint = shuffled_law(mech, (0, 0, 2))
    p = mech.send
    binom = [math.comb(3, k) * p**k * (1 - p) ** (3 - k) for k in range(4)]
    truth = (2, 0, 1)
    model = {
        (*(t + k for t, k in zip(truth, ks, strict=True)), 3): math.prod(
            (binom[k] for k in ks), start=Fraction(1)
        )
        for ks in itertools.product(range(4), repeat=3)
    }
    assert joint == model


# --------------------------------------------------------------------------- privacy


def hockey_shift(law: list[Fraction], factor: Fraction) -> Fraction:
    """max over directions of D_factor(x + 1 + B || x + B) for B with the given law."""
    up = [Fraction(0), *law]
    here = [*law, Fraction(0)]
    one = sum((max(Fraction(0), a - factor * b) for a, b in zip(up, here, strict=True)), Fraction(0))
    other = sum((max(Fraction(0), b - factor * a) for a, b in zip(up, here, strict=True)), Fraction(0))
    return max(one, other)


@pytest.mark.parametrize("n", [300, 450])
def test_theorem_holds_where_it_applies(n: int) -> None:
    """eps = 2 (eps_b = 1), delta = 0.2 (delta_b = 0.1): valid for n >= 100 ln 20 = 300. One bucket's
    count at eps_b is within delta_b exactly; the two changed buckets jointly at 2 eps_b within
    delta (float convolution of the exact pmfs, 1e-12 slack)."""
    mech = build(2.0, 3, expected_n=300.0, delta=0.2, skip_probability=0.5)
    claim = mech.theorem_guarantee(n, 0.2)
    assert claim.amplified and claim.delta == 0.2
    eps_b = claim.epsilon / 2
    assert eps_b <= 1.0
    p = mech.send
    law = [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]
    assert hockey_shift(law, exp_lower_bound(eps_b)) <= Fraction(0.1)
    pmf = stats.binom.pmf(np.arange(n + 1), n, float(p))
    up, here = np.append(0.0, pmf), np.append(pmf, 0.0)
    joint_p = np.outer(up, here)  # bucket a gains the user, bucket b loses it
    joint_q = np.outer(here, up)
    assert float(np.clip(joint_p - math.exp(claim.epsilon) * joint_q, 0, None).sum()) <= 0.2 + 1e-12


def test_outside_the_theorem_nothing_is_claimed() -> None:
    mech = build(2.0, 3, expected_n=300.0, delta=0.2, skip_probability=0.5)
    for n in (1, 6, 200):
        bound = mech.theorem_guarantee(n, 0.2)
        assert math.isinf(bound.epsilon) and not bound.amplified and "not applicable" in bound.note
    assert math.isinf(balcer_cheu_guarantee(Fraction(3, 4), 10**6, 0.2).epsilon)


def shuffled_law(mech: BalcerCheuHistogram, values: tuple[int, ...]) -> dict[tuple[int, ...], Fraction]:
    """Exact law of the shuffled count vector: the per-device exact laws convolved."""
    joint: dict[tuple[int, ...], Fraction] = {(0,) * mech.count_cells: Fraction(1)}
    for v in values:
        step: dict[tuple[int, ...], Fraction] = {}
        for payload, prob in mech.output_distribution(v).items():
            add = count_vector(mech, payload)
            for key, p in joint.items():
                new = tuple(a + b for a, b in zip(key, add, strict=True))
                step[new] = step.get(new, Fraction(0)) + p * prob
        joint = step
    return joint


def hockey(
    p: dict[tuple[int, ...], Fraction], q: dict[tuple[int, ...], Fraction], factor: Fraction
) -> Fraction:
    return sum((max(Fraction(0), pr - factor * q.get(k, Fraction(0))) for k, pr in p.items()), Fraction(0))


@pytest.mark.parametrize(
    ("d", "skip", "values", "changed"),
    [(3, 0.25, (0, 0, 2), (1, 0, 2)), (2, 0.5, (0, 1, 1, 0), (1, 1, 1, 0)), (3, 0.125, (2, 1), (0, 1))],
)
def test_exact_profile_matches_exhaustive_enumeration(
    d: int, skip: float, values: tuple[int, ...], changed: tuple[int, ...]
) -> None:
    """Tiny n: every device's exact output law, convolved into the shuffled view, and the
    hockey-stick divergence in Fractions (both directions, e^eps as the exact rational of the
    double) equals ``privacy_profile`` up to its 1e-9 relative safety margin."""
    mech = build(1.0, d, expected_n=1000.0, skip_probability=skip)
    p, q = shuffled_law(mech, values), shuffled_law(mech, changed)
    for eps in (0.0, 0.2, 0.7, 1.5, 3.0):
        factor = Fraction(math.exp(eps))
        truth = float(max(hockey(p, q, factor), hockey(q, p, factor)))
        got = mech.privacy_profile(len(values), eps)
        assert truth <= got <= truth * (1 + 2e-9) + 1e-15, (eps, truth, got)


@pytest.mark.parametrize(("n", "gamma", "delta"), [(300, 0.5, 0.2), (2000, 0.3, 0.01), (10**5, 0.0304, 1e-6)])
def test_exact_epsilon_never_exceeds_the_theorem(n: int, gamma: float, delta: float) -> None:
    """Wherever the theorem applies, the exact profile's epsilon is at most the theorem's."""
    skip = Fraction(gamma)
    theorem = balcer_cheu_guarantee(skip, n, delta)
    exact = balcer_cheu_exact_guarantee(skip, n, delta)
    assert theorem.amplified and exact.amplified
    assert exact.epsilon <= theorem.epsilon


# --------------------------------------------------------------------------- analyser


def exact_moments(x: int, n: int, p: float) -> tuple[float, float]:
    """Mean and variance of (c - p n) 1{c > n}, c = x + Bin(n, p), by enumeration."""
    b = np.arange(n + 1)
    pmf = stats.binom.pmf(b, n, p)
    c = x + b
    value = np.where(c > n, c - p * n, 0.0)
    mean = float(pmf @ value)
    return mean, float(pmf @ (value - mean) ** 2)


@pytest.mark.parametrize("x", [0, 1, 5, 40, 80, 200, 900])
def test_bias_and_variance_are_exact(x: int) -> None:
    mech = build(1.0, 3, expected_n=2000.0, skip_probability=0.04)
    n = 2000
    mean, var = exact_moments(x, n, float(mech.send))
    assert float(mech.bias([x], n)[0]) == pytest.approx(mean - x, rel=1e-7, abs=1e-7)
    assert float(mech.variance([x], n)[0]) == pytest.approx(var, rel=1e-6, abs=1e-7)


def test_empty_buckets_are_exactly_zero_through_the_real_randomiser() -> None:
    """Deterministic property: an empty bucket gets at most n messages (one per device at most),
    so the analyser zeroes it in every round."""
    mech = build(1.0, 5, expected_n=3000.0, skip_probability=0.04)
    values = [0] * 2000 + [1] * 1000
    for _ in range(30):
        messages = [m for p in mech.randomise_many(values) for m in mech.split_messages(p)]
        tally = mech.tally(messages)
        n = mech.devices(tally.counts.tolist(), len(messages))
        assert n == 3000 and not tally.invalid.any()
        assert np.all(tally.counts[2:5] <= n)
        rows = mech.estimate(tally.counts.tolist(), n)
        assert [r.estimate for r in rows[2:]] == [0.0, 0.0, 0.0]


def test_estimator_mean_and_coverage_by_simulation() -> None:
    """4,000 rounds, counts from the exact law (numpy seeded, truth side only): mean within
    z sqrt(var/R) of x + bias for every bucket, 95% CI coverage of the large buckets inside the
    exact Binomial(R, 0.95) region, the zeroed buckets covered at >= 0.975 (one-sided); Bonferroni
    to a total false-failure rate of 1e-6."""
    mech = build(1.0, 4, expected_n=3000.0, skip_probability=0.04)
    truth = np.array([2500, 400, 100, 0])
    n, rounds = int(truth.sum()), 4000
    p = float(mech.send)
    generator = np.random.default_rng(20_261_104)
    level = ALPHA / 12
    estimates = np.empty((rounds, 4))
    covered = np.zeros(4, dtype=np.int64)
    for r in range(rounds):
        counts = truth + generator.binomial(n, p, 4)
        rows = mech.estimate([*counts.tolist(), n], n)
        estimates[r] = [row.estimate for row in rows]
        covered += [row.ci_low <= x <= row.ci_high for row, x in zip(rows, truth, strict=True)]
    z = float(stats.norm.isf(level / 2))
    sd = np.sqrt(mech.variance(truth, n) / rounds)
    assert np.all(np.abs(estimates.mean(axis=0) - truth - mech.bias(truth, n)) <= z * sd + 1e-12)
    assert np.all(estimates[:, 3] == 0)
    lo, hi = stats.binom.ppf(level / 2, rounds, 0.95), stats.binom.isf(level / 2, rounds, 0.95)
    assert np.all((lo <= covered[:2]) & (covered[:2] <= hi)), covered / rounds
    assert covered[2] >= stats.binom.ppf(level, rounds, 0.95) and covered[3] == rounds


def test_tally_flags_malformed_messages() -> None:
    mech = build(1.0, 3, expected_n=1000.0, skip_probability=0.25)
    tally = mech.tally([b"\x00", b"\x02", b"\x03", b"\x04", b"", b"\x00\x01", b"\x03"])
    assert tally.invalid.tolist() == [False, False, False, True, True, True, False]
    assert tally.counts.tolist() == [1, 0, 1, 2]
    assert mech.devices(tally.counts.tolist(), 4) == 2
