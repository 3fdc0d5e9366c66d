"""Sample and threshold (Bharadwaj & Cormode, AISTATS 2022): sampling, no noise, suppression.

Each device takes part with probability s (exact Bernoulli from the CSPRNG) and then reports its
TRUE value; a device that does not take part sends the constant null message (value d), so every
device sends exactly one message. The aggregator counts c_j per bucket and releases
x_j = c_j / s when c_j > tau, else 0 (suppressed). Not locally private: epsilon0 is the central
target, met by the released histogram (see ``amplification.protocols.sample_threshold_guarantee``);
the aggregator itself sees the raw sampled counts and is trusted to threshold them.
``planning_parameters`` proposes (s, tau) pairs meeting a central target for the planner to rank.
Shared message helpers for the other shuffle-only protocols live here too.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Final

from deniable.core.amplification._binomial import log_pmf
from deniable.core.amplification._sample_threshold import joint_guarantee, joint_profile
from deniable.core.amplification.protocols import (
    sample_threshold_add_delta,
    sample_threshold_guarantee,
)
from deniable.core.amplification.shuffle import AmplificationBound
from deniable.core.mechanisms.base import (
    Estimate,
    FloatArray,
    IntArray,
    LocalRandomiser,
    Tally,
)
from deniable.core.mechanisms.exact import z_score
from deniable.core.rng import Csprng, default_rng
from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
else:
    from deniable.core.lazy import numpy as np
    from deniable.core.lazy import numpy_typing as npt

DEFAULT_DELTA = 1e-6  # as the aggregator's default campaign delta
MAX_THRESHOLD = 10_000
RATE_BITS: Final = 16  # planned and default sample rates are multiples of 2**-16 (exact in params)
# Shares of the central target the planner tries spending on sampling (ln(1/(1 - s)) = share x eps);
# the rest goes to the threshold. 1/2 is the constructor's default.
PLANNING_SHARES: Final = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 0.9375)
# The planner's threshold search stops within this relative distance of the smallest valid tau.
PLANNING_TAU_TOLERANCE: Final = 1 / 32


# --------------------------------------------------------------------------- shared helpers


def width_for(largest: int) -> int:
    """Bytes of a big-endian unsigned message holding values 0..largest."""
    return max(1, (max(largest, 1).bit_length() + 7) // 8)


def pack_many(values: npt.ArrayLike, width: int) -> list[bytes]:
    """Big-endian ``width``-byte encodings of non-negative integers, vectorised."""
    array = np.asarray(values, dtype=np.uint64)
    shifts = np.arange(width - 1, -1, -1, dtype=np.uint64) * np.uint64(8)
    matrix = ((array[:, None] >> shifts[None, :]) & np.uint64(0xFF)).astype(np.uint8)
    flat = matrix.tobytes()
    return [flat[i : i + width] for i in range(0, len(flat), width)]


def unpack_many(payloads: Sequence[bytes], width: int) -> tuple[IntArray, npt.NDArray[np.bool_]]:
    """(values, wrong length) of fixed-width big-endian messages; wrong-length ones read as 0."""
    n = len(payloads)
    bad_length = np.fromiter((len(p) != width for p in payloads), dtype=np.bool_, count=n)
    joined = b"".join(bytes(width) if bad else p for p, bad in zip(payloads, bad_length, strict=True))
    matrix = np.frombuffer(joined, dtype=np.uint8).reshape(n, width).astype(np.int64)
    values = np.zeros(n, dtype=np.int64)
    for column in range(width):
        values = values * 256 + matrix[:, column]
    return values, bad_length


def int_param(value: float | int, what: str, low: int, high: int) -> int:
    """An integer parameter given as a float (Campaign.params are doubles); ValueError otherwise."""
    if isinstance(value, bool) or not math.isfinite(float(value)) or float(value) != int(float(value)):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    result = int(float(value))
    if not low <= result <= high:
        raise ValueError(f"{what} must lie in [{low}, {high}], got {result}")
    return result


def probability_param(value: float, what: str) -> float:
    """A probability strictly inside (0, 1), finite; ValueError otherwise."""
    value = float(value)
    if not (math.isfinite(value) and 0 < value < 1):
        raise ValueError(f"{what} must lie in (0, 1), got {value!r}")
    return value


def packed_estimates(
    raw: Sequence[int], estimates: FloatArray, std_errors: FloatArray, lows: FloatArray, highs: FloatArray
) -> list[Estimate]:
    """Estimate rows from explicit interval ends (suppressed buckets have one-sided intervals)."""
    return [
        Estimate(int(c), float(e), float(s), float(lo), float(hi))
        for c, e, s, lo, hi in zip(raw, estimates, std_errors, lows, highs, strict=True)
    ]


@functools.lru_cache(maxsize=64)
def _suppressed_upper(rate: float, threshold: int, confidence: float) -> int:
    tail = (1 - confidence) / 2

    def kept_low(x: int) -> float:
        ks = np.arange(min(threshold, x) + 1, dtype=np.float64)
        return float(np.exp(log_pmf(ks, float(x), rate)).sum())

    lo, hi = threshold, max(threshold + 1, 2 * math.ceil((threshold + 1) / rate))
    while kept_low(hi) >= tail:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:  # kept_low(lo) >= tail > kept_low(hi); it falls as x grows
        mid = (lo + hi) // 2
        if kept_low(mid) >= tail:
            lo = mid
        else:
            hi = mid
    return lo


# --------------------------------------------------------------------------- parameters


def sample_rate_for(epsilon: float) -> float:
    """1 - e^-epsilon (sampling alone costs epsilon), rounded down to a multiple of 2**-16 for params."""
    return math.floor(-math.expm1(-epsilon) * (1 << RATE_BITS)) / (1 << RATE_BITS)


def refusal(rate: Fraction, threshold: int, delta: float, epsilon0: float) -> str | None:
    """Why (s, tau, delta) is refused for the central target epsilon0; None when it is allowed."""
    sample_rate = float(rate)
    if rate**threshold > Fraction(delta):
        return (
            f"s^tau = {sample_rate**threshold:.3g} > delta = {delta:g}: tau = {threshold} users with"
            " the same value would all be released with probability s^tau; raise the threshold"
        )
    bound = sample_threshold_guarantee(sample_rate, threshold, delta)
    if not bound.amplified:
        return bound.note
    if bound.epsilon > epsilon0 * (1 + 1e-9):
        return (
            f"s={sample_rate:g}, tau={threshold} give central epsilon {bound.epsilon:.4g} at"
            f" delta={delta:g}, above the target epsilon0={epsilon0:g}"
        )
    return None


def power_floor(rate: Fraction, delta: float) -> int:
    """Smallest tau >= 0 with s^tau <= delta (exactly): no smaller threshold is ever allowed."""
    tau = max(0, math.ceil(math.log(delta) / math.log(rate)))
    if tau > MAX_THRESHOLD + 1:  # refused anyway: skip exact powers with millions of bits
        return tau
    while rate**tau > Fraction(delta):
        tau += 1
    while tau > 0 and rate ** (tau - 1) <= Fraction(delta):
        tau -= 1
    return tau


def planned_threshold(rate: float, epsilon0: float, delta: float, start: int, largest: int) -> int | None:
    """A tau in [start, largest] allowed at (s, delta, epsilon0), within 1/32 of the smallest; else None."""
    # The guarantee is eps_add + ln(1/(1 - s)), eps_add the smallest eps with profile(eps) <= delta,
    # so a tau fits when the profile at the budget eps0 - ln(1/(1 - s)) is <= delta: one profile
    # evaluation per probe instead of an epsilon search. Doubling from start, then bisection: a
    # larger tau only suppresses more (post-processing of the release at a smaller tau), so the
    # profile does not grow with tau. The answer is then confirmed by ``refusal`` (the full
    # guarantee); a rounding wobble can only make the search miss a pair, never return a bad one.
    budget = epsilon0 + math.log1p(-rate)
    if budget <= 0:
        return None

    def fits(tau: int) -> bool:
        return sample_threshold_add_delta(rate, tau, budget) <= delta

    exact = Fraction(rate)
    bad = max(start, power_floor(exact, delta)) - 1  # refused: below the floor, or below the caller's start
    tau = bad + 1
    if tau > largest:
        return None
    while not fits(tau):
        bad = tau
        if tau >= largest:
            return None
        tau = min(largest, max(tau + 1, 2 * tau))
    while tau - bad > max(1, math.floor(tau * PLANNING_TAU_TOLERANCE)):
        middle = (bad + tau) // 2
        if fits(middle):
            tau = middle
        else:
            bad = middle
    for _ in range(3):  # the epsilon search may land a hair above the budget: step up a little
        if refusal(exact, tau, delta, epsilon0) is None:
            return tau
        tau += max(1, math.floor(tau * PLANNING_TAU_TOLERANCE))
        if tau > largest:
            break
    return None


@functools.lru_cache(maxsize=64)
def planning_pairs(
    target_epsilon: float, delta: float, n: int, domain_size: int
) -> tuple[tuple[float, int], ...]:
    """(s, tau) pairs meeting (target_epsilon, delta), cached: the planner's candidates for this mechanism."""
    # One pair per share of the target spent on sampling, s = 1 - e^(-share x target), tau about
    # the smallest allowed. A larger share gives a larger s (less variance) but needs a larger
    # tau (more suppression). After the first pair the list stops once tau would exceed n s / k,
    # the sampled count of a bucket under the planner's uniform truth (suppressed half the
    # time). Empty when no tau up to MAX_THRESHOLD meets the target at the smallest share.
    typical = n / domain_size
    found: list[tuple[float, int]] = []
    tau = 0
    for share in PLANNING_SHARES:
        rate = sample_rate_for(share * target_epsilon)
        if rate <= (found[-1][0] if found else 0.0):  # 0, or the previous share's grid point
            continue
        largest = MAX_THRESHOLD if not found else min(MAX_THRESHOLD, math.floor(typical * rate))
        planned = planned_threshold(rate, target_epsilon, delta, tau, largest)
        if planned is None:
            break
        tau = planned
        found.append((rate, tau))
    return tuple(found)


# --------------------------------------------------------------------------- the protocol


class SampleAndThreshold(LocalRandomiser):
    """Report the true value w.p. s, else a null message; release c/s for counts above tau."""

    name = "sample_and_threshold"
    proto = pb.SAMPLE_AND_THRESHOLD
    summary = "sample-and-threshold (Bharadwaj-Cormode 2022): true value w.p. s, counts <= tau suppressed"
    local_privacy = False

    def __init__(
        self,
        epsilon0: float,
        domain_size: int,
        sample_rate: float = 0.0,
        threshold: float | None = None,
        delta: float = DEFAULT_DELTA,
    ) -> None:
        """epsilon0 is the central target; ``threshold`` None picks the smallest tau meeting it.

        ``sample_rate`` 0 (unset) spends half the target on sampling: s = 1 - e^(-epsilon0/2),
        rounded down to a multiple of 2**-16 so it travels exactly in ``Campaign.params``.
        """
        super().__init__(epsilon0, domain_size)
        if domain_size > 1 << 24:
            raise ValueError("sample_and_threshold supports at most 2**24 categories")
        if sample_rate == 0.0:
            sample_rate = sample_rate_for(epsilon0 / 2)
        self.sample_rate = probability_param(sample_rate, "sample_rate")
        self.rate = Fraction(self.sample_rate)
        if self.rate.denominator > 1 << 62:
            raise ValueError(f"sample_rate {sample_rate!r} is below 2**-9 with too many bits")
        self.delta = probability_param(delta, "delta")
        if threshold is None:
            self.threshold = self._smallest_threshold()
        else:
            self.threshold = int_param(threshold, "threshold", 0, MAX_THRESHOLD)
            self._check(self.threshold, raise_errors=True)
        self.guarantee = sample_threshold_guarantee(self.sample_rate, self.threshold, self.delta)

    def _check(self, tau: int, raise_errors: bool) -> bool:
        """Whether (s, tau, delta) is allowed and meets epsilon0 (ValueError saying why, if asked)."""
        reason = refusal(self.rate, tau, self.delta, self.epsilon0)
        if reason is not None and raise_errors:
            raise ValueError(f"sample_and_threshold refuses these parameters: {reason}")
        return reason is None

    def _smallest_threshold(self) -> int:
        """The smallest tau meeting epsilon0 (stepping by 1 to 64, then by 1/8)."""
        tau = max(0, math.ceil(math.log(self.delta) / math.log(self.sample_rate)))
        while tau <= MAX_THRESHOLD:
            if self._check(tau, raise_errors=False):
                return tau
            tau += 1 if tau < 64 else max(1, tau // 8)
        raise ValueError(f"no threshold up to {MAX_THRESHOLD} meets epsilon0={self.epsilon0:g}")

    def parameters(self) -> dict[str, float]:
        return {"sample_rate": self.sample_rate, "threshold": float(self.threshold), "delta": self.delta}

    @classmethod
    def planning_parameters(
        cls, target_epsilon: float, delta: float, n: int, domain_size: int
    ) -> list[dict[str, float]]:
        """(s, tau) pairs meeting the central target, for the planner to rank: s trades variance for tau."""
        pairs = planning_pairs(float(target_epsilon), float(delta), int(n), int(domain_size))
        return [{"sample_rate": rate, "threshold": float(tau)} for rate, tau in pairs]

    def central_guarantee(self, n: int, delta: float) -> AmplificationBound:
        """The released histogram's (eps, delta), the two changed buckets composed jointly; the same
        for every n (worst case over the others). Parameters are still chosen (``refusal``, the
        planner) with the separate composition, which is larger: planning stays conservative."""
        return joint_guarantee(self.sample_rate, self.threshold, delta)

    def privacy_profile(self, n: int, epsilon: float) -> float:
        """delta(eps) of the released histogram (joint composition); the same for every n."""
        return joint_profile(self.sample_rate, self.threshold, epsilon)

    @property
    def null(self) -> int:
        """The message value of a device that was not sampled."""
        return self.domain_size

    @property
    def payload_length(self) -> int:
        return width_for(self.domain_size)

    @property
    def count_cells(self) -> int:
        return self.domain_size + 1  # buckets, then the null messages

    def randomise(self, value: int, rng: Csprng | None = None) -> bytes:
        self.check_value(value)
        sampled = int((rng or default_rng()).bernoulli(self.rate))
        message = sampled * int(value) + (1 - sampled) * self.null  # arithmetic, not a branch
        return message.to_bytes(self.payload_length, "big")

    def randomise_many(self, values: Sequence[int], rng: Csprng | None = None) -> list[bytes]:
        for value in values:
            self.check_value(value)
        array = np.asarray([int(v) for v in values], dtype=np.int64)
        sampled = (rng or default_rng()).bernoulli_array(self.rate, array.size)
        return pack_many(np.where(sampled, array, self.null), self.payload_length)

    def output_distribution(self, value: int) -> dict[bytes, Fraction]:
        self.check_value(value)
        width = self.payload_length
        return {int(value).to_bytes(width, "big"): self.rate, self.null.to_bytes(width, "big"): 1 - self.rate}

    def tally(self, payloads: Sequence[bytes]) -> Tally:
        values, bad_length = unpack_many(payloads, self.payload_length)
        invalid = bad_length | (values > self.null)
        counts = np.bincount(values[~invalid], minlength=self.count_cells).astype(np.int64)
        return Tally(counts=counts, invalid=invalid)

    # ----------------------------------------------------------------------- estimator

    def _suppressed_moments(self, truth: FloatArray) -> tuple[FloatArray, FloatArray]:
        """(E[c 1{c <= tau}], E[c^2 1{c <= tau}]) for c ~ Bin(x, s), x rounded to integers."""
        x = np.rint(np.clip(truth, 0, None)).astype(np.float64)
        ks = np.arange(self.threshold + 1, dtype=np.float64)
        probs = np.exp(log_pmf(ks[None, :], x[:, None], self.sample_rate))
        return probs @ ks, probs @ (ks * ks)

    def bias(self, true_counts: Sequence[float] | FloatArray) -> FloatArray:
        """E[estimate] - x = -E[c 1{c <= tau}] / s: suppression only ever lowers the estimate."""
        first, _ = self._suppressed_moments(np.asarray(true_counts, dtype=np.float64))
        return np.asarray(-first / self.sample_rate, dtype=np.float64)

    def variance(self, true_counts: Sequence[float] | FloatArray, n: int) -> FloatArray:
        """Exact Var[(c/s) 1{c > tau}], c ~ Bin(x, s) (x rounded to an integer count)."""
        x = np.rint(np.clip(np.asarray(true_counts, dtype=np.float64), 0, None))
        s = self.sample_rate
        first, second = self._suppressed_moments(x)
        mean = (x * s - first) / s
        square = (x * s * (1 - s) + (x * s) ** 2 - second) / s**2
        return np.asarray(np.clip(square - mean**2, 0.0, None), dtype=np.float64)

    def manipulation_at(self, counts: Sequence[int], n: int, fakes: int) -> tuple[FloatArray, FloatArray]:
        """A fake adds 1 to one c_j (or the null cell); x_j = c_j/s if c_j > tau else 0 only grows with
        c_j and ignores n: raise x(c_j + m) - x(c_j) (m copies of j), lower 0 (fakes never lower)."""
        raw = np.asarray(counts[: self.domain_size], dtype=np.float64)

        def released(c: FloatArray) -> FloatArray:
            return np.asarray(np.where(c > self.threshold, c / self.sample_rate, 0.0), dtype=np.float64)

        return released(raw + fakes) - released(raw), np.zeros(self.domain_size, dtype=np.float64)

    def suppressed_upper(self, confidence: float) -> int:
        """Largest x with P[Bin(x, s) <= tau] >= (1 - confidence) / 2: the top of a suppressed CI."""
        return _suppressed_upper(self.sample_rate, self.threshold, confidence)

    def estimate(self, counts: Sequence[int], n: int, confidence: float = 0.95) -> list[Estimate]:
        """x_j = c_j / s if c_j > tau, else 0 with raw count 0 and the interval [0, U].

        A truth above U is suppressed with probability < (1 - confidence)/2; sd shown at x = U.
        """
        if len(counts) != self.count_cells:
            raise ValueError(f"expected {self.count_cells} counts, got {len(counts)}")
        raw = np.asarray(counts[: self.domain_size], dtype=np.int64)
        released = raw > self.threshold
        estimates = np.where(released, raw / self.sample_rate, 0.0)
        z = z_score(confidence)
        upper = float(self.suppressed_upper(confidence))
        plug_in = np.where(released, estimates, upper)
        std_errors = np.sqrt(self.variance(plug_in, n))
        lows = np.where(released, estimates - z * std_errors, 0.0)
        highs = np.where(released, estimates + z * std_errors, upper)
        shown = np.where(released, raw, 0)
        return packed_estimates(shown.tolist(), estimates, std_errors, lows, highs)
