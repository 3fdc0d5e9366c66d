"""The message count a shuffler waits for holds n_min whole devices (issue 22: a flooded_histogram
campaign's n_min of k devices was k messages, so the shuffler released about k / 2.3 devices, the
aggregator refused the release as below n_min, and it was retried forever)."""

from __future__ import annotations

import numpy as np

from deniable.core import mechanisms
from deniable.core.mechanisms.flooded import FloodedHistogram
from deniable.core.rng import Csprng

DEVICES = 400


def _flooded() -> FloodedHistogram:
    randomiser = mechanisms.create(
        "flooded_histogram", epsilon0=1.0, domain_size=8, expected_n=2000.0, noise_probability=0.002
    )
    assert isinstance(randomiser, FloodedHistogram)
    return randomiser


def _message_counts(randomiser: FloodedHistogram, devices: int, rounds: int) -> np.ndarray:
    """Total messages of ``devices`` devices, ``rounds`` times (fixed key: reproducible)."""
    rng = Csprng(key=bytes(range(32)))
    width = randomiser.payload_length
    totals = []
    for _ in range(rounds):
        payloads = randomiser.randomise_many([0] * devices, rng)
        totals.append(sum(len(p) // width for p in payloads))
    return np.array(totals)


def test_moments_match_the_sampler() -> None:
    """Mean and variance of one device's count against 20,000 simulated devices (z < 6: false
    failure < 1e-8 for the mean; the variance within 10 %, ~6 standard errors at this size)."""
    randomiser = _flooded()
    mean, variance = randomiser.message_count_moments()
    rng = Csprng(key=bytes(32))
    counts = (
        np.array([len(p) for p in randomiser.randomise_many([0] * 20_000, rng)]) // randomiser.payload_length
    )
    assert abs(counts.mean() - mean) < 6 * np.sqrt(variance / counts.size)
    assert abs(counts.var() / variance - 1) < 0.1


def test_fewer_devices_do_not_reach_the_threshold_and_the_old_one_is_reached() -> None:
    """DEVICES - 1 devices stay below message_threshold(DEVICES) in every one of 30 rounds (each
    round: P < 1e-12 by the 8-sigma margin); the old threshold (DEVICES messages) is reached by a
    fraction of the devices, which is the bug the threshold fixes."""
    randomiser = _flooded()
    threshold = randomiser.message_threshold(DEVICES)
    assert _message_counts(randomiser, DEVICES - 1, 30).max() < threshold
    assert _message_counts(randomiser, DEVICES // 2, 1)[0] >= DEVICES  # old rule: n_min x 1 message


def test_devices_within_inverts_the_threshold() -> None:
    """n_min in devices survives the trip through messages, for fixed and varying counts."""
    for randomiser in (_flooded(), mechanisms.create("grr", epsilon0=1.0, domain_size=8)):
        for devices in (1, 2, 17, DEVICES, 123_457):
            assert randomiser.devices_within(randomiser.message_threshold(devices)) == devices
    multi = mechanisms.create(
        "multi_message_histogram",
        epsilon0=1.0,
        domain_size=4,
        expected_n=20.0,
        messages=3,
        noise_probability=0.05,
    )
    assert multi.max_messages_per_device is not None
    assert multi.message_threshold(10) == 10 * multi.max_messages_per_device
