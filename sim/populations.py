"""True values of simulated devices: deterministic populations with known shares.

Nothing here is random: the truth a simulation is checked against is fixed by the shares and
the number of devices, and the noise comes only from the mechanisms (``deniable.core.rng``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def exact_population(shares: Sequence[float], devices: int) -> np.ndarray:
    """True values for ``devices`` simulated devices, counts as close to ``shares`` as integers allow.

    Devices are listed bucket by bucket; order carries no information past the shuffler.
    """
    counts = np.floor(np.asarray(shares) * devices).astype(int)
    counts[0] += devices - int(counts.sum())
    return np.repeat(np.arange(len(shares)), counts)


def zipf_shares(buckets: int, exponent: float = 1.0) -> list[float]:
    """Deterministic, skewed true shares over ``buckets`` categories (Zipf)."""
    weights = 1.0 / np.arange(1, buckets + 1, dtype=np.float64) ** exponent
    return [float(w) for w in weights / weights.sum()]


def interleaved_population(shares: Sequence[float], devices: int) -> np.ndarray:
    """``exact_population`` (counts as close to the shares as integers allow), spread out in order.

    Devices are reordered by a fixed stride coprime to their number, so arrivals over time mix
    every value (deterministic: no random generator involved).
    """
    values = exact_population(shares, devices)
    if devices < 3:
        return values
    stride = int(devices * 0.6180339887) | 1
    while np.gcd(stride, devices) != 1:
        stride += 2
    order = (np.arange(devices, dtype=np.int64) * stride) % devices
    return values[order]
