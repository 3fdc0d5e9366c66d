"""multi_message_sum_binomial: share hiding, the noise profile, the whole shuffled view, the estimator.

(The Polya-noise ``multi_message_sum`` shares this code path; its own tests: test_multi_sum_polya.py.)

Brute force on tiny parameters, in exact rational arithmetic: the law of the shuffled multiset of
shares (a count vector over Z_q) is the convolution of the devices' exact share laws. Checked:
the split-and-mix distance bound against the exact total variation distance to uniform shares;
the noise profile against the exact law of Bin(n, p) - Bin(n, p); and the whole view's
hockey-stick divergence for neighbouring inputs against noise profile + (1 + e^eps) x distance.
Statistical assertions state their false-failure rates.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np
import pytest
from scipy import stats
from support.share_laws import exact_share_distance, hockey, noise_law, view_law
from support.stats import created

from deniable.core import mechanisms
from deniable.core.amplification.protocols import (
    GRID,
    multi_sum_guarantee,
    noise_delta,
    share_hiding_distance,
)
from deniable.core.mechanisms.exact import exp_lower_bound
from deniable.core.mechanisms.multi_sum import BinomialMultiMessageSum
from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:  # the kit fixture's type only
    from support.stats import Kit

ALPHA = 1e-6  # false-failure rate of each statistical assertion


def build(eps: float = 1.0, **params: float) -> BinomialMultiMessageSum:
    return created(BinomialMultiMessageSum, epsilon0=eps, domain_size=2, **params)


# --------------------------------------------------------------------------- analyses vs brute force


@pytest.mark.parametrize(("n", "m", "q"), [(3, 3, 2), (4, 3, 2), (2, 4, 2), (3, 4, 3), (2, 3, 5)])
def test_share_hiding_bound_covers_the_exact_distance(n: int, m: int, q: int) -> None:
    exact = exact_share_distance(n, m, q)
    bound = share_hiding_distance(n, m, q)
    assert 0 < exact <= Fraction(bound)
    assert bound < 0.5  # the bound says something at these sizes


@pytest.mark.parametrize("n", [1, 2, 5, 8])
@pytest.mark.parametrize("p", [Fraction(1, 4), Fraction(1, 2), Fraction(3, 64)])
def test_noise_profile_matches_the_exact_binomial_difference(n: int, p: Fraction) -> None:
    w_law: dict[int, Fraction] = {0: Fraction(1)}
    for _ in range(n):
        step: dict[int, Fraction] = {}
        for w, pw in w_law.items():
            for z, pz in noise_law(p).items():
                step[w + z] = step.get(w + z, Fraction(0)) + pw * pz
        w_law = step
    for eps in (0.1, 0.7, 2.0):
        factor = exp_lower_bound(eps)
        zero = Fraction(0)
        exact = sum(
            (max(zero, w_law.get(y - 1, zero) - factor * w_law.get(y, zero)) for y in range(-n, n + 2)), zero
        )
        assert float(exact) <= noise_delta(n, float(p), eps) * (1 + 1e-12)
        assert noise_delta(n, float(p), eps) == pytest.approx(float(exact), rel=3e-9, abs=1e-300)


@pytest.mark.parametrize(("m", "q"), [(2, 5), (3, 5), (3, 4)])
def test_whole_view_divergence_within_noise_plus_share_distance(m: int, q: int) -> None:
    """n = 2 devices, p = 1/4: for every neighbouring pair of inputs and eps in {0.5, 1.5}, the
    exact hockey-stick of the whole view is at most noise(eps) + (1 + e^eps) * exact distance,
    the reduction the analysis uses; and the analysis's own delta is never below it."""
    n, p = 2, Fraction(1, 4)
    distance = exact_share_distance(n, m, q)
    for bits in itertools.product((0, 1), repeat=n):
        for i in range(n):
            other = tuple(1 - b if j == i else b for j, b in enumerate(bits))
            a, b = view_law(bits, p, m, q), view_law(other, p, m, q)
            for eps in (0.5, 1.5):
                exact = hockey(a, b, exp_lower_bound(eps))
                reduction = Fraction(noise_delta(n, float(p), eps)) + (1 + Fraction(math.exp(eps))) * distance
                assert exact <= reduction
                assert exact <= Fraction(
                    min(
                        1.0,
                        noise_delta(n, float(p), eps) + (1 + math.exp(eps)) * share_hiding_distance(n, m, q),
                    )
                )
                assert 0 < exact < 1


# --------------------------------------------------------------------------- parameters and laws


def test_defaults_meet_the_target_with_the_smallest_noise() -> None:
    mech = build(1.0, expected_n=5000.0, delta=1e-6)
    bound = mech.central_guarantee(5000, 1e-6)
    assert bound.amplified and bound.epsilon <= 1.0
    smaller = float(mech.noise * Fraction(63, 64))
    assert multi_sum_guarantee(5000, smaller, mech.messages, mech.modulus, 1e-6).epsilon > 1.0
    assert mech.noise.denominator <= GRID and mech.modulus >= 8 * 5000
    assert share_hiding_distance(5000, mech.messages, mech.modulus) * (1 + math.e) <= 1e-7
    assert share_hiding_distance(5000, mech.messages - 1, mech.modulus) * (1 + math.e) > 1e-7
    # Near-central accuracy: the noise standard deviation is a few units, independent of n.
    assert math.sqrt(5000 * mech.noise_variance_per_device) < 6
    assert mech.central_guarantee(20_000, 1e-6).epsilon < bound.epsilon  # more devices, more noise


def test_registry_round_trip_from_float_params() -> None:
    mech = build(1.0, expected_n=5000.0, delta=1e-6)
    assert mechanisms.name_for_proto(pb.MULTI_MESSAGE_SUM_BINOMIAL) == "multi_message_sum_binomial"
    params = mech.parameters()
    assert set(params) == {"expected_n", "delta", "messages", "modulus", "noise_probability"}
    again = build(1.0, **{k: float(v) for k, v in params.items()})
    assert (again.noise, again.messages, again.modulus) == (mech.noise, mech.messages, mech.modulus)
    assert mech.multi_message and not mech.local_privacy and mech.count_cells == 3


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"expected_n": 1000.0, "messages": 1.0},
        {"expected_n": 1000.0, "modulus": 2.0},
        {"expected_n": 1000.0, "noise_probability": 0.75},
        {"expected_n": 1000.0, "delta": -1.0},
    ],
)
def test_bad_parameters_are_value_errors(params: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        build(1.0, **params)


def tiny() -> BinomialMultiMessageSum:
    return build(1.0, expected_n=4.0, delta=0.3, messages=2.0, modulus=5.0, noise_probability=0.25)


def test_output_distribution_is_exact_and_randomise_fits_it() -> None:
    """q = 5, m = 2, p = 1/4: 15 payloads per bit; 30,000 draws through randomise and
    randomise_many; Pearson chi-square at 1e-6 each."""
    mech = tiny()
    for bit in (0, 1):
        law = mech.output_distribution(bit)
        assert len(law) == 15 and sum(law.values()) == 1
        outputs = sorted(law)
        expected = np.array([30_000 * float(law[o]) for o in outputs])
        for draws in ([mech.randomise(bit) for _ in range(30_000)], mech.randomise_many([bit] * 30_000)):
            observed = Counter(draws)
            assert set(observed) <= set(law)
            stat = float((((np.array([observed[o] for o in outputs]) - expected) ** 2) / expected).sum())
            assert stat <= stats.chi2.isf(ALPHA, len(outputs) - 1)


def test_each_device_shares_sum_to_its_bit_plus_noise_and_presence_is_constant() -> None:
    mech = build(1.0, expected_n=1000.0, delta=1e-6)
    for bit, payload in zip([0, 1] * 500, mech.randomise_many([0, 1] * 500), strict=True):
        messages = mech.split_messages(payload)
        assert len(messages) == mech.messages + 1
        tally = mech.tally(messages)
        assert tally.counts[0] == 1 and tally.counts[1] == mech.messages
        assert (int(tally.counts[2]) - bit) % mech.modulus in (0, 1, mech.modulus - 1)
        assert messages[-1] == bytes(mech.payload_length)  # the same presence message for everyone


def test_tally_flags_malformed_messages() -> None:
    mech = tiny()  # q = 5: one tag byte and one value byte
    good = [b"\x00\x00", b"\x01\x00", b"\x01\x04", b"\x01\x03"]
    bad = [b"\x00\x01", b"\x01\x05", b"\x02\x00", b"\x01", b"\x01\x00\x00", b""]
    tally = mech.tally([*good, *bad])
    assert tally.invalid.tolist() == [False] * 4 + [True] * 6
    assert tally.counts.tolist() == [1, 3, (0 + 4 + 3) % 5]


def test_decoding_refuses_missing_shares_and_a_small_modulus() -> None:
    mech = tiny()
    with pytest.raises(ValueError, match="missing"):
        mech.estimate([2, 3, 1], 2)
    with pytest.raises(ValueError, match="too small"):
        mech.estimate([4, 8, 1], 4)


# --------------------------------------------------------------------------- estimator


def test_estimator_unbiased_exact_variance_and_coverage_through_the_real_randomiser(kit: Kit) -> None:
    """300 rounds of 3,000 real devices (CSPRNG, all messages through tally and the decoder).
    The decoded sum is S + W exactly, W a sum of 3,000 iid bounded terms (excess kurtosis
    O(1/(n p)), negligible): mean, chi-square variance band and coverage, Bonferroni over three
    checks, total false-failure rate 1e-6."""
    mech = build(1.0, expected_n=3000.0, delta=1e-6)
    rounds = 300
    ones, covers = kit.decoded_sums(mech, [1] * 1200 + [0] * 1800, rounds)
    covered = sum(covers)
    variance = float(mech.variance([1800, 1200], 3000)[1])
    assert variance == pytest.approx(3000 * 2 * float(mech.noise) * (1 - float(mech.noise)))
    level = ALPHA / 3
    assert abs(ones.mean() - 1200) <= stats.norm.isf(level / 2) * math.sqrt(variance / rounds)
    ratio = ones.var(ddof=1) / variance
    assert stats.chi2.ppf(level / 2, rounds - 1) / (rounds - 1) <= ratio
    assert ratio <= stats.chi2.isf(level / 2, rounds - 1) / (rounds - 1)
    assert stats.binom.ppf(level / 2, rounds, 0.95) <= covered <= stats.binom.isf(level / 2, rounds, 0.95)


@pytest.mark.slow
@pytest.mark.parametrize(("n", "m", "q"), [(4, 4, 3), (5, 4, 2), (6, 3, 2), (3, 3, 5), (4, 4, 2)])
def test_share_hiding_bound_covers_the_exact_distance_large(n: int, m: int, q: int) -> None:
    """As the default-run check, at larger brute-force sizes."""
    assert exact_share_distance(n, m, q) <= Fraction(share_hiding_distance(n, m, q))
