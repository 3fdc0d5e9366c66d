"""Flooded histogram: near-central accuracy in about 2 messages per device at d = 32, 10 at d = 1024.

Messages are "+1 at j" (value j), "-1 at j" (value d + j) and one constant presence message
(value 2d). A device with value x sends, for every bucket j:
  "+1 at j" 1{x = j} + N1_j + F_j times and "-1 at j" N2_j + F_j times,
with N1_j, N2_j ~ NB(1/expected_n, a) exact Polya draws (Balle, Bell, Gascon, Nissim CCS 2020)
and F_j "flood" pairs that cancel in the estimate: F_j ~ NB(1/S, b), a Polya draw nonzero w.p.
q, so the n devices' pairs add up to NB(n/S, b) with variance / mean = 1 / (1 - b) (ADR 0044:
the same hiding for fewer messages than a Bernoulli(r) pair per device, ADR 0035, still
available as ``flood_dispersion`` 1). The analyser's estimate
c(+1, j) - c(-1, j) = x_j + (sum N1_j - sum N2_j): at expected_n devices the noise is exactly
discrete Laplace, unbiased, variance n Var(N1 - N2) (the same noise as multi_message_histogram).
The flood hides how much of the "-1" count is noise: without it the "-1" count would reveal
sum N2 and the "+1" count's noise would be one-sided. The idea is Ghazi, Kumar, Manurangsi,
Pagh (ICML 2020, "private counting from anonymous messages") and Ghazi, Kumar, Manurangsi,
Pagh, Sinha (ICML 2021): correlated +1/-1 noise messages; the analysis here is our own exact
two-bucket profile (``amplification._flooded``). Expected messages: 2 + 2 d (E[F_j] + P[N > 0]).
Local guarantee: none (the own "+1" is sent in the clear, sealed only to the aggregator).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Final

from deniable.core.amplification.grid_search import climb_until_met, smallest_meeting
from deniable.core.amplification.protocols import (
    GRID,
    GRID_BITS,
    flooded_histogram_guarantee,
    grid_up,
    polya_law,
)
from deniable.core.amplification.shuffle import AmplificationBound
from deniable.core.mechanisms.base import Estimate, FloatArray, LocalRandomiser, Tally
from deniable.core.mechanisms.sample_threshold import (
    DEFAULT_DELTA,
    int_param,
    pack_many,
    probability_param,
    unpack_many,
    width_for,
)
from deniable.core.mechanisms.split_and_mix import PolyaNoise, given_noise
from deniable.core.rng import Csprng, default_rng
from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:
    import numpy as np
else:
    from deniable.core.lazy import numpy as np

MAX_BUCKETS = 4096
DEFAULT_FLOOD = 400.0  # expected flood pairs per bucket at expected_n (at most; see default_flood)
FLOOD_MESSAGES = 7.5  # the default flood costs at most this many messages per device on average
DEFAULT_DISPERSION = 8.0  # Var / mean of the total flood: 1.08x central at n = 1e5, d = 1024


def default_flood(expected_n: int, domain_size: int) -> float:
    """min(400, N / 4, 7.5 N / (2 d)): at most 7.5 flood messages per device whatever d."""
    return min(DEFAULT_FLOOD, expected_n / 4, FLOOD_MESSAGES * expected_n / (2 * domain_size))


def flood_sampler(expected_n: int, flood: float, dispersion: float) -> tuple[int, int]:
    """(S, q numerator on the 2^-52 grid) for a total flood of mean ~``flood`` and Var / mean
    ``dispersion`` at N devices: NB(N/S, b), 1 - b = 1 / dispersion, S = round(N (D - 1) / flood),
    q = 1 - D^(-1/S) rounded up. ``dispersion`` 1: S = 0, Bernoulli(q = flood / N) pairs."""
    if not 1 <= dispersion <= 1000:
        raise ValueError(f"flood_dispersion must lie in [1, 1000], got {dispersion!r}")
    if dispersion == 1 or flood == 0:
        return 0, grid_up(flood / expected_n)
    shares = max(1, round(expected_n * (dispersion - 1) / flood))
    return shares, grid_up(-math.expm1(-math.log(dispersion) / shares))


MESSAGE_SIGMAS: Final = 8.0
"""Standard deviations above the mean of devices - 1 devices' messages for ``message_threshold``."""


class FloodedHistogram(PolyaNoise, LocalRandomiser):
    """Per bucket +1 (own value + Polya noise + flood), -1 (Polya noise + flood); one presence."""

    name = "flooded_histogram"
    proto = pb.FLOODED_HISTOGRAM
    summary = "flooded histogram: +1/-1 Polya noise messages and cancelling flood pairs; near-central error"
    multi_message = True
    local_privacy = False
    manipulation_unbounded = (
        "unbounded: a fake device may send any number of +1 or -1 messages (the count varies by"
        " design), so it can move every bucket's estimate by any amount"
    )

    def __init__(
        self,
        epsilon0: float,
        domain_size: int,
        expected_n: float = 0.0,
        delta: float = DEFAULT_DELTA,
        flood: float | None = None,
        noise_probability: float | None = None,
        flood_dispersion: float = DEFAULT_DISPERSION,
        flood_shares: int | None = None,
        flood_probability: float | None = None,
    ) -> None:
        """epsilon0: central target at expected_n; flood: expected pairs per bucket at expected_n
        (default ``default_flood``) with Var / mean ``flood_dispersion``; or the exact sampler
        ``flood_shares`` (S, 0 for Bernoulli) and ``flood_probability`` (q), as a campaign carries."""
        super().__init__(epsilon0, domain_size)
        if domain_size > MAX_BUCKETS:
            raise ValueError(f"flooded_histogram supports at most {MAX_BUCKETS} buckets")
        self.expected_n = int_param(expected_n, "expected_n", 2, 1 << 32)
        self.delta = probability_param(delta, "delta")
        self.flood_shares, self._flood_threshold = self._flood_parameters(
            flood, float(flood_dispersion), flood_shares, flood_probability
        )
        self.flood_rate = Fraction(self._flood_threshold, GRID)
        numerator = self._smallest_noise() if noise_probability is None else given_noise(noise_probability)
        self.noise = Fraction(numerator, GRID)
        self._check_noise()

    def _flood_parameters(
        self, flood: float | None, dispersion: float, shares: int | None, probability: float | None
    ) -> tuple[int, int]:
        """(S, q numerator): given exactly, or derived from the flood's mean and dispersion."""
        if probability is not None:
            s = int_param(shares or 0, "flood_shares", 0, 1 << 32)
            q = Fraction(float(probability))
            if not 0 <= q < 1 or (s > 0 and q == 0):
                raise ValueError(f"flood_probability must lie in [0, 1), got {probability!r}")
            return s, -((-q.numerator * GRID) // q.denominator)
        if flood is None:
            flood = default_flood(self.expected_n, self.domain_size)
        if not 0 <= float(flood) <= self.expected_n / 2:
            raise ValueError(f"flood must lie in [0, expected_n / 2], got {flood!r}")
        return flood_sampler(self.expected_n, float(flood), dispersion)

    def parameters(self) -> dict[str, float]:
        return {
            "expected_n": float(self.expected_n),
            "delta": self.delta,
            "flood_shares": float(self.flood_shares),
            "flood_probability": float(self.flood_rate),
            "noise_probability": float(self.noise),
        }

    @property
    def flood_pairs_per_device(self) -> float:
        """E[pairs per device per bucket]: q (Bernoulli) or b / (S (1 - b)), b = 1 - (1 - q)^S."""
        q, s = float(self.flood_rate), self.flood_shares
        if s == 0:
            return q
        return math.expm1(-s * math.log1p(-q)) / s

    @property
    def flood_mean(self) -> float:
        """E[total flood pairs per bucket] at expected_n."""
        return self.flood_pairs_per_device * self.expected_n

    # ----------------------------------------------------------------------- privacy

    def _bound(self, n: int, numerator: int, delta: float) -> AmplificationBound:
        return flooded_histogram_guarantee(
            int(n), numerator / GRID, float(self.flood_rate), self.expected_n, delta, self.flood_shares
        )

    def _meets(self, numerator: int) -> bool:
        from deniable.core.amplification._flooded import flooded_delta

        p, rate, n = numerator / GRID, float(self.flood_rate), self.expected_n
        return flooded_delta(n, n, p, rate, self.epsilon0, self.flood_shares) <= self.delta

    def _smallest_noise(self) -> int:
        """Smallest p = g / 2**52 (to 1/128 relative) whose exact profile meets epsilon0 at expected_n."""
        target = -math.expm1(math.log(-math.expm1(-self.epsilon0 / 2)) / self.expected_n)
        hi = climb_until_met(self._meets, grid_up(target), GRID // 2)
        if hi is None:
            raise ValueError(
                f"no Polya noise reaches epsilon0={self.epsilon0:g} at expected_n={self.expected_n}"
                f" with flood {self.flood_mean:g}"
            )
        lo = hi // 2
        while lo > 0 and self._meets(lo):
            hi, lo = lo, lo // 2
        return smallest_meeting(self._meets, lo, hi)

    def central_guarantee(self, n: int, delta: float) -> AmplificationBound:
        """The exact two-bucket profile at the real n (no monotonicity in n assumed)."""
        return self._bound(int(n), self.noise.numerator * (GRID // self.noise.denominator), delta)

    def privacy_profile(self, n: int, epsilon: float) -> float:
        from deniable.core.amplification._flooded import flooded_delta

        if int(n) < 1:
            return 1.0
        rate = float(self.flood_rate)
        return flooded_delta(int(n), self.expected_n, float(self.noise), rate, epsilon, self.flood_shares)

    # ----------------------------------------------------------------------- messages

    @property
    def presence(self) -> int:
        return 2 * self.domain_size

    @property
    def payload_length(self) -> int:
        return width_for(self.presence)

    @property
    def count_cells(self) -> int:
        return self.presence + 1  # +1 counts, -1 counts, presence

    @property
    def expected_messages(self) -> float:
        """2 (own +1, presence) + 2 d (E[flood pairs] + P[Polya draw > 0])."""
        return 2 + 2 * self.domain_size * (self.flood_pairs_per_device + float(self.noise))

    @property
    def max_messages_per_device(self) -> int | None:
        """Unbounded: Polya draws have infinite support."""
        return None

    def message_count_moments(self) -> tuple[float, float]:
        """(mean, variance) of one device's message count: 2 + sum of 2d noise draws NB(1/N, a) and
        twice d flood draws (NB(1/S, b), or Bernoulli(q) when S = 0); NB(r, c) has mean r c / (1 - c)
        and variance r c / (1 - c)^2."""
        d, n, p = self.domain_size, self.expected_n, float(self.noise)
        survive = math.exp(n * math.log1p(-p))  # 1 - a = (1 - p)^N
        noise_mean = (1 - survive) / (n * survive)
        q, s = float(self.flood_rate), self.flood_shares
        if s == 0:
            flood_mean, flood_var = q, q * (1 - q)
        else:
            flood_mean = self.flood_pairs_per_device
            flood_var = flood_mean / math.exp(s * math.log1p(-q))  # / (1 - b), 1 - b = (1 - q)^S
        mean = 2 + 2 * d * (noise_mean + flood_mean)
        return mean, 2 * d * noise_mean / survive + 4 * d * flood_var

    def message_threshold(self, devices: int) -> int:
        """A count that devices - 1 devices reach only ``MESSAGE_SIGMAS`` standard deviations above
        their mean (normal approximation: a liveness bound, never a privacy one, since the aggregator
        counts distinct valid devices itself before it counts a release). Waiting for it keeps the
        shuffler from releasing a batch the aggregator must refuse as below n_min in devices."""
        if devices <= 1:
            return 2 * devices
        mean, variance = self.message_count_moments()
        fewer = devices - 1
        return max(2 * devices, math.ceil(fewer * mean + MESSAGE_SIGMAS * math.sqrt(fewer * variance)) + 1)

    def devices(self, counts: Sequence[int], messages: int) -> int:
        return int(counts[self.presence])

    def _message_counts(self, values: np.ndarray, rng: Csprng) -> np.ndarray:
        """(devices, 2 d + 1): how many of each message value every device sends."""
        rows, d = values.size, self.domain_size
        noise = rng.polya_many(self.noise, self.expected_n, 2 * rows * d).reshape(rows, 2 * d)
        flood = self._flood_counts(rows * d, rng).reshape(rows, d)
        counts = np.concatenate((noise + np.tile(flood, 2), np.ones((rows, 1), dtype=np.int64)), axis=1)
        counts[np.arange(rows), values] += 1
        return counts

    def _flood_counts(self, count: int, rng: Csprng) -> np.ndarray:
        """``count`` flood draws: NB(1/S, b) Polya draws, or (S = 0) Bernoulli(q) by a 52-bit compare."""
        if self.flood_shares > 0:
            return rng.polya_many(self.flood_rate, self.flood_shares, count)
        draws = rng.uint64_array(count) >> np.uint64(64 - GRID_BITS)
        return (draws < np.uint64(self._flood_threshold)).astype(np.int64)

    def _payloads(self, counts: np.ndarray) -> list[bytes]:
        """Messages in ascending value order (presence last), back to back."""
        width, cells = self.payload_length, self.count_cells
        flat = pack_many(np.repeat(np.tile(np.arange(cells), counts.shape[0]), counts.ravel()), width)
        ends = np.cumsum(counts.sum(axis=1))
        starts = np.concatenate(([0], ends[:-1]))
        return [b"".join(flat[s:e]) for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]

    def randomise(self, value: int, rng: Csprng | None = None) -> bytes:
        self.check_value(value)
        return self._payloads(self._message_counts(np.array([int(value)]), rng or default_rng()))[0]

    def randomise_many(self, values: Sequence[int], rng: Csprng | None = None) -> list[bytes]:
        array = self.checked_values(values)
        return self._payloads(self._message_counts(array, rng or default_rng())) if array.size else []

    def output_distribution(self, value: int) -> dict[bytes, Fraction]:
        raise ValueError(f"{self.name}: the device's noise has infinite support; no finite exact law")

    def tally(self, payloads: Sequence[bytes]) -> Tally:
        values, bad_length = unpack_many(payloads, self.payload_length)
        invalid = bad_length | (values > self.presence)
        counts = np.bincount(values[~invalid], minlength=self.count_cells).astype(np.int64)
        return Tally(counts=counts, invalid=invalid)

    # ----------------------------------------------------------------------- estimator

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
        """c(+1, j) - c(-1, j): exactly unbiased; interval from the exact noise quantile."""
        if len(counts) != self.count_cells:
            raise ValueError(f"expected {self.count_cells} counts, got {len(counts)}")
        d = self.domain_size
        plus = np.asarray(counts[:d], dtype=np.int64)
        sums = plus - np.asarray(counts[d : 2 * d], dtype=np.int64)
        se = math.sqrt(n * self.noise_variance_per_device)
        half = self.noise_half_width(n, confidence)
        return [
            Estimate(int(raw), float(s), se, float(s - half), float(s + half))
            for raw, s in zip(plus.tolist(), sums.tolist(), strict=True)
        ]

    def variance(self, true_counts: Sequence[float] | FloatArray, n: int) -> FloatArray:
        """Var = n Var[y - y'] for every bucket, whatever the truth (the flood cancels exactly)."""
        return np.full(len(true_counts), n * self.noise_variance_per_device, dtype=np.float64)
