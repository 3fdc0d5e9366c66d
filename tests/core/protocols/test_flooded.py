"""flooded_histogram: the exact two-bucket profile against brute force, the estimator, the wire.

The brute force does NOT assume the per-bucket factorisation: it convolves whole devices' message
count vectors (every bucket's +1 and -1 counts together) and takes the hockey-stick divergence of
the full view for a replaced value.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import defaultdict
from fractions import Fraction

import numpy as np
import pytest

from deniable.core import mechanisms
from deniable.core.amplification._flooded import atoms_delta, flood_law, joint_law, prepare
from deniable.core.rng import Csprng, polya_probability
from deniable.v1 import deniable_pb2 as pb

NOISE = {0: 0.6, 1: 0.3, 2: 0.1}  # a small per-device law standing in for the Polya draw
SMALL_NOISE = {0: 0.7, 1: 0.3}  # with the compound flood (keeps the brute force under a second)
FLOOD = 0.3
BERNOULLI = ((0, 0.7), (1, 0.3))  # one flood pair w.p. 0.3 (ADR 0035)
COMPOUND = ((0, 0.6), (1, 0.25), (2, 0.15))  # several pairs at once, standing in for NB (ADR 0044)
Law = tuple[tuple[int, float], ...]


def device_law(value: int, d: int, flood: Law = BERNOULLI) -> dict[tuple[int, ...], float]:
    """Law of one device's counts (+1 at 0..d-1, -1 at 0..d-1), all buckets jointly."""
    law: dict[tuple[int, ...], float] = defaultdict(float)
    noise = NOISE if flood == BERNOULLI else SMALL_NOISE
    per_bucket = list(itertools.product(noise, noise, dict(flood)))
    for combo in itertools.product(per_bucket, repeat=d):
        prob, plus, minus = 1.0, [], []
        for j, (n1, n2, f) in enumerate(combo):
            prob *= noise[n1] * noise[n2] * dict(flood)[f]
            plus.append(n1 + f + (value == j))
            minus.append(n2 + f)
        law[tuple(plus + minus)] += prob
    return law


@functools.cache
def view_law(values: tuple[int, ...], d: int, flood: Law = BERNOULLI) -> dict[tuple[int, ...], float]:
    """Law of the shuffled view (the sum of the devices' count vectors)."""
    total: dict[tuple[int, ...], float] = {(0,) * (2 * d): 1.0}
    for value in values:
        step: dict[tuple[int, ...], float] = defaultdict(float)
        for a, pa in total.items():
            for b, pb_ in device_law(value, d, flood).items():
                step[tuple(x + y for x, y in zip(a, b, strict=True))] += pa * pb_
        total = step
    return total


def brute_delta(p: dict[tuple[int, ...], float], q: dict[tuple[int, ...], float], eps: float) -> float:
    return sum(max(0.0, pv - math.exp(eps) * q.get(k, 0.0)) for k, pv in p.items())


@pytest.mark.parametrize("flood_law", [BERNOULLI, COMPOUND], ids=["bernoulli", "compound"])
@pytest.mark.parametrize("eps", [0.0, 0.3, 1.0, 2.0])
def test_two_bucket_profile_equals_brute_force(eps: float, flood_law: Law) -> None:
    """n = 3, d = 2: the composed per-bucket atoms give the full view's divergence (both ways),
    for one flood pair per device (ADR 0035) and for several pairs at once (ADR 0044)."""
    d, others = 2, (0, 1)
    p, q = view_law((0, *others), d, flood_law), view_law((1, *others), d, flood_law)
    exact = max(brute_delta(p, q, eps), brute_delta(q, p, eps))
    law = NOISE if flood_law == BERNOULLI else SMALL_NOISE
    single = np.array([law[k] for k in sorted(law)])
    noise = np.convolve(np.convolve(single, single), single)
    per_device = np.array([prob for _, prob in flood_law])
    flood = np.convolve(np.convolve(per_device, per_device), per_device)
    stated = atoms_delta(prepare(joint_law(noise, flood), 0.0), eps)
    assert stated == pytest.approx(exact, rel=1e-6, abs=1e-12)


def test_flood_is_what_keeps_it_private() -> None:
    """Without the flood the -1 count reveals N2 and the profile is much worse (the test can fail)."""
    single = np.array([NOISE[k] for k in sorted(NOISE)])
    noise = np.convolve(np.convolve(single, single), single)
    flood = np.array([math.comb(3, k) * FLOOD**k * (1 - FLOOD) ** (3 - k) for k in range(4)])
    with_flood = atoms_delta(prepare(joint_law(noise, flood), 0.0), 1.0)
    without = atoms_delta(prepare(joint_law(noise, np.ones(1)), 0.0), 1.0)
    assert without > with_flood


def build(d: int = 4, n: float = 2000.0) -> mechanisms.LocalRandomiser:
    return mechanisms.create("flooded_histogram", epsilon0=1.0, domain_size=d, expected_n=n, delta=1e-6)


def test_registry_and_wire() -> None:
    mech = build()
    assert mechanisms.name_for_proto(pb.FLOODED_HISTOGRAM) == "flooded_histogram"
    assert mech.multi_message and not mech.local_privacy
    assert mech.payload_length == 1 and mech.count_cells == 9
    assert mech.central_guarantee(2000, 1e-6).epsilon <= 1.0 + 1e-9


def test_estimator_unbiased_with_its_stated_variance() -> None:
    """Mean and variance of the estimates over 3000 simulated devices x 40 runs. False-failure rate:
    the mean is checked at 6 standard errors (< 1e-8 each), the variance within 45% (chi-square
    with 160 degrees of freedom: < 1e-6)."""
    mech, rng = build(), Csprng(b"\x01" * 32)
    values = [0] * 1500 + [2] * 1000 + [3] * 500
    truth = np.bincount(values, minlength=4)
    errors = []
    for _ in range(40):
        payloads = mech.randomise_many(values, rng)
        messages = [m for p in payloads for m in mech.split_messages(p)]
        tally = mech.tally(messages)
        assert mech.devices(tally.counts.tolist(), len(messages)) == 3000
        errors.append([e.estimate for e in mech.estimate(tally.counts.tolist(), 3000)] - truth)
    err = np.array(errors)
    var = float(mech.variance(truth.tolist(), 3000)[0])
    assert np.all(np.abs(err.mean(axis=0)) <= 6 * math.sqrt(var / 40))
    assert abs(float(err.var()) / var - 1) < 0.45


def test_messages_at_the_issue_point() -> None:
    """d = 32, n = 1e5: 1.09x central per-bucket error in 2.26 expected messages (ADR 0044)."""
    mech = mechanisms.create("flooded_histogram", epsilon0=1.0, domain_size=32, expected_n=1e5, delta=1e-6)
    se = math.sqrt(float(mech.variance([0.0], 100_000)[0]))
    assert se <= 1.2 * 2 * math.sqrt(2)
    assert se <= 1.1 * 2 * math.sqrt(2)
    assert mech.expected_messages < 2.3  # type: ignore[attr-defined]


def test_nb_flood_total_is_the_devices_convolution() -> None:
    """flood_law(n, q, S) (the closed form NB(n/S, b)) equals the n-fold convolution of the exact
    per-device law (``polya_probability``), n = 3, S = 2; the trimmed mass is what it says."""
    q, shares, n = Fraction(1, 4), 2, 3
    per_device = np.array([float(polya_probability(k, q, shares)) for k in range(120)])
    total = np.convolve(np.convolve(per_device, per_device), per_device)[:120]
    lo, pmf, neglected = flood_law(n, float(q), shares)
    assert neglected <= 3 * math.exp(-60)
    assert np.allclose(pmf, total[lo : lo + pmf.size], rtol=1e-9, atol=1e-300)
    assert 1 - pmf.sum() == pytest.approx(neglected, abs=1e-12)


def test_sampler_draws_the_analysed_flood_law() -> None:
    """The device's flood pairs per bucket follow NB(1/S, b): chi-square of 60,000 draws against
    the exact law on {0, 1, 2, 3+} (3 degrees of freedom, threshold 32: false failure < 1e-6)."""
    mech = mechanisms.create(
        "flooded_histogram",
        epsilon0=1.0,
        domain_size=4,
        expected_n=2000,
        flood_shares=5,
        flood_probability=0.3,
        noise_probability=1e-4,
    )
    draws = mech._flood_counts(60_000, Csprng(b"\x02" * 32))  # type: ignore[attr-defined]
    exact = [float(polya_probability(k, Fraction(0.3), 5)) for k in range(3)]
    expected = np.array([*exact, 1 - sum(exact)]) * draws.size
    seen = np.array([np.sum(draws == 0), np.sum(draws == 1), np.sum(draws == 2), np.sum(draws >= 3)])
    assert float(((seen - expected) ** 2 / expected).sum()) < 32


def test_message_count_never_depends_on_the_value() -> None:
    """Same randomness, different values: the same number of messages (the shuffler sees counts)."""
    mech = build()
    counts = {len(mech.randomise(x, Csprng(b"\x03" * 32))) for x in range(4)}
    assert len(counts) == 1


def test_parameters_round_trip_the_exact_sampler() -> None:
    """A campaign's parameters rebuild the same flood and noise (no search, no re-rounding)."""
    mech = build()
    again = mechanisms.create("flooded_histogram", epsilon0=1.0, domain_size=4, **mech.parameters())
    assert again.parameters() == mech.parameters()
    assert mech.parameters()["flood_shares"] > 0  # the default flood is the NB one


def test_bernoulli_flood_is_still_available() -> None:
    """flood_dispersion 1 is the ADR 0035 law: a Bernoulli(r) pair per device, flood_shares 0."""
    mech = mechanisms.create(
        "flooded_histogram", epsilon0=1.0, domain_size=4, expected_n=2000, flood=500, flood_dispersion=1
    )
    assert mech.parameters()["flood_shares"] == 0
    assert mech.parameters()["flood_probability"] == pytest.approx(0.25)


def test_d1024_within_ten_messages_at_central_accuracy() -> None:
    """Issue 22 at d = 1024, n = 1e5: <= 1.2x central in <= 10 messages (about 1.09x, 9.5). The
    noise is the one the build's search finds (given here to keep the test fast); the exact
    profile at n = 1e5 meets epsilon 1 at delta 1e-6 with it."""
    mech = mechanisms.create(
        "flooded_histogram",
        epsilon0=1.0,
        domain_size=1024,
        expected_n=1e5,
        delta=1e-6,
        noise_probability=1.0079317762867746e-05,
    )
    assert mech.privacy_profile(100_000, 1.0) <= 1e-6
    se = math.sqrt(float(mech.variance([0.0], 100_000)[0]))
    assert se <= 1.2 * 2 * math.sqrt(2)
    assert mech.expected_messages <= 10  # type: ignore[attr-defined]
