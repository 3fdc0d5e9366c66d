"""Hadamard response (``hadamard_response``): exact law, draw map, transform, estimator, audit, timing.

Exact checks use ``Fraction`` and a 60-digit correctly rounded e**x; every statistical assertion
states its false-failure rate (the chance a correct implementation fails it). Default-run sizes
keep this file to a few seconds; ``-m slow`` adds larger and subtler cases.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import pytest
from support import stats as kit
from support.stats import created

from deniable.core import mechanisms
from deniable.core.audit import TIMING_BOUND, chi_square_fit, timing_separation
from deniable.core.campaigns import layout_for, randomiser_for
from deniable.core.mechanisms import hadamard
from deniable.core.mechanisms.exact import PROBABILITY_BITS, exp_lower_bound
from deniable.core.mechanisms.hadamard import HadamardResponse, walsh_hadamard
from deniable.core.rng import Csprng
from deniable.v1 import deniable_pb2 as pb

ALPHA = 1e-6  # false-failure rate of each statistical assertion below
EPSILONS = (0.5, 1.0, 2.0, 4.0)
DOMAINS = (2, 3, 4, 7, 8, 15, 16, 31)
EXACT_CONFIGS = [(eps, d) for eps in EPSILONS for d in DOMAINS]
EXACT_IDS = [f"eps{eps}-d{d}" for eps, d in EXACT_CONFIGS]


def build(eps: float, d: int) -> HadamardResponse:
    return created(HadamardResponse, epsilon0=eps, domain_size=d)


def hadamard_matrix(order: int) -> np.ndarray:
    """H[w, i] = (-1)^popcount(w & i), built entry by entry."""
    return np.array([[(-1) ** bin(w & i).count("1") for i in range(order)] for w in range(order)])


def in_half(value: int, index: int) -> bool:
    """Is ``index`` in C_value = {i : H[value + 1, i] = +1}?"""
    return bin((value + 1) & index).count("1") % 2 == 0


# =========================================================================== exact law


@pytest.mark.parametrize(("eps", "d"), EXACT_CONFIGS, ids=EXACT_IDS)
def test_law_sums_to_one_and_worst_ratio_is_exact_and_tight(eps: float, d: int) -> None:
    mech = build(eps, d)
    k = mech.order
    assert k == next(2**j for j in range(1, 40) if 2**j > d)
    laws = [mech.output_distribution(v) for v in range(d)]
    support = set(laws[0])
    assert len(support) == k == mech.count_cells
    for v, law in enumerate(laws):
        assert set(law) == support and sum(law.values(), Fraction(0)) == 1
        for payload, p in law.items():
            assert len(payload) == mech.payload_length
            inside = in_half(v, int.from_bytes(payload, "big"))
            assert p == (mech.index_probability_inside if inside else mech.index_probability_outside)
        assert sum(in_half(v, i) for i in range(k)) == k // 2
    worst = max(max(law[o] for law in laws) / min(law[o] for law in laws) for o in support)
    lo, _ = kit.exp_interval(eps)
    assert worst == mech.index_probability_inside / mech.index_probability_outside
    assert worst <= exp_lower_bound(eps) < lo
    assert worst >= lo * (1 - Fraction(1, 2**30))
    assert mech.realised_epsilon == pytest.approx(math.log(worst), abs=1e-12)
    assert mech.realised_epsilon <= eps
    textbook = 2 * math.exp(eps) / (k * (math.exp(eps) + 1))
    assert float(mech.index_probability_inside) == pytest.approx(textbook, rel=2**-30)


@pytest.mark.parametrize(("eps", "d"), EXACT_CONFIGS, ids=EXACT_IDS)
def test_support_probabilities_make_the_estimator_exactly_unbiased(eps: float, d: int) -> None:
    """P(report in C_v | u) is exactly p (the inside probability) for u = v and exactly 1/2 for
    u != v (two distinct non-constant Hadamard rows agree on half the indices), so E[x_hat] = x;
    the exact count variance gives variance() = n / (2p - 1)^2 - x_v."""
    mech = build(eps, d)
    p = mech.inside_probability
    laws = [mech.output_distribution(u) for u in range(d)]
    for u, law in enumerate(laws):
        for v in range(d):
            prob = sum((q for o, q in law.items() if in_half(v, int.from_bytes(o, "big"))), Fraction(0))
            assert prob == (p if u == v else Fraction(1, 2))
    truth = [(5 * u + 2) % 7 * 100 for u in range(d)]
    n = sum(truth)
    for v in range(d):
        probs = [p if u == v else Fraction(1, 2) for u in range(d)]
        mean = sum((x * pr for x, pr in zip(truth, probs, strict=True)), Fraction(0))
        assert (2 * mean - n) / (2 * p - 1) == truth[v]
        var = sum((x * pr * (1 - pr) for x, pr in zip(truth, probs, strict=True)), Fraction(0))
        assert mech.variance(truth, n)[v] == pytest.approx(float(4 * var / (2 * p - 1) ** 2), rel=1e-9)


def test_payload_length_and_limits() -> None:
    assert [build(1.0, d).payload_length for d in (2, 127, 255, 256, 2**16 - 1, 2**16)] == [1, 1, 1, 2, 2, 3]
    assert [build(1.0, d).order for d in (2, 3, 4, 255, 256)] == [4, 4, 8, 256, 512]
    big = build(1.0, 2**16)
    with pytest.raises(ValueError):
        big.output_distribution(0)  # K = 2^17 outputs: over the documented 2^16
    assert big.realised_epsilon == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(ValueError):
        build(1.0, 2**24)
    for eps in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            build(eps, 8)
    with pytest.raises(ValueError):
        mechanisms.create("hadamard_response", epsilon0=1.0, domain_size=8, g=3)


class ScriptedRng(Csprng):
    """``randbits`` returns scripted values (checked to fit) and records the widths asked for."""

    def __init__(self, script: Sequence[int]) -> None:
        super().__init__(key=bytes(32))
        self.script = list(script)
        self.widths: list[int] = []

    def randbits(self, bits: int) -> int:
        self.widths.append(bits)
        value = self.script.pop(0)
        assert 0 <= value < 1 << bits
        return value


@pytest.mark.parametrize(("eps", "d"), [(1.0, 3), (0.5, 7), (2.0, 16), (4.0, 31), (1.0, 100)])
def test_draw_map_gives_exactly_the_output_distribution(eps: float, d: int) -> None:
    """Side: a 64-bit draw below T lands in C_v (exactly T of 2^64 draws); position: log2(K/2)
    uniform bits, mapped bijectively onto the chosen half. So every index of C_v gets exactly
    T / 2^64 * 2 / K and every other index (2^64 - T) / 2^64 * 2 / K, as output_distribution says."""
    mech = build(eps, d)
    k = mech.order
    threshold = mech.inside_probability * 2**PROBABILITY_BITS
    assert threshold.denominator == 1
    t = int(threshold)
    probe = ScriptedRng([0, 0])
    mech.randomise(0, probe)
    assert probe.widths == [PROBABILITY_BITS, k.bit_length() - 2]
    for v in sorted({0, 1, d // 2, d - 1}):
        c_v = {i for i in range(k) if in_half(v, i)}
        inside = [mech.randomise(v, ScriptedRng([draw, u])) for draw in (0, t - 1) for u in range(k // 2)]
        outside = [
            mech.randomise(v, ScriptedRng([draw, u])) for draw in (t, 2**64 - 1) for u in range(k // 2)
        ]
        half = k // 2
        assert {int.from_bytes(x, "big") for x in inside[:half]} == c_v
        assert inside[:half] == inside[half:]
        assert {int.from_bytes(x, "big") for x in outside[:half]} == set(range(k)) - c_v
        assert outside[:half] == outside[half:]


def test_registry_round_trip() -> None:
    mech = mechanisms.create("hadamard_response", epsilon0=1, domain_size=64)
    assert isinstance(mech, HadamardResponse)
    assert (mech.order, mech.count_cells, mech.payload_length, mech.parameters()) == (128, 128, 1, {})
    assert "hadamard_response" in mechanisms.names() and mechanisms.summaries()["hadamard_response"]
    assert mechanisms.name_for_proto(pb.HADAMARD_RESPONSE) == "hadamard_response"
    assert mechanisms.proto_for_name("hadamard_response") == pb.HADAMARD_RESPONSE
    campaign = pb.Campaign(mechanism=pb.HADAMARD_RESPONSE, epsilon0=1.0, labels=[f"l{i}" for i in range(64)])
    rebuilt = randomiser_for(campaign)
    assert isinstance(rebuilt, HadamardResponse) and layout_for(rebuilt).payload_length == 1


# =========================================================================== transform, tally, aggregation


@pytest.mark.parametrize("order", [1, 2, 4, 8, 16, 64])
def test_walsh_hadamard_equals_the_matrix_product(order: int) -> None:
    rng = np.random.default_rng(order)
    for _ in range(5):
        counts = rng.integers(0, 10**9, size=order)
        assert walsh_hadamard(counts).tolist() == (hadamard_matrix(order) @ counts).tolist()
    with pytest.raises(ValueError):
        walsh_hadamard([1, 2, 3])
    with pytest.raises(ValueError):
        walsh_hadamard([])


def test_tally_flags_malformed_payloads_and_never_counts_them() -> None:
    mech = build(1.0, 5)  # K = 8, one byte
    good = [bytes([i]) for i in range(8)]
    bad = [b"", b"\x00\x00", bytes([8]), bytes([255]), b"\x01\x02\x03"]
    tally = mech.tally([*good, *bad, good[3]])
    assert tally.invalid.tolist() == [False] * 8 + [True] * len(bad) + [False]
    assert tally.counts.tolist() == [1, 1, 1, 2, 1, 1, 1, 1]
    assert tally.valid_count == 9
    assert mech.tally(bad).invalid.all() and mech.tally(bad).counts.sum() == 0
    assert mech.tally([]).counts.tolist() == [0] * 8
    full = build(1.0, 255)  # K = 256: every one-byte payload is valid
    assert not full.tally([bytes([i]) for i in range(256)]).invalid.any()
    wide = build(1.0, 256)  # K = 512, two bytes
    t = wide.tally([(511).to_bytes(2, "big"), (512).to_bytes(2, "big"), b"\xff\xff", b"\x01"])
    assert t.invalid.tolist() == [False, True, True, True] and t.counts[511] == 1


@pytest.mark.parametrize(("eps", "d"), [(1.0, 3), (2.0, 17), (0.5, 64), (4.0, 100)])
def test_fast_aggregation_equals_brute_force(eps: float, d: int) -> None:
    """support_counts (one Walsh-Hadamard transform) equals the O(n d) loop exactly, and
    estimate applies (2 S_v - n) / (2p - 1) to it."""
    mech = build(eps, d)
    rng = Csprng(key=b"\x12" * 32)
    values = [(v * v + 5) % d for v in range(2000)]
    payloads = mech.randomise_many(values, rng) + [mech.randomise(v, rng) for v in values[:300]]
    tally = mech.tally(payloads)
    assert not tally.invalid.any()
    brute = [0] * d
    for payload in payloads:
        index = int.from_bytes(payload, "big")
        for v in range(d):
            brute[v] += in_half(v, index)
    support = mech.support_counts(tally.counts)
    assert support.tolist() == brute
    n = len(payloads)
    rows = mech.estimate(tally.counts.tolist(), n)
    assert [r.raw_count for r in rows] == brute
    gap = 2 * float(mech.inside_probability) - 1
    np.testing.assert_allclose([r.estimate for r in rows], (2 * support - n) / gap, rtol=1e-12)
    with pytest.raises(ValueError):
        mech.estimate([0] * (mech.order + 1), n)


def test_estimate_inverts_expected_counts_and_builds_the_ci() -> None:
    mech = build(2.0, 12)
    truth = [5000, 1000, 0, *[100] * 9]
    n = sum(truth)
    cells = np.zeros(mech.order)
    for v, x in enumerate(truth):
        for payload, prob in mech.output_distribution(v).items():
            cells[int.from_bytes(payload, "big")] += x * float(prob)
    exact_support = (n + (hadamard_matrix(mech.order) @ cells)[1:13]) / 2
    gap = 2 * float(mech.inside_probability) - 1
    np.testing.assert_allclose((2 * exact_support - n) / gap, truth, atol=1e-6 * n)
    rows = mech.estimate(np.round(cells).astype(np.int64).tolist(), n)
    kit.assert_normal_ci(mech, rows, n)


# =========================================================================== goodness of fit


def test_goodness_of_fit_has_teeth() -> None:
    """A sampler using row v instead of v + 1 (the all-ones row for v = 0: a uniform output) is
    rejected with 20,000 samples: P(C_0) is off by 0.23 absolute, ~65 sigma."""
    mech = build(1.0, 5)
    rng = Csprng()
    fake = Counter(bytes([rng.randbelow(8)]) for _ in range(20_000))
    assert chi_square_fit(fake, mech.output_distribution(0), ALPHA).rejects


# =========================================================================== privacy audit


LADDER = (10_000, 20_000, 50_000, 100_000, 200_000, 500_000, 1_000_000, 2_000_000)


def overclaiming(eps: float, factor: float, d: int) -> HadamardResponse:
    mech = build(eps * factor, d)
    mech.epsilon0 = eps
    return mech


@pytest.mark.parametrize(("eps", "d"), [(0.5, 3), (1.0, 7), (2.0, 5)])
def test_audit_refutes_a_2x_mutant(eps: float, d: int) -> None:
    """Runs at 2 eps0 while claiming eps0; the sample size is the smallest on the ladder for which
    ``audit_cannot_miss`` proves a miss probability <= 1e-6 (the false-failure rate)."""
    kit.assert_refuted(overclaiming(eps, 2.0, d), LADDER, ALPHA)


@pytest.mark.slow
@pytest.mark.parametrize(("eps", "d"), [(0.5, 3), (1.0, 7), (2.0, 5), (4.0, 3)])
def test_audit_refutes_a_1_1x_mutant(eps: float, d: int) -> None:
    """As above for 1.1x mutants (up to ~2 million reports per input); false-failure rate 1e-6."""
    kit.assert_refuted(overclaiming(eps, 1.1, d), LADDER, ALPHA)


# =========================================================================== estimator


SKEWED = [7000, 1500, 800, 400, 200, 100, 0, 0, 0, 0]  # n = 10,000 over d = 10 (K = 16)


@pytest.mark.parametrize("eps", [1.0, 2.0, 4.0])
def test_estimator_unbiased_exact_variance_and_coverage(eps: float) -> None:
    """4,000 simulated rounds of 10,000 reports from the exact law; ``core.audit.check_estimator``
    (mean, variance, 95% CI coverage; 3 d checks share the false-failure rate 1e-6).

    Teeth at eps0 >= 2: the variance without the truth-dependent term, n / (2p - 1)^2, would
    be rejected for the bucket holding 70% of the population (disjoint acceptance regions)."""
    mech = build(eps, len(SKEWED))
    counts = kit.multinomial_rounds(mech, SKEWED, 4000, seed=2026)
    result = kit.assert_estimator(mech, SKEWED, counts, ALPHA)
    truth_free = sum(SKEWED) / (2 * float(mech.inside_probability) - 1) ** 2
    lo, hi = result.variance_ratio_bounds
    if eps >= 2:
        assert lo * truth_free > hi * result.variance[0]


@pytest.mark.slow
@pytest.mark.parametrize(("eps", "d"), [(0.5, 5), (1.0, 17), (2.0, 70), (4.0, 60), (8.0, 10)])
def test_estimator_unbiased_exact_variance_and_coverage_large(eps: float, d: int) -> None:
    """20,000 simulated rounds, truth on 5 values of larger domains; false-failure rate 1e-6."""
    truth = [6000, 2000, 1000, 500, 500, *[0] * (d - 5)]
    mech = build(eps, d)
    kit.assert_estimator(mech, truth, kit.multinomial_rounds(mech, truth, 20_000, seed=7), ALPHA)


# =========================================================================== timing


def test_randomise_timing_does_not_reveal_the_value() -> None:
    """Constant work: v = 0 (w = 1, bit inserted at position 0) against v = 511 (w = 512, bit
    inserted at position 9), within ``core.audit``'s timing bound. facts.md: a branchy k-RR gave
    a 96.9% classifier."""
    mech = build(1.0, 1000)
    assert timing_separation(lambda: mech.randomise(0), lambda: mech.randomise(511)) <= TIMING_BOUND


class BranchyHadamard(HadamardResponse):
    """Mutant: walks C_v one index at a time (work grows with the position of the answer)."""

    def randomise(self, value: int, rng: Csprng | None = None) -> bytes:
        out = super().randomise(value, rng)
        for i in range(value):  # value-dependent work: the leak the timing test must see
            _ = i & value
        return out


@pytest.mark.slow
def test_timing_check_has_teeth() -> None:
    """The value-dependent mutant (511 extra loop steps, ~10 us) is separated far beyond the KS bound."""
    mech = BranchyHadamard(1.0, 1000)
    assert timing_separation(lambda: mech.randomise(0), lambda: mech.randomise(511), attempts=1) > 0.9
    assert hadamard.MAX_EXACT_OUTPUTS == 1 << 16
