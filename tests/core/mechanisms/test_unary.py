"""SUE and OUE: exact laws and thresholds, sampling, privacy audit, estimator, tally, timing.

Exact checks use ``fractions.Fraction`` and a correctly rounded 60-digit e**x, so they are proofs.
Every statistical assertion states its false-failure rate (probability that a correct
implementation fails it); ``-m slow`` repeats the checks at larger sizes.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from statistics import NormalDist

import numpy as np
import numpy.typing as npt
import pytest
from scipy import stats
from support import stats as kit

from deniable.core import mechanisms
from deniable.core.audit import (
    TIMING_BOUND,
    audit,
    audit_cannot_miss,
    chi_square_fit,
    project_law,
    sampled_rounds,
    timing_separation,
)
from deniable.core.mechanisms.exact import exp_lower_bound
from deniable.core.mechanisms.unary import SCALE, UnaryEncoding
from deniable.core.rng import Csprng
from deniable.v1 import deniable_pb2 as pb

ALPHA = 1e-6  # false-failure rate of each statistical assertion below
NAMES = ("sue", "oue")
EPSILONS = (0.5, 1.0, 2.0, 4.0)
SMALL_D = (2, 3, 5, 9)
EXACT = [(name, eps, d) for name in NAMES for eps in EPSILONS for d in SMALL_D]


def build(name: str, eps: float, d: int) -> UnaryEncoding:
    mech = mechanisms.create(name, epsilon0=eps, domain_size=d)
    assert isinstance(mech, UnaryEncoding)
    return mech


def worst_ratio(mech: UnaryEncoding) -> Fraction:
    """max over outputs and input pairs of P(o | v) / P(o | w), by enumeration."""
    laws = [mech.output_distribution(v) for v in range(mech.domain_size)]
    worst = Fraction(1)
    for output in laws[0]:
        column = [law[output] for law in laws]
        assert min(column) > 0
        worst = max(worst, max(column) / min(column))
    return worst


# =========================================================================== exact laws


@pytest.mark.parametrize(("name", "eps", "d"), EXACT)
def test_probabilities_sum_to_exactly_one(name: str, eps: float, d: int) -> None:
    mech = build(name, eps, d)
    for v in range(d):
        law = mech.output_distribution(v)
        assert len(law) == 2**d
        assert all(len(out) == mech.payload_length == (d + 7) // 8 for out in law)
        assert all(p > 0 for p in law.values())
        assert sum(law.values(), Fraction(0)) == 1


@pytest.mark.parametrize(("name", "eps", "d"), EXACT)
def test_worst_ratio_is_bounded_by_exp_lower_bound_and_tight(name: str, eps: float, d: int) -> None:
    mech = build(name, eps, d)
    ratio = worst_ratio(mech)
    lo, _ = kit.exp_interval(eps)
    assert ratio == mech.worst_ratio  # the analytic ratio behind realised_epsilon is the true one
    assert ratio <= exp_lower_bound(eps) < lo
    assert ratio >= lo * (1 - Fraction(1, 2**30))
    assert math.log(ratio) == pytest.approx(mech.realised_epsilon, abs=1e-12)


@pytest.mark.parametrize(("name", "eps"), [(n, e) for n in NAMES for e in EPSILONS])
def test_marginals_are_the_estimators_support_probabilities(name: str, eps: float) -> None:
    """P(bit j = 1 | v) from the exact law is p* for j = v and q* otherwise; textbook within 2**-30."""
    mech = build(name, eps, 5)
    for v in range(5):
        law = mech.output_distribution(v)
        for j in range(5):
            marginal = project_law(law, functools.partial(kit.bit, j=j))[1]
            assert marginal == (mech.support_true if j == v else mech.support_other)
    e = math.exp(eps)
    textbook = (
        (math.sqrt(e) / (math.sqrt(e) + 1), 1 / (math.sqrt(e) + 1)) if name == "sue" else (0.5, 1 / (e + 1))
    )
    for got, want in zip((mech.support_true, mech.support_other), textbook, strict=True):
        assert abs(float(got) - want) <= want * 2**-30
    if name == "sue":
        assert mech.support_true + mech.support_other == 1
    else:
        assert mech.support_true == Fraction(1, 2)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("eps", [1e-12, 0.1, 0.5, 1.0, 2.0, 4.0, 8.0, 20.0, 50.0])
def test_thresholds_are_the_tightest_integers_and_realised_epsilon_is_analytic(name: str, eps: float) -> None:
    """The integer thresholds are optimal (one step further breaks the bound), and realised_epsilon
    (computed from them, for any d) never exceeds eps0."""
    mech = build(name, eps, 1000)
    a, z = mech.own_threshold, mech.other_threshold
    bound = exp_lower_bound(eps)

    def ratio(a: int, z: int) -> Fraction:
        return Fraction(a * (SCALE - z), z * (SCALE - a))

    assert ratio(a, z) <= bound
    if name == "sue":
        assert z == SCALE - a
        assert a == SCALE - 1 or ratio(a + 1, z - 1) > bound
    else:
        assert a == SCALE // 2
        assert z == 1 or ratio(a, z - 1) > bound
    assert mech.realised_epsilon <= eps * (1 + 2**-40)  # float log of a ratio proven <= e^eps
    if eps <= 20:
        assert mech.realised_epsilon >= eps - 1e-9


@pytest.mark.parametrize("name", NAMES)
def test_output_distribution_is_only_for_small_domains(name: str) -> None:
    assert sum(build(name, 1.0, 12).output_distribution(11).values(), Fraction(0)) == 1
    with pytest.raises(ValueError, match="d <= 12"):
        build(name, 1.0, 13).output_distribution(0)


# =========================================================================== randomise: exact


class ScriptedRng(Csprng):
    """Serves given 64-bit draws to ``uint64_array`` and records the requests."""

    def __init__(self, draws: Sequence[int] | npt.NDArray[np.uint64]) -> None:
        super().__init__(key=bytes(32))
        self.draws = np.array(draws, dtype=np.uint64)
        self.requests: list[int] = []

    def uint64_array(self, count: int) -> npt.NDArray[np.uint64]:
        self.requests.append(count)
        out, self.draws = self.draws[:count], self.draws[count:]
        assert len(out) == count
        return out

    def bytes(self, count: int) -> bytes:
        """The same draws as little-endian 64-bit words (the scalar, numpy-free ``randomise`` reads these)."""
        assert count % 8 == 0
        return self.uint64_array(count // 8).astype("<u8").tobytes()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("d", [2, 9, 16])
def test_draw_map_is_one_threshold_comparison_per_bit(name: str, d: int) -> None:
    """Bit j is 1 iff its draw is below its role's threshold (A for the true value, Z otherwise):
    exactly A (resp. Z) of the 2**64 draws give 1, so P(1) = A / 2**64 (Z / 2**64) with no rounding.
    One request of d draws per report, whatever the value."""
    mech = build(name, 1.0, d)
    a, z = mech.own_threshold, mech.other_threshold
    for v in sorted({0, 1, d // 2, d - 1}):
        for own, others, expect_own, expect_others in [
            (a - 1, z - 1, 1, 1),
            (a, z, 0, 0),
            (a - 1, z, 1, 0),
            (a, z - 1, 0, 1),
            (0, SCALE - 1, 1, 0),
        ]:
            rng = ScriptedRng([own if j == v else others for j in range(d)])
            out = mech.randomise(v, rng)
            assert rng.requests == [d]
            assert [kit.bit(out, j) for j in range(d)] == [
                expect_own if j == v else expect_others for j in range(d)
            ]
            assert out[-1] & ((1 << (8 * len(out) - d)) - 1) == 0  # spare bits zero


@pytest.mark.parametrize("name", NAMES)
def test_payload_bit_order_is_big_endian(name: str) -> None:
    mech = build(name, 1.0, 10)
    hits = [0] * 10  # draw 0 is below every threshold: all bits set
    assert mech.randomise(3, ScriptedRng(hits)) == b"\xff\xc0"
    misses = [SCALE - 1] * 10  # above every threshold: no bit set
    assert mech.randomise(3, ScriptedRng(misses)) == b"\x00\x00"
    only_first = [0] + [SCALE - 1] * 9
    assert mech.randomise(3, ScriptedRng(only_first)) == b"\x80\x00"
    only_last = [SCALE - 1] * 9 + [0]
    assert mech.randomise(3, ScriptedRng(only_last)) == b"\x00\x40"


class LazyScriptedRng(Csprng):
    """Serves the top bytes of given 64-bit draws to ``bytes`` and their 56 low bits, in order, to
    ``uint64_array`` (the lazy reader asks for the low bits of tied entries only)."""

    def __init__(self, tops: npt.NDArray[np.uint8], lows: npt.NDArray[np.uint64]) -> None:
        super().__init__(key=bytes(32))
        self.tops, self.lows = tops.tobytes(), lows

    def bytes(self, count: int) -> bytes:
        out, self.tops = self.tops[:count], self.tops[count:]
        assert len(out) == count
        return out

    def uint64_array(self, count: int) -> npt.NDArray[np.uint64]:
        out, self.lows = self.lows[:count], self.lows[count:]
        assert len(out) == count
        return out


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("d", [3, 9, 4096])
def test_randomise_many_reads_the_same_comparison_lazily(name: str, d: int) -> None:
    """For the same 64-bit draws u, randomise_many (top byte, then the 56 low bits only on a tie)
    returns exactly what randomise (u < T) returns: the same map from draws to bits, so the same
    law. Draws include ties on the top byte just below, at and above each threshold, and cross
    a chunk boundary (1,024 rows per chunk at d = 4096)."""
    mech = build(name, 2.0, d)
    rows = 1100 if d == 4096 else 300
    values = np.array([(7 * i) % d for i in range(rows)])
    draws = Csprng(key=b"\x05" * 32).uint64_array(rows * d).reshape(rows, d)
    own = np.arange(d)[None, :] == values[:, None]
    thresholds = np.where(own, np.uint64(mech.own_threshold), np.uint64(mech.other_threshold))
    for k, shift in enumerate([-1, 0, 1, -(1 << 40), 1 << 40]):  # force ties on a diagonal band
        band = (np.arange(d)[None, :] + np.arange(rows)[:, None]) % 7 == k
        step = np.uint64(abs(shift))
        draws[band] = thresholds[band] + step if shift >= 0 else thresholds[band] - step
    expected = [mech.randomise(int(v), ScriptedRng(row)) for v, row in zip(values, draws, strict=True)]
    tops = (draws >> np.uint64(56)).astype(np.uint8)
    tied = tops == (thresholds >> np.uint64(56)).astype(np.uint8)
    assert tied.sum() > rows  # the ties are exercised
    assert mech.randomise_many(values, LazyScriptedRng(tops, draws[tied])) == expected  # type: ignore[arg-type]
    assert mech.randomise_many([]) == []


@pytest.mark.parametrize("name", NAMES)
def test_bad_values_and_parameters_raise(name: str) -> None:
    mech = build(name, 1.0, 9)
    for bad in (-1, 9, 2**70, 1.0, 0.5, "0", None, b"\x00"):
        with pytest.raises(ValueError):
            mech.randomise(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            mech.output_distribution(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            mech.randomise_many([0, 3, bad])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        mech.randomise_many(np.array([0, 9]))  # type: ignore[arg-type]
    assert kit.bit(mech.randomise(True), 0) in (0, 1)  # bool is an int
    bad_configs = [(0.0, 4), (-1.0, 4), (math.nan, 4), (math.inf, 4), (1.0, 1), (1.0, 2**16 + 1), (1e-300, 4)]
    for eps, d in bad_configs:  # 1e-300: exp_lower_bound is 1, reports would carry no information
        with pytest.raises(ValueError):
            mechanisms.create(name, epsilon0=eps, domain_size=d)
    with pytest.raises(ValueError):
        mechanisms.create(name, epsilon0=1.0, domain_size=4, subset_size=2)


# =========================================================================== registry


def test_registry() -> None:
    mech = mechanisms.create("oue", epsilon0=1, domain_size=16)
    assert isinstance(mech, UnaryEncoding)
    assert (mech.epsilon0, mech.domain_size, mech.count_cells, mech.payload_length) == (1.0, 16, 16, 2)
    assert mechanisms.name_for_proto(pb.OUE) == "oue"
    assert mechanisms.name_for_proto(pb.SUE) == "sue"
    for name in NAMES:
        assert name in mechanisms.names()
        assert mechanisms.proto_for_name(name) in (pb.SUE, pb.OUE)
        summary = mechanisms.summaries()[name]
        assert summary and "\n" not in summary
        assert build(name, 1.0, 4).parameters() == {}
        assert not mechanisms.mechanism_class(name).multi_message


# =========================================================================== goodness of fit


def _fit(mech: UnaryEncoding, n: int, batched: bool) -> None:
    """``core.audit.chi_square_fit`` per value; outputs expected fewer than 5 times are pooled."""
    for v in sorted({0, mech.domain_size - 1}):
        sample = mech.randomise_many([v] * n) if batched else [mech.randomise(v) for _ in range(n)]
        fit = chi_square_fit(Counter(sample), mech.output_distribution(v), ALPHA)
        assert not fit.rejects, f"value {v}: chi2 {fit.statistic:.1f} > {fit.critical:.1f}"


GOF_DEFAULT = [(name, eps, d) for name in NAMES for eps, d in [(1.0, 5), (4.0, 3)]]
GOF_SLOW = [(name, eps, d) for name in NAMES for eps in EPSILONS for d in (2, 5, 9)]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "eps", "d"), GOF_SLOW)
def test_randomise_fits_its_exact_law_large(name: str, eps: float, d: int) -> None:
    """300,000 reports per value through ``randomise`` and 3,000,000 through ``randomise_many``."""
    mech = build(name, eps, d)
    _fit(mech, 300_000, batched=False)
    _fit(mech, 3_000_000, batched=True)


@pytest.mark.parametrize("name", NAMES)
def test_bits_have_their_marginals_at_large_d(name: str) -> None:
    """d = 40 (too large to enumerate): the d bit counts of n reports of value v are independent
    binomials, so sum_j (c_j - n t_j)^2 / (n t_j (1 - t_j)) is approximately chi-square(d);
    200,000 reports; false-failure 1e-6."""
    d, n, v = 40, 200_000, 17
    mech = build(name, 1.0, d)
    counts = mech.tally(mech.randomise_many([v] * n)).counts.astype(np.float64)
    t = np.full(d, float(mech.support_other))
    t[v] = float(mech.support_true)
    statistic = float((((counts - n * t) ** 2) / (n * t * (1 - t))).sum())
    assert statistic <= float(stats.chi2.isf(ALPHA, d))


# =========================================================================== privacy audit


LADDER = (10_000, 20_000, 50_000, 100_000, 200_000, 500_000, 1_000_000, 2_000_000, 5_000_000)


def catch(mech: UnaryEncoding, claimed: float) -> None:
    """Audit at the smallest ladder size that provably refutes ``claimed`` w.p. >= 1 - 1e-6."""
    result = kit.assert_refuted(mech, LADDER, ALPHA, events=kit.PAIR_EVENTS, event_of=kit.pair)
    assert result.claimed_epsilon == claimed


@pytest.mark.parametrize(("name", "eps"), [(n, e) for n in NAMES for e in (0.5, 1.0, 4.0)])
def test_audit_never_refutes_the_honest_mechanism(name: str, eps: float) -> None:
    """100,000 reports per input (0, 1), events = bits (0, 1), whose (1, 0) event carries the whole
    worst ratio. Refuting an honest eps0-LDP randomiser has probability <= 1e-6 (audit soundness).
    The bound also clears eps0 / 2 (power), guaranteed by ``audit_cannot_miss`` w.p. >= 1 - 1e-6."""
    mech = build(name, eps, 8)
    result = audit(mech, 0, 1, 100_000, alpha=ALPHA, events=kit.PAIR_EVENTS, event_of=kit.pair)
    assert not result.refutes_claim, result
    laws = [project_law(mech.output_distribution(v), kit.pair) for v in (0, 1)]
    assert audit_cannot_miss(
        laws[0], laws[1], 100_000, eps / 2, alpha=ALPHA, miss=ALPHA, events=kit.PAIR_EVENTS
    )
    assert result.epsilon_lower_bound > eps / 2


class PerBitEpsilonSUE(UnaryEncoding):
    """A classic bug: SUE with per-bit odds e^eps0 (forgetting that two bits change): true eps 2 eps0."""

    name = "sue"  # not registered: defined outside the mechanisms package

    @staticmethod
    def _thresholds(bound: Fraction) -> tuple[int, int]:
        keep = math.floor(SCALE * bound / (1 + bound))
        return keep, SCALE - keep


class SymmetricKeepOUE(UnaryEncoding):
    """SUE and OUE mixed up: own bit 1 w.p. e^eps0/(e^eps0+1), others 1/(e^eps0+1): true eps 2 eps0."""

    name = "oue"

    @staticmethod
    def _thresholds(bound: Fraction) -> tuple[int, int]:
        keep = math.floor(SCALE * bound / (1 + bound))
        return keep, SCALE - keep


def overclaiming(name: str, claimed: float, factor: float) -> UnaryEncoding:
    mech = build(name, claimed * factor, 8)
    mech.epsilon0 = claimed
    return mech


@pytest.mark.parametrize("mutant", [PerBitEpsilonSUE, SymmetricKeepOUE])
@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0])
def test_audit_refutes_structural_mutants(mutant: type[UnaryEncoding], eps: float) -> None:
    """Realised eps 2x the claim; sample size provably sufficient (miss probability <= 1e-6)."""
    mech = mutant(eps, 8)
    assert mech.realised_epsilon > 1.9 * eps
    catch(mech, eps)


@pytest.mark.parametrize(("name", "eps"), [(n, e) for n in NAMES for e in (0.5, 1.0, 4.0)])
def test_audit_refutes_twice_overclaiming_mutants(name: str, eps: float) -> None:
    """Thresholds of 2 eps0, claim eps0: refuted except with probability <= 1e-6."""
    catch(overclaiming(name, eps, 2.0), eps)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "eps"), [(n, e) for n in NAMES for e in (0.5, 1.0, 2.0, 4.0)])
def test_audit_refutes_subtle_overclaiming_mutants(name: str, eps: float) -> None:
    """Thresholds of 1.1 eps0, claim eps0 (up to millions of reports); miss probability <= 1e-6."""
    catch(overclaiming(name, eps, 1.1), eps)


# =========================================================================== estimator


def exact_count_variance(mech: UnaryEncoding, truth: Sequence[int]) -> list[Fraction]:
    """Var(c_j) = sum over devices of P(bit j | x)(1 - P(bit j | x)), from the exact law."""
    laws = [mech.output_distribution(v) for v in range(mech.domain_size)]
    out = []
    for j in range(mech.domain_size):
        ones = [project_law(law, functools.partial(kit.bit, j=j))[1] for law in laws]
        out.append(sum((x * t * (1 - t) for x, t in zip(truth, ones, strict=True)), Fraction(0)))
    return out


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("eps", [0.5, 2.0, 4.0])
def test_variance_formula_matches_the_exact_law(name: str, eps: float) -> None:
    """variance(truth, n) = Var(c_j) / (p* - q*)^2 with Var(c_j) from output_distribution; for SUE
    the truth-dependent term is exactly zero (p* + q* = 1), for OUE its slope is exactly 1."""
    truth = [700, 200, 100, 0, 0]
    mech = build(name, eps, 5)
    gap = mech.support_true - mech.support_other
    expected = [float(v / gap**2) for v in exact_count_variance(mech, truth)]
    np.testing.assert_allclose(mech.variance(truth, 1000), expected, rtol=1e-12)
    shift = mech.variance([1000, 0, 0, 0, 0], 1000) - mech.variance([0] * 5, 1000)
    assert shift[0] == (0.0 if name == "sue" else pytest.approx(1000.0, rel=1e-12))


@pytest.mark.parametrize("name", NAMES)
def test_estimate_inverts_expected_counts_and_builds_the_ci(name: str) -> None:
    mech = build(name, 2.0, 5)
    truth, n = [500, 300, 150, 50, 0], 1000
    p, q = mech.support_true, mech.support_other
    expected_counts = [float(x * p + (n - x) * q) for x in truth]
    rows = mech.estimate(expected_counts, n)  # type: ignore[arg-type]  # linearity check
    np.testing.assert_allclose([r.estimate for r in rows], truth, atol=1e-9 * n)
    z = NormalDist().inv_cdf(0.975)
    for row, var in zip(rows, mech.variance(np.clip([r.estimate for r in rows], 0, n), n), strict=True):
        assert row.std_error == pytest.approx(math.sqrt(var), rel=1e-12)
        assert row.ci_low == pytest.approx(row.estimate - z * row.std_error, rel=1e-12, abs=1e-9)
        assert row.ci_high == pytest.approx(row.estimate + z * row.std_error, rel=1e-12, abs=1e-9)
    with pytest.raises(ValueError):
        mech.estimate([1] * 6, n)


SKEWED_8 = [5000, 2000, 1000, 800, 600, 400, 200, 0]


@pytest.mark.parametrize(("name", "eps"), [(n, e) for n in NAMES for e in (1.0, 4.0)])
def test_estimator_unbiased_exact_variance_and_coverage(name: str, eps: float) -> None:
    """4,000 simulated rounds of 10,000 reports, skewed truth; ``core.audit.check_estimator`` (mean,
    variance, 95% CI coverage), false-failure 1e-6. For OUE the variance without the
    truth-dependent term would be rejected for bucket 0 at eps0 = 4 (the two acceptance regions
    are disjoint)."""
    mech = build(name, eps, 8)
    counts = kit.binomial_rounds(mech, SKEWED_8, 4000, seed=20_261_102)
    lo, hi = kit.assert_estimator(mech, SKEWED_8, counts, ALPHA).variance_ratio_bounds
    if name == "oue" and eps == 4.0:
        truth_free = mech.variance([0] * 8, sum(SKEWED_8))[0]
        assert hi * truth_free < lo * mech.variance(SKEWED_8, sum(SKEWED_8))[0]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "eps"), [(n, e) for n in NAMES for e in (0.5, 1.0, 2.0, 4.0, 6.0)])
def test_estimator_large(name: str, eps: float) -> None:
    """20,000 simulated rounds (10x the population at eps0 = 6) and 1,500 real rounds; 2e-6."""
    mech = build(name, eps, 8)
    truth = SKEWED_8 if eps < 6 else [10 * x for x in SKEWED_8]
    kit.assert_estimator(mech, truth, kit.binomial_rounds(mech, truth, 20_000, seed=7), ALPHA)
    kit.assert_estimator(mech, SKEWED_8, sampled_rounds(mech, SKEWED_8, 1500), ALPHA)


# =========================================================================== tally


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("d", [2, 8, 9, 16, 21])
def test_tally_flags_malformed_payloads_and_never_counts_them(name: str, d: int) -> None:
    mech = build(name, 1.0, d)
    width = mech.payload_length
    spare = 8 * width - d
    good = [mech.randomise(v % d) for v in range(3 * d)]
    bad = [b"", bytes(width - 1), bytes(width + 1), b"\xff" * (width + 3), good[0] + b"\x00"]
    if spare:
        bad += [bytes(width - 1) + bytes([1]), b"\xff" * width, good[1][:-1] + bytes([good[1][-1] | 1])]
    payloads = [*good[:d], *bad, *good[d:]]
    tally = mech.tally(payloads)
    assert tally.invalid.dtype == np.bool_
    assert tally.invalid.tolist() == [False] * d + [True] * len(bad) + [False] * (2 * d)
    expected = [sum(kit.bit(p, j) for p in good) for j in range(d)]
    assert tally.counts.tolist() == expected
    assert tally.valid_count == len(good)
    only_bad = mech.tally(bad)
    assert only_bad.invalid.all() and only_bad.counts.tolist() == [0] * d
    assert mech.tally([]).counts.tolist() == [0] * d


@pytest.mark.parametrize("name", NAMES)
def test_tally_of_many_reports_matches_a_plain_count(name: str) -> None:
    """Across the tally's chunk boundary (16,384 rows at d = 256)."""
    mech = build(name, 1.0, 256)
    reports = mech.randomise_many([v % 256 for v in range(20_000)])
    tally = mech.tally(reports)
    assert not tally.invalid.any()
    bits = np.unpackbits(np.frombuffer(b"".join(reports), dtype=np.uint8).reshape(-1, 32), axis=1)
    assert tally.counts.tolist() == bits.sum(axis=0).tolist()


# =========================================================================== timing


@pytest.mark.parametrize("name", NAMES)
def test_running_time_does_not_separate_inputs(name: str) -> None:
    """Inputs 0 and 63 within ``core.audit``'s timing bound (see tests/core/test_timing.py)."""
    mech = build(name, 1.0, 64)
    assert timing_separation(lambda: mech.randomise(0), lambda: mech.randomise(63)) <= TIMING_BOUND


def test_timing_check_has_teeth() -> None:
    """A randomiser that does twice the work for input 0 is separated (KS distance near 1)."""
    mech = build("oue", 1.0, 64)

    def leaky(value: int) -> bytes:
        if value == 0:
            mech.randomise(value)
        return mech.randomise(value)

    assert timing_separation(lambda: leaky(0), lambda: leaky(63)) > TIMING_BOUND  # seen: 0.89–1.0
