"""What every local randomiser offers, device side and aggregator side.

Device side: ``randomise(value)`` returns exactly the payload bytes that get sealed.
Aggregator side: ``tally`` turns payloads into count cells (rejecting out-of-domain ones),
``estimate`` debiases counts into per-bucket estimates with exact standard errors and normal
confidence intervals, ``variance`` is the exact variance of each estimator given the truth.
Auditors: ``output_distribution(value)`` is the exact law of the payload for one input.
"""

from __future__ import annotations

import math
import operator
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, ClassVar

from deniable.core.amplification import (
    AmplificationBound,
    Analysis,
    generic_analyses,
    tightest_bound,
    tightest_delta,
)
from deniable.core.lazy import FloatArray as FloatArray
from deniable.core.lazy import IntArray as IntArray
from deniable.core.mechanisms.exact import z_score
from deniable.core.rng import Csprng

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
else:
    from deniable.core.lazy import numpy as np
    from deniable.core.lazy import numpy_typing as npt


class PayloadOutOfDomain(ValueError):
    """A payload that no honest randomiser of this campaign could have produced."""


@dataclass(frozen=True)
class Estimate:
    """Debiased estimate of one bucket's true count."""

    raw_count: int
    estimate: float
    std_error: float
    ci_low: float
    ci_high: float


@dataclass(frozen=True)
class Tally:
    """Count cells over the valid payloads of a batch, and which payloads were invalid."""

    counts: IntArray
    invalid: npt.NDArray[np.bool_]

    @property
    def valid_count(self) -> int:
        """Number of payloads that were counted."""
        return int(self.invalid.size - int(self.invalid.sum()))


class LocalRandomiser(ABC):
    """An epsilon0-LDP randomiser over the domain {0, ..., domain_size - 1}."""

    name: ClassVar[str]
    summary: ClassVar[str]
    proto: ClassVar[int]  # deniable.v1.Mechanism value
    multi_message: ClassVar[bool] = False  # True: randomise() returns several messages, sealed apart
    # False for shuffle-only protocols whose reports are not locally private: their epsilon0
    # parameter is then the central target and ``central_guarantee`` is their own analysis.
    local_privacy: ClassVar[bool] = True

    def __init__(self, epsilon0: float, domain_size: int) -> None:
        if not (math.isfinite(epsilon0) and epsilon0 > 0):
            raise ValueError(f"epsilon0 must be a positive finite number, got {epsilon0!r}")
        if domain_size < 2:
            raise ValueError(f"domain size must be at least 2, got {domain_size}")
        self.epsilon0 = float(epsilon0)
        self.domain_size = int(domain_size)

    @property
    @abstractmethod
    def payload_length(self) -> int:
        """Bytes in every payload of this randomiser."""

    @property
    @abstractmethod
    def count_cells(self) -> int:
        """Length of the count vector the aggregator keeps."""

    @abstractmethod
    def randomise(self, value: int, rng: Csprng | None = None) -> bytes:
        """The payload for true ``value``; noise from the CSPRNG.

        Single-message mechanisms return one message of ``payload_length`` bytes; multi-message
        ones return several such messages back to back (see ``split_messages``).
        """

    def split_messages(self, payload: bytes) -> list[bytes]:
        """The messages in a ``randomise`` output: each is sealed and shuffled on its own."""
        width = self.payload_length
        if not payload or len(payload) % width:
            raise ValueError(
                f"payload of {len(payload)} bytes is not a whole number of {width}-byte messages"
            )
        return [payload[i : i + width] for i in range(0, len(payload), width)]

    def randomise_many(self, values: Sequence[int], rng: Csprng | None = None) -> list[bytes]:
        """``randomise`` for many simulated devices at once (vectorised where a mechanism can)."""
        return [self.randomise(int(value), rng) for value in values]

    @property
    def messages_per_device(self) -> int | None:
        """Messages every device sends, when that number is fixed (None: it varies by device).

        The shuffler counts messages; with a fixed count the aggregator turns a campaign's minimum
        batch in devices into messages, so a released round always holds that many devices.
        """
        return None if self.multi_message else 1

    def incomplete_batch(self, counts: Sequence[int]) -> str | None:
        """Why a batch with these count cells cannot hold whole devices (None: it can).

        Multi-message protocols whose estimate needs every message of a device override this; the
        aggregator refuses such a batch, so the counts never hold part of a device (ADR 0014).
        """
        return None

    @property
    def max_messages_per_device(self) -> int | None:
        """Most messages one device can send (None: unbounded): n_min devices are at most this many each."""
        return self.messages_per_device

    def message_threshold(self, devices: int) -> int:
        """Messages the shuffler waits for so that a release holds ``devices`` devices: ``devices``
        times the most one device sends (a certainty); protocols whose count is unbounded override it."""
        return devices * (self.max_messages_per_device or 1)

    def devices_within(self, messages: int) -> int:
        """The most devices whose ``message_threshold`` is within ``messages`` (a campaign's n_min and
        batch target are stated in messages; this turns them back into devices)."""
        low, high = 0, max(1, messages)
        while low < high:  # the threshold rises with the devices: bisect for the last one within
            middle = (low + high + 1) // 2
            low, high = (middle, high) if self.message_threshold(middle) <= messages else (low, middle - 1)
        return low

    def devices(self, counts: Sequence[int], messages: int) -> int:
        """How many devices the counted messages came from (one message each, by default)."""
        return messages

    @classmethod
    def accounting_domain(cls, domain_size: int | None) -> int | None:
        """The domain size the accountant evaluates this mechanism at; ValueError where it needs
        one it was not given (the generic analyses need none)."""
        return domain_size

    @classmethod
    def shuffle_analyses(cls, epsilon0: float, n: int, domain_size: int | None) -> tuple[Analysis, ...]:
        """The accountant's by-name entry: the analyses valid for this mechanism at these parameters.

        By default the generic ones, valid for any epsilon0-LDP randomiser (they need no instance).
        """
        del domain_size
        return generic_analyses(epsilon0, n)

    def amplification_analyses(self, n: int) -> tuple[Analysis, ...]:
        """The amplification analyses valid for n shuffled reports of this randomiser (ADR 0027):
        the generic ones by default; randomisers with tighter analyses of their own add them."""
        return generic_analyses(self.epsilon0, n)

    def central_guarantee(self, n: int, delta: float) -> AmplificationBound:
        """Central (epsilon, delta) when n devices' outputs are shuffled together.

        By default the tightest of this randomiser's ``amplification_analyses``. Shuffle-only
        protocols override this with their own protocol analysis.
        """
        return tightest_bound(self.epsilon0, n, delta, lambda: self.amplification_analyses(n))

    def privacy_profile(self, n: int, epsilon: float) -> float:
        """delta(epsilon) of n devices' shuffled outputs: an upper bound on the hockey-stick
        divergence at e^epsilon over all neighbouring datasets (replace one device's value).

        By default the pointwise minimum of this randomiser's ``amplification_analyses`` (0 at or
        above epsilon0). Shuffle-only protocols override it with their own analysis.
        """
        return tightest_delta(self.epsilon0, n, epsilon, lambda: self.amplification_analyses(n))[0]

    def parameters(self) -> dict[str, float]:
        """Parameters beyond epsilon0 and the domain, as stored in ``Campaign.params``."""
        return {}

    def fake_payloads(self) -> list[bytes] | None:
        """Every well-formed payload an attacker could send (for the poisoning bound,
        ``core.mechanisms.manipulation``), or None where the set is too large to enumerate."""
        return None

    def manipulation_per_report(self) -> tuple[FloatArray, FloatArray] | None:
        """Closed-form per-bucket (raise, lower) one fake well-formed report causes, for estimators
        affine in (counts, n); None: not derived in closed form (``manipulation`` enumerates)."""
        return None

    def manipulation_at(
        self, counts: Sequence[int], n: int, fakes: int
    ) -> tuple[FloatArray, FloatArray] | None:
        """Exact per-bucket (raise, lower) ``fakes`` fake devices cause at these counts, for
        threshold estimators whose shift depends on the counts; None: not such an estimator."""
        return None

    manipulation_unbounded: ClassVar[str] = ""
    """Non-empty: why fake devices can move the estimates arbitrarily (stated instead of a bound)."""

    @abstractmethod
    def output_distribution(self, value: int) -> dict[bytes, Fraction]:
        """Exact probability of every payload the randomiser can emit for ``value``."""

    @abstractmethod
    def tally(self, payloads: Sequence[bytes]) -> Tally:
        """Count cells for the valid payloads; flags the ones outside the domain."""

    @abstractmethod
    def estimate(self, counts: Sequence[int], n: int, confidence: float = 0.95) -> list[Estimate]:
        """Unbiased per-bucket estimates of the true counts from ``n`` counted reports."""

    @abstractmethod
    def variance(self, true_counts: Sequence[float] | FloatArray, n: int) -> FloatArray:
        """Exact variance of each bucket's estimator when the true counts are ``true_counts``."""

    @property
    def realised_epsilon(self) -> float:
        """ln of the worst ratio of the exact output probabilities (<= epsilon0)."""
        worst = Fraction(1)
        for output in self.output_distribution(0):
            probs = [self.output_distribution(v).get(output, Fraction(0)) for v in range(self.domain_size)]
            low = min(probs)
            if low == 0:
                return math.inf
            worst = max(worst, max(probs) / low)
        return math.log(worst)

    def checked_values(self, values: Sequence[int]) -> IntArray:
        """Many true values as int64; ValueError (as ``check_value``) for any bad one."""
        array = np.asarray(values)
        integral = array.ndim == 1 and array.dtype.kind in "iub"
        if integral and (array.size == 0 or (int(array.min()) >= 0 and int(array.max()) < self.domain_size)):
            return array.astype(np.int64)
        for value in values:  # the scalar check names the culprit
            self.check_value(value)
        return np.fromiter((operator.index(v) for v in values), dtype=np.int64, count=len(values))

    def check_value(self, value: int) -> None:
        """Raise ValueError for a true value outside the domain."""
        try:
            index = operator.index(value)  # ints, bools and numpy integers; never floats
        except TypeError:
            raise ValueError(f"value {value!r} is not an integer") from None
        if not 0 <= index < self.domain_size:
            raise ValueError(f"value {value!r} is outside the domain 0..{self.domain_size - 1}")


def payload_matrix(payloads: Sequence[bytes], width: int) -> tuple[IntArray, npt.NDArray[np.bool_]]:
    """Payloads as an (n, width) int64 byte matrix, and which had the right length.

    Wrong-length payloads become zero rows (callers must treat them as invalid). The usual case,
    every payload of the right length, is one C-level join with no Python loop.
    """
    n = len(payloads)
    lengths_ok = np.fromiter(map(len, payloads), dtype=np.int64, count=n) == width
    if bool(lengths_ok.all()):
        joined = b"".join(payloads)
    else:
        filler = bytes(width)
        joined = b"".join(p if ok else filler for p, ok in zip(payloads, lengths_ok.tolist(), strict=True))
    return np.frombuffer(joined, dtype=np.uint8).reshape(n, width).astype(np.int64), lengths_ok


def split_rows(rows: npt.NDArray[np.uint8]) -> list[bytes]:
    """One ``bytes`` per row of a uint8 matrix (a void view: no per-row Python slicing)."""
    width = rows.shape[1]
    split: list[bytes] = np.ascontiguousarray(rows).view(f"V{width}").ravel().tolist()
    return split


def big_endian(matrix: IntArray, start: int, stop: int) -> IntArray:
    """Columns start..stop-1 of a byte matrix read as one big-endian unsigned integer per row."""
    values = np.zeros(matrix.shape[0], dtype=np.int64)
    for column in range(start, stop):
        values = values * 256 + matrix[:, column]
    return values


def support_shift(size: int, support: float, gap: float) -> tuple[FloatArray, FloatArray]:
    """(raise, lower) per bucket of est_v = (C_v - n q) / gap when one report adds 0 or 1 to C_v
    (either attainable) and 1 to n: raise (1 - q) / gap, lower q / gap."""
    return np.full(size, (1 - support) / gap), np.full(size, support / gap)


def normal_estimates(
    raw: Sequence[int], estimates: FloatArray, variances: FloatArray, confidence: float
) -> list[Estimate]:
    """Pack estimates and variances into ``Estimate`` rows with normal confidence intervals."""
    z = z_score(confidence)
    out = []
    for count, est, var in zip(raw, estimates, variances, strict=True):
        se = math.sqrt(max(float(var), 0.0))
        out.append(Estimate(int(count), float(est), se, float(est) - z * se, float(est) + z * se))
    return out
