"""Multi-message binary summation ("split and mix", Ishai et al. 2006; Balle, Bell, Gascon, Nissim 2019/2020).

Each device adds its share of distributed noise, z = y - y', and splits v = (x + z) mod q into m
uniformly random additive shares in Z_q, each a separate message, plus one constant presence
message. The aggregator sums all shares mod q and centres around n/2: the estimate S + W is
exactly unbiased. epsilon0 is the central target at ``expected_n``; delta covers the noise
profile and (1 + e^eps) times the share-hiding distance (``amplification.protocols``).

Two noise laws, both sampled exactly from the CSPRNG:

- ``multi_message_sum``: y, y' ~ NB(1/expected_n, a) (Polya shares, Balle et al. CCS 2020,
  Ghazi et al. ICML 2021): at expected_n devices the total noise is exactly discrete Laplace,
  so the error matches the central (discrete) Laplace mechanism;
- ``multi_message_sum_binomial``: y, y' ~ Bernoulli(p): total Bin(n, p) - Bin(n, p), Gaussian-like
  (about 2.7x the central error at eps = 1, delta = 1e-6), with a finite exact output law.
"""

from __future__ import annotations

import itertools
import math
from abc import abstractmethod
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, ClassVar

from deniable.core.amplification.grid_search import climb_until_met, dyadic_bracket, smallest_meeting
from deniable.core.amplification.protocols import (
    GRID,
    grid_up,
    multi_sum_delta,
    multi_sum_guarantee,
    polya_law,
)
from deniable.core.mechanisms.base import Estimate, FloatArray, Tally, normal_estimates
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

PRESENCE, SHARE = 0, 1  # message tags
MAX_EXACT_OUTPUTS = 1 << 16


class SplitAndMixSum(SplitAndMix):
    """(x + y - y') mod q in m additive shares + a presence message; the sum is unbiased.

    Subclasses fix the noise law of y and y' (``_noise_draws``, ``polya_shares``, variance).
    """

    polya_shares: ClassVar[bool] = False  # True: the noise shape is 1/expected_n
    manipulation_unbounded = (
        "unbounded: one fake device can set the sum to any value mod q (split-and-mix shares are"
        " arbitrary residues, not range-checked), i.e. anywhere in the decoding window [n/2 - q/2, n/2 + q/2)"
    )
    protocol_guarantee = staticmethod(multi_sum_guarantee)
    protocol_delta = staticmethod(multi_sum_delta)

    def __init__(
        self,
        epsilon0: float,
        domain_size: int = 2,
        expected_n: float = 0.0,
        delta: float = DEFAULT_DELTA,
        messages: float | None = None,
        modulus: float | None = None,
        noise_probability: float | None = None,
    ) -> None:
        """epsilon0: central target at expected_n; m, q and p are chosen unless given."""
        if domain_size != 2:
            raise ValueError(f"{self.name} sums bits: a domain of exactly 2 values")
        super().__init__(epsilon0, domain_size)
        self._choose_parameters(expected_n, delta, messages, modulus, noise_probability)

    @property
    def shape_devices(self) -> int:
        """Polya shape denominator (expected_n) for the accountant; 0 for Bernoulli noise."""
        return self.expected_n if self.polya_shares else 0

    # ----------------------------------------------------------------------- parameters

    def _noise_bracket(self) -> tuple[int, int]:
        """Numerators lo < hi on the grid with _meets(hi) and not _meets(lo) (lo = 0: any p works)."""
        half = GRID // 2
        if not self._meets(half):
            raise ValueError(
                f"even p = 1/2 does not reach epsilon0={self.epsilon0:g} at expected_n={self.expected_n}"
            )
        return dyadic_bracket(self._meets, GRID.bit_length() - 2)  # 2**51 = 1/2 meets the target

    def _smallest_noise(self) -> int:
        """Smallest p = g / 2**52 (to 1/128 relative) whose guarantee at expected_n meets epsilon0."""
        return smallest_meeting(self._meets, *self._noise_bracket())

    @property
    @abstractmethod
    def noise_variance_per_device(self) -> float:
        """Var[y - y'] for one device; the total noise variance is n times this."""

    @abstractmethod
    def _noise_draws(self, count: int, rng: Csprng) -> np.ndarray:
        """``count`` independent draws of y (int64), exactly from the CSPRNG."""

    # ----------------------------------------------------------------------- messages

    @property
    def payload_length(self) -> int:
        return 1 + width_for(self.modulus - 1)

    @property
    def count_cells(self) -> int:
        return 3  # presence messages, share messages, sum of shares mod q (per batch)

    @property
    def messages_per_device(self) -> int:
        """m shares and one presence message, always."""
        return self.messages + 1

    def devices(self, counts: Sequence[int], messages: int) -> int:
        """The number of presence messages: one per device."""
        return int(counts[0])

    def _pack(self, tags: np.ndarray, values: np.ndarray) -> list[bytes]:
        width = self.payload_length
        return pack_many(
            tags.astype(np.uint64) << np.uint64(8 * (width - 1)) | values.astype(np.uint64), width
        )

    def _payloads(self, shares: np.ndarray) -> list[bytes]:
        """Each row: its m shares, then the presence message, back to back."""
        rows, m = shares.shape
        tags = np.concatenate((np.full((rows, m), SHARE), np.full((rows, 1), PRESENCE)), axis=1)
        values = np.concatenate((shares, np.zeros((rows, 1), dtype=np.int64)), axis=1)
        flat = self._pack(tags.ravel(), values.ravel())
        step = m + 1
        return [b"".join(flat[i : i + step]) for i in range(0, len(flat), step)]

    def _share(self, values: np.ndarray, rng: Csprng) -> np.ndarray:
        """m shares per value: m - 1 uniform in Z_q, the last completing the sum mod q."""
        q, m = self.modulus, self.messages
        noise = self._noise_draws(2 * values.size, rng).reshape(2, values.size)
        noisy = (values + noise[0] - noise[1]) % q
        free = rng.randbelow_array(q, values.size * (m - 1)).reshape(values.size, m - 1)
        last = (noisy - free.sum(axis=1)) % q
        return np.concatenate((free, last[:, None]), axis=1)

    def randomise(self, value: int, rng: Csprng | None = None) -> bytes:
        self.check_value(value)
        return self._payloads(self._share(np.array([int(value)], dtype=np.int64), rng or default_rng()))[0]

    def randomise_many(self, values: Sequence[int], rng: Csprng | None = None) -> list[bytes]:
        array = self.checked_values(values)
        return self._payloads(self._share(array, rng or default_rng())) if array.size else []

    def _noise_law(self) -> dict[int, Fraction]:
        """Exact law of z = y - y' when it has finite support (ValueError otherwise)."""
        raise ValueError(f"{self.name}: the device's noise has infinite support; no finite exact law")

    def output_distribution(self, value: int) -> dict[bytes, Fraction]:
        self.check_value(value)
        q, m = self.modulus, self.messages
        noise_law = self._noise_law()
        if len(noise_law) * q ** (m - 1) > MAX_EXACT_OUTPUTS:
            raise ValueError("the exact law enumerates 3 q^(m-1) payloads: too many for these parameters")
        law: dict[bytes, Fraction] = {}
        for z, pz in noise_law.items():
            for free in itertools.product(range(q), repeat=m - 1):
                last = (int(value) + z - sum(free)) % q
                payload = self._payloads(np.array([[*free, last]], dtype=np.int64))[0]
                law[payload] = law.get(payload, Fraction(0)) + pz / q ** (m - 1)
        return law

    def tally(self, payloads: Sequence[bytes]) -> Tally:
        width = self.payload_length
        words, bad_length = unpack_many(payloads, width)
        tags = words >> (8 * (width - 1))
        values = words & ((1 << (8 * (width - 1))) - 1)
        presence = (tags == PRESENCE) & (values == 0)
        share = (tags == SHARE) & (values < self.modulus)
        invalid = bad_length | ~(presence | share)
        ok_share = share & ~invalid
        counts = np.array(
            [
                int((presence & ~invalid).sum()),
                int(ok_share.sum()),
                int(values[ok_share].sum() % self.modulus),
            ],
            dtype=np.int64,
        )
        return Tally(counts=counts, invalid=invalid)

    # ----------------------------------------------------------------------- estimator

    def incomplete_batch(self, counts: Sequence[int]) -> str | None:
        """Every device sends m shares and one presence message: anything else is part of a device."""
        presence, shares = int(counts[0]), int(counts[1])
        if shares == self.messages * presence:
            return None
        return (
            f"{shares} shares from {presence} devices: with m={self.messages} a device's messages are split"
        )

    def decode(self, counts: Sequence[int], n: int) -> int:
        """S + W: the share total mod q, represented in [n/2 - q/2, n/2 + q/2)."""
        if len(counts) != self.count_cells:
            raise ValueError(f"expected {self.count_cells} counts, got {len(counts)}")
        presence, shares, total = (int(c) for c in counts)
        if shares != self.messages * presence or presence != n:
            raise ValueError(
                f"{shares} shares from {presence} devices (n={n}): with m={self.messages} some shares are"
                " missing or extra, and the sum mod q cannot be recovered"
            )
        margin = 2 * (12 * math.sqrt(n * self.noise_variance_per_device) + 64)
        if n + margin >= self.modulus:
            raise ValueError(f"modulus {self.modulus} is too small to decode the sum of {n} devices")
        low = n // 2 - self.modulus // 2
        return low + (total - low) % self.modulus

    def estimate(self, counts: Sequence[int], n: int, confidence: float = 0.95) -> list[Estimate]:
        """Exactly unbiased: ones = S + W, zeros = n - (S + W); both with variance n Var[y - y']."""
        ones = self.decode(counts, n)
        estimates = np.array([n - ones, ones], dtype=np.float64)
        raw = [max(0, n - ones), max(0, ones)]
        return normal_estimates(raw, estimates, self.variance(estimates, n), confidence)

    def variance(self, true_counts: Sequence[float] | FloatArray, n: int) -> FloatArray:
        """Var[W] = n Var[y - y'] for both buckets, whatever the truth."""
        return np.full(len(true_counts), n * self.noise_variance_per_device, dtype=np.float64)


class MultiMessageSum(PolyaNoise, SplitAndMixSum):
    """Polya noise: y, y' ~ NB(1/expected_n, a); expected_n devices add up to discrete Laplace."""

    name = "multi_message_sum"
    proto = pb.MULTI_MESSAGE_SUM
    summary = "multi-message sum: x + Polya noise in m shares mod q; central (discrete Laplace) accuracy"
    polya_shares = True

    def _noise_bracket(self) -> tuple[int, int]:
        """Around the closed form: a = 1 - (1 - p)^N >= e^-epsilon0 makes the total ln(1/a)-DP."""
        target = -math.expm1(math.log(-math.expm1(-self.epsilon0)) / self.expected_n)
        hi = climb_until_met(self._meets, grid_up(target), GRID // 2)
        if hi is None:
            raise ValueError(f"no Polya noise reaches epsilon0={self.epsilon0:g}")
        lo = hi // 2
        while lo > 0 and self._meets(lo):
            lo //= 2
        return lo, hi

    def _noise_draws(self, count: int, rng: Csprng) -> np.ndarray:
        return rng.polya_many(self.noise, self.expected_n, count)

    def noise_half_width(self, n: int, confidence: float) -> int:
        """Smallest h with P[|W| <= h] >= confidence for the exact total noise W of n devices."""
        if not 0 < confidence < 1:
            raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
        offset, pmf, neglected = polya_law(int(n), self.expected_n, float(self.noise))
        centre = -offset  # index of w = 0
        inside = np.cumsum(pmf[centre:] + np.concatenate(([0.0], pmf[centre - 1 :: -1])))
        # the window's missing mass is counted as outside: the interval only widens
        reached = np.flatnonzero(inside >= confidence + neglected)
        return int(reached[0]) if reached.size else len(inside)

    def estimate(self, counts: Sequence[int], n: int, confidence: float = 0.95) -> list[Estimate]:
        """As the base, with exact intervals: the discrete-Laplace-like noise is not normal
        (a normal 95% interval would cover about 94%), so the interval is the estimate +- the
        exact noise quantile ``noise_half_width``; coverage is at least ``confidence``."""
        rows = super().estimate(counts, n, confidence)
        half = self.noise_half_width(n, confidence)
        return [
            Estimate(row.raw_count, row.estimate, row.std_error, row.estimate - half, row.estimate + half)
            for row in rows
        ]


class BinomialMultiMessageSum(SplitAndMixSum):
    """Bernoulli noise: y, y' ~ Bern(p); Gaussian-like total, finite exact output law."""

    name = "multi_message_sum_binomial"
    proto = pb.MULTI_MESSAGE_SUM_BINOMIAL
    summary = "multi-message sum: x + Bern(p) - Bern(p) split into m shares mod q; finite exact law"

    @property
    def noise_variance_per_device(self) -> float:
        """Var[Bern(p) - Bern(p)] = 2 p (1 - p)."""
        p = float(self.noise)
        return 2 * p * (1 - p)

    def _noise_draws(self, count: int, rng: Csprng) -> np.ndarray:
        return rng.bernoulli_array(self.noise, count).astype(np.int64)

    def _noise_law(self) -> dict[int, Fraction]:
        p = self.noise
        return {-1: p * (1 - p), 0: p * p + (1 - p) * (1 - p), 1: p * (1 - p)}
