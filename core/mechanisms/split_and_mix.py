"""The shared core of the split-and-mix protocols (multi-message sum and histogram).

Both take ``expected_n`` and ``delta``, split noisy values into m additive shares mod q, and pick
the smallest noise on the 2**-52 grid whose protocol analysis meets epsilon0 at expected_n. The
parameter choice, the noise search's target test, the stated guarantee and the privacy profile
(minimised over the rising share term) are written once here; each protocol names its analysis.
"""

from __future__ import annotations

import functools
import math
from abc import abstractmethod
from collections.abc import Callable
from fractions import Fraction
from typing import ClassVar

from deniable.core.amplification._share_hiding import EXACT_MAX_N
from deniable.core.amplification.protocols import GRID, share_hiding_distance
from deniable.core.amplification.shuffle import AmplificationBound
from deniable.core.mechanisms.base import LocalRandomiser
from deniable.core.mechanisms.sample_threshold import DEFAULT_DELTA, int_param, probability_param

MAX_MODULUS = 1 << 40  # per-batch share sums (< q) add up in 64-bit count cells
MAX_MESSAGES = 64
SHARE_BUDGET = 0.1  # by default the share-hiding terms may use a tenth of delta

# (n, p, m, q, epsilon, shares) -> delta: a protocol's profile; shares is its Polya shape (0: none).
ProfileDelta = Callable[[int, float, int, int, float, int], float]


def default_modulus(expected_n: int) -> int:
    """2**ceil(log2(8 n + 4096)): room for 8x the expected devices plus the noise."""
    return 1 << (8 * expected_n + 4096 - 1).bit_length()


def given_noise(value: float) -> int:
    """Grid numerator of a given noise probability in (0, 1/2], rounded up (never less noise)."""
    p = Fraction(float(value))
    if not 0 < p <= Fraction(1, 2):
        raise ValueError(f"noise_probability must lie in (0, 1/2], got {value!r}")
    return -((-p.numerator * GRID) // p.denominator)


@functools.lru_cache(maxsize=256)
def profile_minimiser(profile: ProfileDelta, n: int, p: float, m: int, q: int, shares: int) -> float:
    """Where the falling noise term plus the rising share term is smallest: a 256-point scan of
    [0, 40], then golden-section search around the best point."""
    grid = [40 * j / 255 for j in range(256)]
    values = [profile(n, p, m, q, eps, shares) for eps in grid]
    best = min(range(256), key=lambda j: (values[j], grid[j]))
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, 255)]
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(60):
        a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
        if profile(n, p, m, q, a, shares) <= profile(n, p, m, q, b, shares):
            hi = b
        else:
            lo = a
    return lo


class SplitAndMix(LocalRandomiser):
    """m additive shares mod q of noisy values, noise chosen for the central target epsilon0."""

    multi_message = True
    local_privacy = False
    share_terms: ClassVar[int] = 1  # share-hiding terms in the protocol's delta (per changed bucket)

    expected_n: int
    delta: float
    modulus: int
    messages: int
    noise: Fraction

    def _choose_parameters(
        self,
        expected_n: float,
        delta: float = DEFAULT_DELTA,
        messages: float | None = None,
        modulus: float | None = None,
        noise_probability: float | None = None,
    ) -> None:
        """Set expected_n, delta, q, m and the noise: each given one checked, the others chosen."""
        self.expected_n = int_param(expected_n, "expected_n", 2, 1 << 32)
        self.delta = probability_param(delta, "delta")
        self.modulus = (
            default_modulus(self.expected_n)
            if modulus is None
            else int_param(modulus, "modulus", 3, MAX_MODULUS)
        )
        self.messages = (
            self._fewest_messages() if messages is None else int_param(messages, "messages", 2, MAX_MESSAGES)
        )
        numerator = self._smallest_noise() if noise_probability is None else given_noise(noise_probability)
        self.noise = Fraction(numerator, GRID)
        self._check_noise()

    @staticmethod
    @abstractmethod
    def protocol_guarantee(
        n: int, p: float, m: int, q: int, delta: float, shares: int, /
    ) -> AmplificationBound:
        """The protocol's own analysis at n devices and noise p."""

    @staticmethod
    @abstractmethod
    def protocol_delta(n: int, p: float, m: int, q: int, epsilon: float, shares: int, /) -> float:
        """The protocol's privacy profile delta(epsilon) at n devices and noise p."""

    @property
    @abstractmethod
    def shape_devices(self) -> int:
        """Polya shape denominator the analysis needs (0 for Bernoulli noise)."""

    @abstractmethod
    def _smallest_noise(self) -> int:
        """Grid numerator of the smallest noise meeting epsilon0 at expected_n (``_meets``)."""

    def _check_noise(self) -> None:
        """Refuse noise the protocol's law cannot use (the default accepts any p in (0, 1/2])."""

    def _fewest_messages(self) -> int:
        """Fewest m whose share terms fit SHARE_BUDGET of delta for every batch of at least
        min(expected_n, EXACT_MAX_N) devices: the bound at that smaller n is larger, so m is
        planned with room for batches below the plan (and stays what it was before the bound was
        evaluated at the real n; the statement itself always uses the real n)."""
        budget = SHARE_BUDGET * self.delta / (self.share_terms * (1 + math.exp(self.epsilon0)))
        planned = min(self.expected_n, EXACT_MAX_N)
        for m in range(2, MAX_MESSAGES + 1):
            if share_hiding_distance(planned, m, self.modulus) <= budget:
                return m
        raise ValueError(f"no m <= {MAX_MESSAGES} hides the shares well enough for delta={self.delta:g}")

    def _meets(self, numerator: int) -> bool:
        bound = self.protocol_guarantee(
            self.expected_n, numerator / GRID, self.messages, self.modulus, self.delta, self.shape_devices
        )
        return bound.amplified and bound.epsilon <= self.epsilon0

    def parameters(self) -> dict[str, float]:
        return {
            "expected_n": float(self.expected_n),
            "delta": self.delta,
            "messages": float(self.messages),
            "modulus": float(self.modulus),
            "noise_probability": float(self.noise),
        }

    def central_guarantee(self, n: int, delta: float) -> AmplificationBound:
        """The protocol's analysis at the real n (noise profile plus the share-hiding terms)."""
        return self.protocol_guarantee(
            int(n), float(self.noise), self.messages, self.modulus, delta, self.shape_devices
        )

    def privacy_profile(self, n: int, epsilon: float) -> float:
        """delta(eps): noise profile plus the share terms. That sum rises with eps once the noise term
        is spent; the true profile cannot, so beyond the sum's minimiser its value there holds."""
        if int(n) < 1:
            return 1.0
        args = (int(n), float(self.noise), self.messages, self.modulus)
        turn = profile_minimiser(self.protocol_delta, *args, self.shape_devices)
        return self.protocol_delta(*args, min(epsilon, turn), self.shape_devices)


class PolyaNoise:
    """Mixin: each noise draw is NB(1/expected_n, a) (Polya shares, Balle et al. CCS 2020), so the
    noise of expected_n devices adds up to exactly discrete Laplace with ratio a."""

    expected_n: int
    noise: Fraction

    def _check_noise(self) -> None:
        """Refuse noise so large that a rounds to 1 (a total epsilon below 1e-6)."""
        if self.noise_alpha > 1 - 1e-6:
            raise ValueError(f"noise_probability {float(self.noise):g} is too large for expected_n")

    @property
    def noise_alpha(self) -> float:
        """a = 1 - (1 - p)^expected_n: the discrete Laplace ratio of the total at expected_n."""
        return -math.expm1(self.expected_n * math.log1p(-float(self.noise)))

    @property
    def noise_variance_per_device(self) -> float:
        """Var[y - y'] = 2 a / (expected_n (1 - a)^2) (NB(r, a) has variance r a / (1 - a)^2)."""
        a = self.noise_alpha
        return 2 * a / (self.expected_n * (1 - a) ** 2)
