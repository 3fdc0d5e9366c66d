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

import numpy as np
import pytest

from deniable.core import mechanisms
from deniable.core.amplification._flooded import atoms_delta, joint_law, prepare
from deniable.core.rng import Csprng
from deniable.v1 import deniable_pb2 as pb

NOISE = {0: 0.6, 1: 0.3, 2: 0.1}  # a small per-device law standing in for the Polya draw
FLOOD = 0.3


def device_law(value: int, d: int) -> dict[tuple[int, ...], float]:
    """Law of one device's counts (+1 at 0..d-1, -1 at 0..d-1), all buckets jointly."""
    law: dict[tuple[int, ...], float] = defaultdict(float)
    per_bucket = list(itertools.product(NOISE, NOISE, (0, 1)))
    for combo in itertools.product(per_bucket, repeat=d):
        prob, plus, minus = 1.0, [], []
        for j, (n1, n2, f) in enumerate(combo):
            prob *= NOISE[n1] * NOISE[n2] * (FLOOD if f else 1 - FLOOD)
            plus.append(n1 + f + (value == j))
            minus.append(n2 + f)
        law[tuple(plus + minus)] += prob
    return law


@functools.cache
def view_law(values: tuple[int, ...], d: int) -> dict[tuple[int, ...], float]:
    """Law of the shuffled view (the sum of the devices' count vectors)."""
    total: dict[tuple[int, ...], float] = {(0,) * (2 * d): 1.0}
    for value in values:
        step: dict[tuple[int, ...], float] = defaultdict(float)
        for a, pa in total.items():
            for b, pb_ in device_law(value, d).items():
                step[tuple(x + y for x, y in zip(a, b, strict=True))] += pa * pb_
        total = step
    return total


def brute_delta(p: dict[tuple[int, ...], float], q: dict[tuple[int, ...], float], eps: float) -> float:
    return sum(max(0.0, pv - math.exp(eps) * q.get(k, 0.0)) for k, pv in p.items())


@pytest.mark.parametrize("eps", [0.0, 0.3, 1.0, 2.0])
def test_two_bucket_profile_equals_brute_force(eps: float) -> None:
    """n = 3, d = 2: the composed per-bucket atoms give the full view's divergence (both ways)."""
    d, others = 2, (0, 1)
    p, q = view_law((0, *others), d), view_law((1, *others), d)
    exact = max(brute_delta(p, q, eps), brute_delta(q, p, eps))
    single = np.array([NOISE[k] for k in sorted(NOISE)])
    noise = np.convolve(np.convolve(single, single), single)
    flood = np.array([math.comb(3, k) * FLOOD**k * (1 - FLOOD) ** (3 - k) for k in range(4)])
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
    """d = 32, n = 1e5: 1.12x central per-bucket error in 2.64 expected messages."""
    mech = mechanisms.create("flooded_histogram", epsilon0=1.0, domain_size=32, expected_n=1e5, delta=1e-6)
    se = math.sqrt(float(mech.variance([0.0], 100_000)[0]))
    assert se <= 1.2 * 2 * math.sqrt(2)
    assert mech.expected_messages < 3  # type: ignore[attr-defined]
