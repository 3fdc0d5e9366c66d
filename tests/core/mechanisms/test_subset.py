"""Subset selection: exact law and draw map, sampling, privacy audit, estimator, tally, timing.

Exact checks use ``fractions.Fraction`` and a correctly rounded 60-digit e**x, so they are proofs.
Every statistical assertion states its false-failure rate (probability that a correct
implementation fails it); ``-m slow`` repeats the checks at larger sizes.
"""

from __future__ import annotations

import functools
import itertools
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
from support.stats import created

from deniable.core import campaigns, mechanisms
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
from deniable.core.mechanisms.subset import SubsetSelection, default_subset_size
from deniable.core.mechanisms.unary import SCALE
from deniable.core.rng import Csprng, default_rng
from deniable.v1 import deniable_pb2 as pb

ALPHA = 1e-6  # false-failure rate of each statistical assertion below
EPSILONS = (0.5, 1.0, 2.0, 4.0)
EXACT = [(eps, d, None) for eps in EPSILONS for d in (2, 3, 5, 9)] + [(1.0, 9, w) for w in range(1, 9)]


def build(eps: float, d: int, omega: float | None = None) -> SubsetSelection:
    params = {} if omega is None else {"subset_size": omega}
    return created(SubsetSelection, epsilon0=eps, domain_size=d, **params)


def members(payload: bytes, d: int) -> frozenset[int]:
    """The values whose bit (big-endian, as ``kit.bit``) is set in a subset payload."""
    return frozenset(j for j in range(d) if (payload[j // 8] >> (7 - j % 8)) & 1)


# =========================================================================== parameters


@pytest.mark.parametrize(
    ("eps", "d", "omega"),
    [
        (0.5, 8, 3),
        (1.0, 8, 2),
        (2.0, 8, 1),
        (4.0, 8, 1),
        (1.0, 100, 27),
        (1.0, 2, 1),
        (0.01, 2, 1),
        (800.0, 50, 1),
    ],
)
def test_default_subset_size(eps: float, d: int, omega: int) -> None:
    """omega = max(1, round(d / (e^eps0 + 1))), stored explicitly in the campaign's params."""
    assert default_subset_size(eps, d) == omega
    mech = build(eps, d)
    assert mech.subset_size == omega
    assert mech.parameters() == {"subset_size": float(omega)}
    assert isinstance(mech.parameters()["subset_size"], float)


def test_subset_size_from_campaign_params() -> None:
    """Campaign.params is a map of doubles: integral floats are accepted, and round-trip."""
    assert build(1.0, 10, np.int64(3)).subset_size == build(1.0, 10, Fraction(3)).subset_size == 3  # type: ignore[arg-type]
    mech = mechanisms.create("subset_selection", epsilon0=1.0, domain_size=10, **{"subset_size": 3.0})
    assert isinstance(mech, SubsetSelection) and mech.subset_size == 3
    again = mechanisms.create("subset_selection", epsilon0=1.0, domain_size=10, **mech.parameters())
    assert isinstance(again, SubsetSelection) and again.subset_size == 3
    campaign = pb.Campaign(
        mechanism=pb.SUBSET_SELECTION,
        epsilon0=1.0,
        labels=[f"l{i}" for i in range(10)],
        params={"subset_size": 4.0},
    )
    rebuilt = campaigns.randomiser_for(campaign)
    assert isinstance(rebuilt, SubsetSelection) and rebuilt.subset_size == 4


@pytest.mark.parametrize(
    "bad", [0, 0.0, 10, 10.0, 11, -1, 2.5, math.nan, math.inf, -math.inf, "3", True, None, [3]]
)
def test_bad_subset_sizes_raise(bad: object) -> None:
    if bad is None:
        return  # None means the default
    with pytest.raises(ValueError):
        mechanisms.create("subset_selection", epsilon0=1.0, domain_size=10, subset_size=bad)


def test_bad_values_and_parameters_raise() -> None:
    mech = build(1.0, 9, 3)
    for bad in (-1, 9, 2**70, 1.0, 0.5, "0", None, b"\x00"):
        with pytest.raises(ValueError):
            mech.randomise(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            mech.output_distribution(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            mech.randomise_many([0, 3, bad])  # type: ignore[list-item]
    assert len(members(mech.randomise(True), 9)) == 3  # bool is an int
    for eps, d in [(0.0, 4), (-1.0, 4), (math.nan, 4), (math.inf, 4), (1.0, 1), (1.0, 2**16 + 1)]:
        with pytest.raises(ValueError):
            mechanisms.create("subset_selection", epsilon0=eps, domain_size=d)
    for tiny in (1e-300, 2.0**-70):  # b = 1: the only valid ratio is 1, a report without information
        with pytest.raises(ValueError, match="too small"):
            build(tiny, 4)
    with pytest.raises(ValueError):
        mechanisms.create("subset_selection", epsilon0=1.0, domain_size=4, g=2)


def test_registry() -> None:
    mech = mechanisms.create("subset_selection", epsilon0=1, domain_size=16)
    assert isinstance(mech, SubsetSelection)
    assert (mech.count_cells, mech.payload_length, mech.subset_size) == (16, 2, 4)
    assert mechanisms.name_for_proto(pb.SUBSET_SELECTION) == "subset_selection"
    assert mechanisms.proto_for_name("subset_selection") == pb.SUBSET_SELECTION
    summary = mechanisms.summaries()["subset_selection"]
    assert summary and "\n" not in summary


# =========================================================================== exact law


@pytest.mark.parametrize(("eps", "d", "omega"), EXACT)
def test_law_sums_to_one_over_subsets_of_size_omega(eps: float, d: int, omega: int | None) -> None:
    mech = build(eps, d, omega)
    w = mech.subset_size
    for v in range(d):
        law = mech.output_distribution(v)
        assert len(law) == math.comb(d, w)
        assert all(len(out) == mech.payload_length and len(members(out, d)) == w for out in law)
        assert all(p > 0 for p in law.values())
        assert sum(law.values(), Fraction(0)) == 1
        # P(S | v) takes two values, by membership of v; the inclusion probability is P_in
        assert (
            sum((p for out, p in law.items() if v in members(out, d)), Fraction(0))
            == mech.include_probability
        )


@pytest.mark.parametrize(("eps", "d", "omega"), EXACT)
def test_worst_ratio_is_bounded_by_exp_lower_bound_and_tight(eps: float, d: int, omega: int | None) -> None:
    mech = build(eps, d, omega)
    laws = [mech.output_distribution(v) for v in range(d)]
    worst = Fraction(1)
    for output in laws[0]:
        column = [law[output] for law in laws]
        worst = max(worst, max(column) / min(column))
    lo, _ = kit.exp_interval(eps)
    assert worst == mech.worst_ratio  # the analytic ratio behind realised_epsilon is the true one
    assert worst <= exp_lower_bound(eps) < lo
    assert worst >= lo * (1 - Fraction(1, 2**30))
    assert math.log(worst) == pytest.approx(mech.realised_epsilon, abs=1e-12)


@pytest.mark.parametrize(("eps", "d", "omega"), [(0.5, 9, None), (1.0, 9, 4), (4.0, 5, 2), (2.0, 9, 1)])
def test_marginals_are_the_estimators_support_probabilities(eps: float, d: int, omega: int | None) -> None:
    """P(j in S | v) from the exact law: p* for j = v, q* otherwise; textbook P_in within 2**-30."""
    mech = build(eps, d, omega)
    for v in (0, d - 1):
        law = mech.output_distribution(v)
        for j in range(d):
            marginal = project_law(law, functools.partial(kit.bit, j=j))[1]
            assert marginal == (mech.support_true if j == v else mech.support_other)
    w = mech.subset_size
    textbook = w * math.exp(eps) / (w * math.exp(eps) + d - w)
    assert abs(float(mech.support_true) - textbook) <= textbook * 2**-30
    assert mech.support_true + (d - 1) * mech.support_other == w


@pytest.mark.parametrize("eps", [1e-12, 0.1, 1.0, 4.0, 8.0, 20.0])
@pytest.mark.parametrize(("d", "omega"), [(1000, None), (1000, 1), (1000, 999), (2**16, None)])
def test_threshold_is_the_tightest_integer_and_realised_epsilon_is_analytic(
    eps: float, d: int, omega: int | None
) -> None:
    mech = build(eps, d, omega)
    t, w, bound = mech.include_threshold, mech.subset_size, exp_lower_bound(eps)
    assert Fraction(t * (d - w), (SCALE - t) * w) == mech.worst_ratio <= bound
    assert Fraction((t + 1) * (d - w), (SCALE - t - 1) * w) > bound
    assert mech.realised_epsilon <= eps * (1 + 2**-40)  # float log of a ratio proven <= e^eps
    # 64-bit rounding of T costs at most 1 / T + 1 / (2**64 - T) in the ratio (2.7e-8 at eps0 = 20,
    # omega = 999, where 2**64 - T is about 3.7e7)
    assert mech.realised_epsilon >= eps - 2 / t - 2 / (SCALE - t) - 1e-12


def test_output_distribution_is_only_for_small_domains() -> None:
    assert sum(build(1.0, 12).output_distribution(11).values(), Fraction(0)) == 1
    with pytest.raises(ValueError, match="d <= 12"):
        build(1.0, 13).output_distribution(0)


# =========================================================================== draw map: exact


class ScriptedRng(Csprng):
    """Serves scripted draws: 64-bit inclusion draws and the Fisher-Yates picks, scalar or vector."""

    def __init__(self, inclusion: Sequence[int], picks: Sequence[Sequence[int]]) -> None:
        super().__init__(key=bytes(32))
        self.inclusion = list(inclusion)
        self.picks = [list(p) for p in picks]  # one sequence per report
        self.step = 0

    def randbits(self, bits: int) -> int:
        assert bits == 64
        return self.inclusion.pop(0)

    def randbelow(self, upper: int) -> int:
        draw = self.picks[0][self.step]
        assert 0 <= draw < upper
        self.step += 1
        if self.step == len(self.picks[0]):
            self.picks.pop(0)
            self.step = 0
        return draw

    def uint64_array(self, count: int) -> npt.NDArray[np.uint64]:
        out, self.inclusion = self.inclusion[:count], self.inclusion[count:]
        return np.array(out, dtype=np.uint64)

    def randbelow_array(self, upper: int, count: int) -> npt.NDArray[np.int64]:
        column = [p[self.step] for p in self.picks[:count]]
        assert all(0 <= c < upper for c in column)
        self.step += 1
        return np.array(column, dtype=np.int64)


def enumerated_law(mech: SubsetSelection, value: int, batched: bool) -> dict[bytes, Fraction]:
    """The law of randomise(_many) obtained by running it on every sequence of Fisher-Yates picks
    with the inclusion draw just below (included) and at (excluded) the threshold.

    Exact: inclusion is u < T on a uniform 64-bit u (monotone, so the two boundary draws stand for
    all T and all 2**64 - T draws), and the pick sequences are equally likely (uniform randbelow)."""
    d, w, t = mech.domain_size, mech.subset_size, mech.include_threshold
    sequences = list(itertools.product(*[range(d - 1 - j) for j in range(w)]))
    law: dict[bytes, Fraction] = {}
    for draw, weight in ((t - 1, Fraction(t, SCALE)), (t, Fraction(SCALE - t, SCALE))):
        rng = ScriptedRng([draw] * len(sequences), sequences)
        if batched:
            outputs = mech.randomise_many([value] * len(sequences), rng)
        else:
            outputs = [mech.randomise(value, rng) for _ in sequences]
        for out in outputs:
            law[out] = law.get(out, Fraction(0)) + weight / len(sequences)
    return law


@pytest.mark.parametrize("batched", [False, True], ids=["randomise", "randomise_many"])
@pytest.mark.parametrize(
    ("eps", "d", "omega"), [(1.0, 5, 2), (0.5, 6, 3), (2.0, 4, 1), (1.0, 6, 5), (4.0, 9, 2)]
)
def test_draw_map_gives_exactly_the_output_distribution(
    eps: float, d: int, omega: int, batched: bool
) -> None:
    """Running the sampler on every equally likely draw gives exactly ``output_distribution``: a
    proof that randomise and randomise_many sample the exact law (given uniform draws)."""
    mech = build(eps, d, omega)
    for v in sorted({0, 1, d // 2, d - 1}):
        assert enumerated_law(mech, v, batched) == mech.output_distribution(v)
    rng = ScriptedRng([0, SCALE - 1], [[0] * omega] * 2)
    assert 0 in members(mech.randomise(0, rng), d) and 0 not in members(mech.randomise(0, rng), d)


def test_payload_bit_order_is_big_endian() -> None:
    mech = build(1.0, 10, 2)
    # excluded (draw above T): picks slot 0 then slot 8 (last of the 9 others); value 3 -> values 0 and 9
    assert mech.randomise(3, ScriptedRng([SCALE - 1], [[0, 7]])) == b"\x80\x40"
    # included: the first pick (slot 0 -> value 0) stays, the last is replaced by the value 3
    assert mech.randomise(3, ScriptedRng([0], [[0, 7]])) == b"\x90\x00"


def test_randomise_many_handles_chunks_and_empty_input() -> None:
    mech = build(1.0, 4096)  # 1,024 rows per chunk
    reports = mech.randomise_many([(7 * i) % 4096 for i in range(2500)], Csprng(key=b"\x03" * 32))
    assert len(reports) == 2500
    assert all(len(r) == 512 for r in reports)
    assert not mech.tally(reports).invalid.any()
    assert mech.randomise_many([]) == []


# =========================================================================== goodness of fit


def _fit(mech: SubsetSelection, n: int, batched: bool) -> None:
    """``core.audit.chi_square_fit`` per value; outputs expected fewer than 5 times are pooled."""
    for v in sorted({0, mech.domain_size - 1}):
        sample = mech.randomise_many([v] * n) if batched else [mech.randomise(v) for _ in range(n)]
        fit = chi_square_fit(Counter(sample), mech.output_distribution(v), ALPHA)
        assert not fit.rejects, f"value {v}: chi2 {fit.statistic:.1f} > {fit.critical:.1f}"


GOF_DEFAULT = [(1.0, 5, 2), (0.5, 6, 3)]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("eps", "d", "omega"), [*[(e, d, None) for e in EPSILONS for d in (3, 9, 12)], *GOF_DEFAULT]
)
def test_randomise_fits_its_exact_law_large(eps: float, d: int, omega: int | None) -> None:
    """200,000 reports per value through ``randomise``, 2,000,000 through ``randomise_many``."""
    mech = build(eps, d, omega)
    _fit(mech, 200_000, batched=False)
    _fit(mech, 2_000_000, batched=True)


def test_memberships_have_their_marginals_at_large_d() -> None:
    """d = 64 (too large to enumerate): each membership count of n reports of value v is a
    binomial (p* for v, q* otherwise), so each standardised count is checked against a two-sided
    normal bound at ALPHA / d (Bonferroni; false-failure 1e-6); every report has omega members."""
    d, n, v = 64, 100_000, 40
    mech = build(1.0, d)
    tally = mech.tally(mech.randomise_many([v] * n))
    assert tally.valid_count == n and int(tally.counts.sum()) == n * mech.subset_size
    t = np.full(d, float(mech.support_other))
    t[v] = float(mech.support_true)
    z = (tally.counts - n * t) / np.sqrt(n * t * (1 - t))
    assert np.all(np.abs(z) <= stats.norm.isf(ALPHA / (2 * d)))


# =========================================================================== privacy audit


LADDER = (10_000, 20_000, 50_000, 100_000, 200_000, 500_000, 1_000_000, 2_000_000, 5_000_000)


def catch(mech: SubsetSelection, claimed: float) -> None:
    """Audit at the smallest ladder size that provably refutes ``claimed`` w.p. >= 1 - 1e-6."""
    assert mech.epsilon0 == claimed
    kit.assert_refuted(mech, LADDER, ALPHA, events=kit.PAIR_EVENTS, event_of=kit.pair)


@pytest.mark.parametrize(("eps", "omega"), [(0.5, None), (1.0, None), (1.0, 4), (4.0, 2)])
def test_audit_never_refutes_the_honest_mechanism(eps: float, omega: int | None) -> None:
    """100,000 reports per input (0, 1) at d = 8, events = memberships of 0 and 1 (the (1, 0) event
    carries the whole worst ratio). Refuting an honest randomiser has probability <= 1e-6; the
    bound clears eps0 / 2 (power), guaranteed by ``audit_cannot_miss`` w.p. >= 1 - 1e-6."""
    mech = build(eps, 8, omega)
    result = audit(mech, 0, 1, 100_000, alpha=ALPHA, events=kit.PAIR_EVENTS, event_of=kit.pair)
    assert not result.refutes_claim, result
    laws = [project_law(mech.output_distribution(v), kit.pair) for v in (0, 1)]
    assert audit_cannot_miss(
        laws[0], laws[1], 100_000, eps / 2, alpha=ALPHA, miss=ALPHA, events=kit.PAIR_EVENTS
    )
    assert result.epsilon_lower_bound > eps / 2


class LeakySubset(SubsetSelection):
    """A plausible bug: when v is not to be included, the omega values are drawn from all d (v may
    still appear), which lifts the worst ratio to 1 + e^eps0 d / (d - omega)."""

    def randomise(self, value: int, rng: Csprng | None = None) -> bytes:
        self.check_value(value)
        source = rng or default_rng()
        include = source.randbits(64) < self.include_threshold
        order = [int(w) for w in source.permutation(self.domain_size)]
        chosen = (
            [*[w for w in order if w != value][: self.subset_size - 1], value]
            if include
            else order[: self.subset_size]
        )
        return self._bitmap(chosen)

    def randomise_many(self, values: Sequence[int], rng: Csprng | None = None) -> list[bytes]:
        return [self.randomise(v, rng) for v in values]

    def output_distribution(self, value: int) -> dict[bytes, Fraction]:
        d, w, p_in = self.domain_size, self.subset_size, self.include_probability
        return {
            self._bitmap(s): (p_in / math.comb(d - 1, w - 1) if value in s else 0)
            + (1 - p_in) / math.comb(d, w)
            for s in itertools.combinations(range(d), w)
        }

    @property
    def worst_ratio(self) -> Fraction:
        return super().worst_ratio  # the honest one: what the mutant claims


def overclaiming(claimed: float, factor: float, omega: int | None = None) -> SubsetSelection:
    mech = build(claimed * factor, 8, omega)
    mech.epsilon0 = claimed
    return mech


@pytest.mark.parametrize(("eps", "omega"), [(0.25, 4), (0.5, 3), (1.0, 2)])
def test_audit_refutes_the_leaky_mutant(eps: float, omega: int) -> None:
    """True eps well above the claim (computed exactly); miss probability <= 1e-6."""
    mech = LeakySubset(eps, 8, omega)
    laws = [mech.output_distribution(v) for v in range(8)]
    true_ratio = max(max(law[o] for law in laws) / min(law[o] for law in laws) for o in laws[0])
    assert math.log(true_ratio) > 1.4 * eps
    catch(mech, eps)


@pytest.mark.parametrize(("eps", "omega"), [(0.5, None), (1.0, None), (1.0, 4), (4.0, 2)])
def test_audit_refutes_twice_overclaiming_mutants(eps: float, omega: int | None) -> None:
    """Threshold of 2 eps0, claim eps0: refuted except with probability <= 1e-6."""
    catch(overclaiming(eps, 2.0, omega), eps)


@pytest.mark.slow
@pytest.mark.parametrize(("eps", "omega"), [(0.5, None), (1.0, None), (1.0, 4), (2.0, 2), (4.0, 2)])
def test_audit_refutes_subtle_overclaiming_mutants(eps: float, omega: int | None) -> None:
    """Threshold of 1.1 eps0, claim eps0 (up to millions of reports); miss probability <= 1e-6."""
    catch(overclaiming(eps, 1.1, omega), eps)


# =========================================================================== estimator


@pytest.mark.parametrize(("eps", "d", "omega"), [(0.5, 5, None), (1.0, 6, 3), (4.0, 5, 2)])
def test_variance_formula_matches_the_exact_law(eps: float, d: int, omega: int | None) -> None:
    """variance(truth, n) = Var(c_j) / (p* - q*)^2, Var(c_j) = sum over devices of P(j in S)(1 - P),
    from output_distribution: membership of j is one Bernoulli per device, whatever the rest."""
    mech = build(eps, d, omega)
    truth = [700, 200, 100] + [0] * (d - 3)
    laws = [mech.output_distribution(v) for v in range(d)]
    gap = mech.support_true - mech.support_other
    expected = []
    for j in range(d):
        ones = [project_law(law, functools.partial(kit.bit, j=j))[1] for law in laws]
        expected.append(
            float(sum((x * t * (1 - t) for x, t in zip(truth, ones, strict=True)), Fraction(0)) / gap**2)
        )
    np.testing.assert_allclose(mech.variance(truth, sum(truth)), expected, rtol=1e-12)


def test_estimate_inverts_expected_counts_sums_to_n_and_builds_the_ci() -> None:
    mech = build(1.0, 6, 3)
    truth, n = [500, 300, 150, 50, 0, 0], 1000
    p, q = mech.support_true, mech.support_other
    expected_counts = [float(x * p + (n - x) * q) for x in truth]
    rows = mech.estimate(expected_counts, n)  # type: ignore[arg-type]  # linearity check
    np.testing.assert_allclose([r.estimate for r in rows], truth, atol=1e-9 * n)
    z = NormalDist().inv_cdf(0.975)
    for row, var in zip(rows, mech.variance(np.clip([r.estimate for r in rows], 0, n), n), strict=True):
        assert row.std_error == pytest.approx(math.sqrt(var), rel=1e-12)
        assert row.ci_low == pytest.approx(row.estimate - z * row.std_error, rel=1e-12, abs=1e-9)
        assert row.ci_high == pytest.approx(row.estimate + z * row.std_error, rel=1e-12, abs=1e-9)
    # every valid report has omega members, so sum c = n omega and the estimates sum to n exactly
    reports = mech.randomise_many([v % 6 for v in range(999)])
    counts = mech.tally(reports).counts
    assert sum(r.estimate for r in mech.estimate(list(counts), 999)) == pytest.approx(999, rel=1e-12)
    with pytest.raises(ValueError):
        mech.estimate([1] * 7, n)


SKEWED_8 = [5000, 2000, 1000, 800, 600, 400, 200, 0]
ESTIMATOR_DEFAULT = [(2.0, SKEWED_8 + [0] * 8, None), (4.0, SKEWED_8, 2), (1.0, SKEWED_8, None)]


@pytest.mark.parametrize(("eps", "truth", "omega"), ESTIMATOR_DEFAULT)
def test_estimator_unbiased_exact_variance_and_coverage(
    eps: float, truth: list[int], omega: int | None
) -> None:
    """4,000 simulated rounds of 10,000 reports; ``core.audit.check_estimator`` (mean, variance,
    95% CI coverage), false-failure 1e-6. In the first two
    configurations the variance without the truth-dependent term would be rejected for bucket 0
    (disjoint acceptance regions): at d = 16, eps0 = 2 it is too small; at d = 8, omega = 2,
    eps0 = 4 (p* + q* > 1, negative slope) too large."""
    mech = build(eps, len(truth), omega)
    counts = kit.binomial_rounds(mech, truth, 4000, seed=20_261_103)
    lo, hi = kit.assert_estimator(mech, truth, counts, ALPHA).variance_ratio_bounds
    truth_free, full = mech.variance([0] * len(truth), sum(truth))[0], mech.variance(truth, sum(truth))[0]
    if eps in (2.0, 4.0):
        assert hi * truth_free < lo * full or lo * truth_free > hi * full


@pytest.mark.slow
@pytest.mark.parametrize(("eps", "omega"), [(0.5, None), (1.0, None), (1.0, 4), (2.0, 2), (4.0, 2), (6.0, 2)])
def test_estimator_large(eps: float, omega: int | None) -> None:
    """20,000 simulated rounds (10x the population at eps0 = 6) and 1,500 real rounds; 2e-6."""
    mech = build(eps, 8, omega)
    truth = SKEWED_8 if eps < 6 else [10 * x for x in SKEWED_8]
    kit.assert_estimator(mech, truth, kit.binomial_rounds(mech, truth, 20_000, seed=7), ALPHA)
    kit.assert_estimator(mech, SKEWED_8, sampled_rounds(mech, SKEWED_8, 1500), ALPHA)


# =========================================================================== tally


@pytest.mark.parametrize(("d", "omega"), [(2, 1), (8, 3), (9, 4), (16, 5), (21, 1)])
def test_tally_flags_malformed_payloads_and_never_counts_them(d: int, omega: int) -> None:
    mech = build(1.0, d, omega)
    width = mech.payload_length
    spare = 8 * width - d
    good = mech.randomise_many([v % d for v in range(3 * d)])
    bad = [
        b"",
        bytes(width - 1),
        bytes(width + 1),
        good[0] + b"\x00",
        bytes(width),  # no member
        mech._bitmap(range(omega - 1)),  # one member short
        mech._bitmap(range(omega + 1)),  # one member too many
        mech._bitmap(range(d)),  # everything
    ]
    if spare:
        with_spare = bytearray(mech._bitmap(range(omega)))  # omega members: valid but for the spare bit
        with_spare[-1] |= 1
        short_spare = bytearray(mech._bitmap(range(omega - 1)))  # omega bits set counting the spare one
        short_spare[-1] |= 1
        bad += [bytes(with_spare), bytes(short_spare), b"\xff" * width]
    payloads = [*good[:d], *bad, *good[d:]]
    tally = mech.tally(payloads)
    assert tally.invalid.tolist() == [False] * d + [True] * len(bad) + [False] * (2 * d)
    assert tally.counts.tolist() == [sum(kit.bit(p, j) for p in good) for j in range(d)]
    assert tally.valid_count == len(good)
    only_bad = mech.tally(bad)
    assert only_bad.invalid.all() and only_bad.counts.tolist() == [0] * d
    assert mech.tally([]).counts.tolist() == [0] * d


# =========================================================================== timing


def test_running_time_does_not_separate_inputs() -> None:
    """Inputs 0 and 63 within ``core.audit``'s timing bound (see tests/core/test_timing.py)."""
    mech = build(1.0, 64)
    assert timing_separation(lambda: mech.randomise(0), lambda: mech.randomise(63)) <= TIMING_BOUND


def test_timing_check_has_teeth() -> None:
    """A randomiser that does twice the work for input 0 is separated (KS distance near 1)."""
    mech = build(1.0, 64)

    def leaky(value: int) -> bytes:
        if value == 0:
            mech.randomise(value)
        return mech.randomise(value)

    assert timing_separation(lambda: leaky(0), lambda: leaky(63)) > TIMING_BOUND  # seen: 0.89–1.0
