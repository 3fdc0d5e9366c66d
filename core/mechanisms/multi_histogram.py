"""Multi-message histogram: one split-and-mix Polya sum per bucket, one shared presence message.

For every bucket j a device adds its indicator 1{x = j} and its share of distributed noise
y_j - y'_j (y, y' ~ NB(1/expected_n, a), exact Polya draws from the CSPRNG), and splits
(1{x = j} + y_j - y'_j) mod q into m additive shares in Z_q, each a separate message tagged j
(Ishai, Kushilevitz, Ostrovsky, Sahai 2006; Balle, Bell, Gascon, Nissim CCS 2020 for the Polya
noise; Ghazi, Golowich, Kumar, Pagh, Velingker EUROCRYPT 2021 sec. 1 for the per-bucket
reduction). Plus one presence message, so the aggregator knows n. At expected_n devices every
bucket's total noise is exactly discrete Laplace: central accuracy. A device sends d m + 1
messages. Privacy: ``amplification.protocols.multi_histogram_delta``;
docs/mechanisms/multi_message_histogram.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING

from deniable.core.amplification.grid_search import climb_until_met, smallest_meeting
from deniable.core.amplification.protocols import (
    GRID,
    grid_up,
    multi_histogram_delta,
    multi_histogram_guarantee,
    polya_law,
)
from deniable.core.mechanisms.base import Estimate, FloatArray, Tally
from deniable.core.mechanisms.sample_threshold import (
    DEFAULT_DELTA,
    pack_many,
    unpack_many,
    width_for,
)
from deniable.core.mechanisms.split_and_mix import PolyaNoise, SplitAndMix
from deniable.core.rng import Csprng, default_rng
from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:
    import numpy as np
else:
    from deniable.core.lazy import numpy as np

MAX_BUCKETS = 4096
_HALF = 1 << 20  # share sums are tallied in two 20-bit halves (exact in float64 bincounts)


class MultiMessageHistogram(PolyaNoise, SplitAndMix):
    """Per bucket (1{x = j} + y_j - y'_j) mod q in m shares; one presence message per device."""

    name = "multi_message_histogram"
    proto = pb.MULTI_MESSAGE_HISTOGRAM
    summary = (
        "multi-message histogram: per bucket indicator + Polya noise in m shares mod q; near-central error"
    )
    manipulation_unbounded = (
        "unbounded: one fake device can set every bucket's sum to any value mod q (split-and-mix shares"
        " are arbitrary residues, not range-checked), i.e. anywhere in [n/2 - q/2, n/2 + q/2)"
    )
    share_terms = 2  # the two changed buckets' shares
    protocol_guarantee = staticmethod(multi_histogram_guarantee)
    protocol_delta = staticmethod(multi_histogram_delta)

    def __init__(
        self,
        epsilon0: float,
        domain_size: int,
        expected_n: float = 0.0,
        delta: float = DEFAULT_DELTA,
        messages: float | None = None,
        modulus: float | None = None,
        noise_probability: float | None = None,
    ) -> None:
        """epsilon0: central target at expected_n; m, q and the noise are chosen unless given."""
        super().__init__(epsilon0, domain_size)
        if domain_size > MAX_BUCKETS:
            raise ValueError(f"multi_message_histogram supports at most {MAX_BUCKETS} buckets")
        self._choose_parameters(expected_n, delta, messages, modulus, noise_probability)

    @property
    def shape_devices(self) -> int:
        """Every bucket's noise is Polya with shape 1/expected_n."""
        return self.expected_n

    # ----------------------------------------------------------------------- parameters

    def _smallest_noise(self) -> int:
        """Smallest p = g / 2**52 (to 1/128 relative) meeting epsilon0, searched from a = e^(-eps/2)."""
        target = -math.expm1(math.log(-math.expm1(-self.epsilon0 / 2)) / self.expected_n)
        hi = climb_until_met(self._meets, grid_up(target), GRID // 2)
        if hi is None:
            raise ValueError(
                f"no Polya noise reaches epsilon0={self.epsilon0:g} at expected_n={self.expected_n}"
            )
        lo = hi // 2
        while lo > 0 and self._meets(lo):
            hi, lo = lo, lo // 2
        return smallest_meeting(self._meets, lo, hi)

    # ----------------------------------------------------------------------- messages

    @property
    def share_width(self) -> int:
        return width_for(self.modulus - 1)

    @property
    def payload_length(self) -> int:
        return width_for(self.domain_size) + self.share_width

    @property
    def count_cells(self) -> int:
        return 1 + 2 * self.domain_size  # presence, share counts per bucket, share sums mod q per bucket

    @property
    def messages_per_device(self) -> int:
        """d m shares and one presence message, always."""
        return self.domain_size * self.messages + 1

    @property
    def expected_messages(self) -> float:
        return float(self.messages_per_device)

    def devices(self, counts: Sequence[int], messages: int) -> int:
        """The number of presence messages: one per device."""
        return int(counts[0])

    def _shares(self, values: np.ndarray, rng: Csprng) -> np.ndarray:
        """(devices, d, m) shares: per bucket m - 1 uniform in Z_q, the last completing the sum."""
        rows, d, q, m = values.size, self.domain_size, self.modulus, self.messages
        noise = rng.polya_many(self.noise, self.expected_n, 2 * rows * d).reshape(2, rows, d)
        noisy = noise[0] - noise[1]
        noisy[np.arange(rows), values] += 1
        free = rng.randbelow_array(q, rows * d * (m - 1)).reshape(rows, d, m - 1)
        last = (noisy - free.sum(axis=2)) % q
        return np.concatenate((free, last[:, :, None]), axis=2)

    def _payloads(self, shares: np.ndarray) -> list[bytes]:
        """Per device: bucket 0's m shares, ..., bucket d-1's, then the presence message."""
        rows, d, m = shares.shape
        tags = np.concatenate(
            (np.repeat(np.arange(d), m)[None, :].repeat(rows, 0), np.full((rows, 1), d)), axis=1
        )
        values = np.concatenate((shares.reshape(rows, d * m), np.zeros((rows, 1), dtype=np.int64)), axis=1)
        words = tags.astype(np.uint64) << np.uint64(8 * self.share_width) | values.astype(np.uint64)
        flat = pack_many(words.ravel(), self.payload_length)
        step = d * m + 1
        return [b"".join(flat[i : i + step]) for i in range(0, len(flat), step)]

    def randomise(self, value: int, rng: Csprng | None = None) -> bytes:
        self.check_value(value)
        return self._payloads(self._shares(np.array([int(value)]), rng or default_rng()))[0]

    def randomise_many(self, values: Sequence[int], rng: Csprng | None = None) -> list[bytes]:
        array = self.checked_values(values)
        if array.size == 0:
            return []
        return self._payloads(self._shares(array, rng or default_rng()))

    def output_distribution(self, value: int) -> dict[bytes, Fraction]:
        raise ValueError(f"{self.name}: the device's noise has infinite support; no finite exact law")

    def tally(self, payloads: Sequence[bytes]) -> Tally:
        d, q, shift = self.domain_size, self.modulus, 8 * self.share_width
        words, bad_length = unpack_many(payloads, self.payload_length)
        tags, values = words >> shift, words & ((1 << shift) - 1)
        presence = (tags == d) & (values == 0)
        share = (tags < d) & (values < q)
        invalid = bad_length | ~(presence | share)
        ok = share & ~invalid
        at, held = tags[ok], values[ok]
        low = np.bincount(at, weights=held % _HALF, minlength=d).astype(np.int64) % q
        high = np.bincount(at, weights=held // _HALF, minlength=d).astype(np.int64) % q
        sums = (low + high * _HALF) % q
        counts = np.concatenate(([int((presence & ~invalid).sum())], np.bincount(at, minlength=d), sums))
        return Tally(counts=counts.astype(np.int64), invalid=invalid)

    # ----------------------------------------------------------------------- estimator

    def decode(self, counts: Sequence[int], n: int) -> np.ndarray:
        """S_j + W_j per bucket: each share total mod q, represented in [n/2 - q/2, n/2 + q/2)."""
        if len(counts) != self.count_cells:
            raise ValueError(f"expected {self.count_cells} counts, got {len(counts)}")
        d = self.domain_size
        presence = int(counts[0])
        shares = np.asarray(counts[1 : 1 + d], dtype=np.int64)
        totals = np.asarray(counts[1 + d :], dtype=np.int64) % self.modulus
        if presence != n or np.any(shares != self.messages * presence):
            raise ValueError(
                f"share counts {sorted(set(shares.tolist()))} from {presence} devices (n={n}):"
                f" with m={self.messages} some shares are missing or extra; the sums mod q are lost"
            )
        margin = 2 * (12 * math.sqrt(n * self.noise_variance_per_device) + 64)
        if n + margin >= self.modulus:
            raise ValueError(f"modulus {self.modulus} is too small to decode the sums of {n} devices")
        low = n // 2 - self.modulus // 2
        return np.asarray(low + (totals - low) % self.modulus, dtype=np.int64)

    def noise_half_width(self, n: int, confidence: float) -> int:
        """Smallest h with P[|W| <= h] >= confidence for one bucket's exact total noise W."""
        if not 0 < confidence < 1:
            raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
        offset, pmf, neglected = polya_law(int(n), self.expected_n, float(self.noise))
        centre = -offset
        inside = np.cumsum(pmf[centre:] + np.concatenate(([0.0], pmf[centre - 1 :: -1])))
        reached = np.flatnonzero(inside >= confidence + neglected)
        return int(reached[0]) if reached.size else len(inside)

    def estimate(self, counts: Sequence[int], n: int, confidence: float = 0.95) -> list[Estimate]:
        """Exactly unbiased per bucket; the interval is the exact noise quantile (coverage >= confidence)."""
        sums = self.decode(counts, n)
        se = math.sqrt(n * self.noise_variance_per_device)
        half = self.noise_half_width(n, confidence)
        return [
            Estimate(max(0, min(int(s), n)), float(s), se, float(s - half), float(s + half)) for s in sums
        ]

    def variance(self, true_counts: Sequence[float] | FloatArray, n: int) -> FloatArray:
        """Var[W_j] = n Var[y - y'] for every bucket, whatever the truth."""
        return np.full(len(true_counts), n * self.noise_variance_per_device, dtype=np.float64)
