"""Multi-message binary summation ("split and mix", Ishai et al. 2006; Balle, Bell, Gascon, Nissim 2019/2020).

Each device adds its share of distributed noise, z = y - y', and splits v = (x + z) mod q into m
uniformly random additive shares in Z_q, each a separate message, plus one constant presence
message. The aggregator sums all shares mod q and centres around n/2: the estimate S + W is
exactly unbiased. epsilon0 is the central target at ``expected_n``; delta covers the noise
profile and (1 + e^eps) times the share-hiding distance (``accounting.protocols``).

Two noise laws, both sampled exactly from the CSPRNG:

- ``multi_message_sum``: y, y' ~ NB(1/expected_n, a) (Polya shares, Balle et al. CCS 2020,
  Ghazi et al. ICML 2021): at expected_n devices the total noise is exactly discrete Laplace,
  so the error matches the central (discrete) Laplace mechanism;
- ``multi_message_sum_binomial``: y, y' ~ Bernoulli(p): total Bin(n, p) - Bin(n, p), Gaussian-like
  (about 2.7x the central error at eps = 1, delta = 1e-6), with a finite exact output law.
"""

from __future__ import annotations

import functools
import itertools
import math
from abc import abstractmethod
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, ClassVar

from deniable.core.amplification.protocols import (
    GRID,
    grid_up,
    multi_sum_delta,
    multi_sum_guarantee,
    polya_law,
    share_hiding_distance,
)
from deniable.core.amplification.shuffle import AmplificationBound
from deniable.core.mechanisms.base import Estimate, FloatArray, LocalRandomiser, Tally, normal_estimates
from deniable.core.mechanisms.sample_threshold import (
    DEFAULT_DELTA,
    int_param,
    pack_many,
    probability_param,
    unpack_many,
    width_for,
)
from deniable.core.rng import Csprng, default_rng
from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:
    import numpy as np
else:
    from deniable.core.lazy import numpy as np

PRESENCE, SHARE = 0, 1  # message tags
MAX_MODULUS = 1 << 40  # per-batch share sums (< q) add up in 64-bit count cells
MAX_MESSAGES = 64
MAX_EXACT_OUTPUTS = 1 << 16
_SHARE_BUDGET = 0.1  # by default the share-hiding term may use a tenth of delta


def default_modulus(expected_n: int) -> int:
    """2**ceil(log2(8 n + 4096)): room for 8x the expected devices plus the noise."""
    return 1 << (8 * expected_n + 4096 - 1).bit_length()


@functools.lru_cache(maxsize=128)
def _profile_minimiser(n: int, p: float, m: int, q: int, shares: int) -> float:
    """Where noise profile + (1 + e^eps) x distance is smallest (a falling plus a rising term):
    a 256-point scan of [0, 40], then golden-section search around the best point."""
    grid = [40 * j / 255 for j in range(256)]
    values = [multi_sum_delta(n, p, m, q, eps, shares) for eps in grid]
    best = min(range(256), key=lambda j: (values[j], grid[j]))
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, 255)]
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(60):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if multi_sum_delta(n, p, m, q, a, shares) <= multi_sum_delta(n, p, m, q, b, shares):
            hi = b
        else:
            lo = a
    return lo


class SplitAndMixSum(LocalRandomiser):
    """(x + y - y') mod q in m additive shares + a presence message; the sum is unbiased.

    Subclasses fix the noise law of y and y' (``_noise_draws``, ``polya_shares``, variance).
    """

    multi_message = True
    local_privacy = False
    polya_shares: ClassVar[bool] = False  # True: the noise shape is 1/expected_n
    manipulation_unbounded = (
        "unbounded: one fake device can set the sum to any value mod q (split-and-mix shares are"
        " arbitrary residues, not range-checked), i.e. anywhere in the decoding window [n/2 - q/2, n/2 + q/2)"
    )

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
        self.expected_n = int_param(expected_n, "expected_n", 2, 1 << 32)
        self.delta = probability_param(delta, "delta")
        self.modulus = (
            default_modulus(self.expected_n)
            if modulus is None
            else int_param(modulus, "modulus", 3, MAX_MODULUS)
        )
        if messages is None:
            self.messages = self._fewest_messages()
        else:
            self.messages = int_param(messages, "messages", 2, MAX_MESSAGES)
        if noise_probability is None:
            numerator = self._smallest_noise()
        else:
            p = Fraction(float(noise_probability))
            if not 0 < p <= Fraction(1, 2):
                raise ValueError(f"noise_probability must lie in (0, 1/2], got {noise_probability!r}")
            numerator = -((-p.numerator * GRID) // p.denominator)
        self.noise = Fraction(numerator, GRID)
        self._check_noise()

    def _check_noise(self) -> None:
        """Subclasses refuse noise their law cannot use (the default accepts any p in (0, 1/2])."""

    @property
    def shape_devices(self) -> int:
        """Polya shape denominator (expected_n) for the accountant; 0 for Bernoulli noise."""
        return self.expected_n if self.polya_shares else 0

    # ----------------------------------------------------------------------- parameters

    def _fewest_messages(self) -> int:
        budget = _SHARE_BUDGET * self.delta / (1 + math.exp(self.epsilon0))
        for m in range(2, MAX_MESSAGES + 1):
            if share_hiding_distance(self.expected_n, m, self.modulus) <= budget:
                return m
        raise ValueError(f"no m <= {MAX_MESSAGES} hides the shares well enough for delta={self.delta:g}")

    def _meets(self, numerator: int) -> bool:
        bound = multi_sum_guarantee(
            self.expected_n, numerator / GRID, self.messages, self.modulus, self.delta, self.shape_devices
        )
        return bound.amplified and bound.epsilon <= self.epsilon0

    def _noise_bracket(self) -> tuple[int, int]:
        """Numerators lo < hi on the grid with _meets(hi) and not _meets(lo) (lo = 0: any p works)."""
        half = GRID // 2
        if not self._meets(half):
            raise ValueError(
                f"even p = 1/2 does not reach epsilon0={self.epsilon0:g} at expected_n={self.expected_n}"
            )
        if self._meets(1):
            return 0, 1
        lo_e, hi_e = 0, GRID.bit_length() - 2  # 2**hi_e = 1/2 meets the target
        while hi_e - lo_e > 1:
            mid = (lo_e + hi_e) // 2
            if self._meets(1 << mid):
                hi_e = mid
            else:
                lo_e = mid
        return 1 << lo_e, 1 << hi_e

    def _smallest_noise(self) -> int:
        """Smallest p = g / 2**52 (to 1/128 relative) whose guarantee at expected_n meets epsilon0."""
        lo, hi = self._noise_bracket()
        while hi - lo > max(1, hi >> 7):
            mid = (lo + hi) // 2
            if self._meets(mid):
                hi = mid
            else:
                lo = mid
        return hi

    def parameters(self) -> dict[str, float]:
        return {
            "expected_n": float(self.expected_n),
            "delta": self.delta,
            "messages": float(self.messages),
            "modulus": float(self.modulus),
            "noise_probability": float(self.noise),
        }

    def central_guarantee(self, n: int, delta: float) -> AmplificationBound:
        """Noise profile at the real n plus (1 + e^eps) x the split-and-mix distance."""
        return multi_sum_guarantee(
            int(n), float(self.noise), self.messages, self.modulus, delta, self.shape_devices
        )

    def privacy_profile(self, n: int, epsilon: float) -> float:
        """Noise profile at the real n plus (1 + e^eps) x the split-and-mix distance.

        That sum rises with eps once the noise term is spent; the true profile cannot, so beyond
        the sum's minimiser eps* the value at eps* is returned (it holds for every larger eps).
        """
        if int(n) < 1:
            return 1.0
        args = (int(n), float(self.noise), self.messages, self.modulus)
        turn = _profile_minimiser(*args, self.shape_devices)
        return multi_sum_delta(*args, min(epsilon, turn), self.shape_devices)

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
        for value in values:
            self.check_value(value)
        array = np.asarray([int(v) for v in values], dtype=np.int64)
        if array.size == 0:
            return []
        return self._payloads(self._share(array, rng or default_rng()))

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


class MultiMessageSum(SplitAndMixSum):
    """Polya noise: y, y' ~ NB(1/expected_n, a); expected_n devices add up to discrete Laplace."""

    name = "multi_message_sum"
    proto = pb.MULTI_MESSAGE_SUM
    summary = "multi-message sum: x + Polya noise in m shares mod q; central (discrete Laplace) accuracy"
    polya_shares = True

    def _check_noise(self) -> None:
        """Refuse noise so large that a rounds to 1 (a total epsilon below 1e-6)."""
        if self.noise_alpha > 1 - 1e-6:
            raise ValueError(f"noise_probability {float(self.noise):g} is too large for expected_n")

    def _noise_bracket(self) -> tuple[int, int]:
        """Around the closed form: a = 1 - (1 - p)^N >= e^-epsilon0 makes the total ln(1/a)-DP."""
        target = -math.expm1(math.log(-math.expm1(-self.epsilon0)) / self.expected_n)
        hi = grid_up(target)
        while not self._meets(hi):
            if hi >= GRID // 2:
                raise ValueError(f"no Polya noise reaches epsilon0={self.epsilon0:g}")
            hi = min(GRID // 2, hi + max(1, hi >> 6))
        lo = hi // 2
        while lo > 0 and self._meets(lo):
            lo //= 2
        return lo, hi

    @property
    def noise_alpha(self) -> float:
        """a = 1 - (1 - p)^expected_n: the discrete Laplace ratio of the total at expected_n."""
        return -math.expm1(self.expected_n * math.log1p(-float(self.noise)))

    @property
    def noise_variance_per_device(self) -> float:
        """Var[y - y'] = 2 a / (expected_n (1 - a)^2) (NB(r, a) has variance r a / (1 - a)^2)."""
        a = self.noise_alpha
        return 2 * a / (self.expected_n * (1 - a) ** 2)

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
