"""Direct-encoding randomised response: binary RR and k-ary RR (GRR).

Both report one value of the domain: the true one with probability p, each other one with
probability q, p / q <= e**epsilon0 exactly (integer thresholds, see ``exact``). One shared
estimator: x_j = (c_j - n q) / (p - q), with exact variance
n q (1 - q) / (p - q)**2 + x_j (1 - p - q) / (p - q); the second term depends on the truth
and vanishes for binary RR.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Final

from deniable.core.amplification import (
    Analysis,
    BinaryRRExact,
    GRRBlanket,
    GRRFullBlanket,
    generic_analyses,
)
from deniable.core.mechanisms.base import (
    Estimate,
    FloatArray,
    LocalRandomiser,
    Tally,
    big_endian,
    normal_estimates,
    payload_matrix,
    support_shift,
)
from deniable.core.mechanisms.exact import PROBABILITY_BITS, exp_lower_bound
from deniable.core.rng import Csprng, default_rng
from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
else:
    from deniable.core.lazy import numpy as np
    from deniable.core.lazy import numpy_typing as npt

_OTHER_WEIGHT = 1 << 40
_MAX_VECTOR_WEIGHT: Final = 1 << 62  # randbelow_array's limit; larger totals take the scalar path
_PACK_TABLE_LIMIT: Final = 1 << 16  # domains up to this size pack through a table of payloads


class DirectEncoding(LocalRandomiser):
    """Shared payload codec and estimator of binary RR and GRR."""

    keep_probability: Fraction
    other_probability: Fraction

    @classmethod
    def accounting_domain(cls, domain_size: int | None) -> int:
        if domain_size is None or domain_size < 2:
            raise ValueError(f"{cls.name} needs domain_size >= 2")
        return int(domain_size)

    @classmethod
    def shuffle_analyses(cls, epsilon0: float, n: int, domain_size: int | None) -> tuple[Analysis, ...]:
        return cls(epsilon0, cls.accounting_domain(domain_size)).amplification_analyses(n)

    def amplification_analyses(self, n: int) -> tuple[Analysis, ...]:
        """The generic analyses, the GRR privacy blanket and, for k >= 3 values, the full blanket or,
        for 2, the exact shuffled-count profile, all at the realised probabilities (the integer
        thresholds keep p slightly below e^eps0 / (e^eps0 + k - 1))."""
        k, keep, other = self.domain_size, float(self.keep_probability), float(self.other_probability)
        found = [*generic_analyses(self.epsilon0, n), GRRBlanket(self.epsilon0, int(n), k, keep, other)]
        if k >= 3:
            found.append(GRRFullBlanket(self.epsilon0, int(n), k, keep, other))
        if k == 2:
            found.append(BinaryRRExact(self.epsilon0, int(n), keep))
        return tuple(found)

    @property
    def payload_length(self) -> int:
        return max(1, (max(self.domain_size - 1, 1).bit_length() + 7) // 8)

    @property
    def count_cells(self) -> int:
        return self.domain_size

    def _pack(self, value: int) -> bytes:
        return value.to_bytes(self.payload_length, "big")

    @functools.cached_property
    def _payload_table(self) -> list[bytes]:
        """Every payload of the domain, indexed by value (small domains only)."""
        return [self._pack(v) for v in range(self.domain_size)]

    def _pack_many(self, chosen: npt.NDArray[np.int64]) -> list[bytes]:
        """``_pack`` of every value (a shared table of the d payloads for small domains)."""
        if self.domain_size <= _PACK_TABLE_LIMIT:
            table = self._payload_table
            return [table[v] for v in chosen.tolist()]
        width = self.payload_length
        raw = chosen.astype(">u8").view(np.uint8).reshape(-1, 8)[:, 8 - width :].tobytes()
        return [raw[i : i + width] for i in range(0, len(raw), width)]

    def fake_payloads(self) -> list[bytes]:
        """The k payloads (one per output value): a fake report can only be one of them."""
        return list(self._payload_table)

    def output_distribution(self, value: int) -> dict[bytes, Fraction]:
        self.check_value(value)
        return {
            self._pack(v): self.keep_probability if v == value else self.other_probability
            for v in range(self.domain_size)
        }

    def manipulation_per_report(self) -> tuple[FloatArray, FloatArray]:
        """est_v = (c_v - n q) / (p - q); a fake adds 1 to n and to one c_u (u = v or not, d >= 2):
        raise (1 - q)/(p - q), lower q/(p - q)."""
        p, q = float(self.keep_probability), float(self.other_probability)
        return support_shift(self.domain_size, q, p - q)

    def tally(self, payloads: Sequence[bytes]) -> Tally:
        matrix, lengths_ok = payload_matrix(payloads, self.payload_length)
        values = big_endian(matrix, 0, self.payload_length)
        invalid = ~lengths_ok | (values >= self.domain_size)
        counts = np.bincount(values[~invalid], minlength=self.domain_size).astype(np.int64)
        return Tally(counts=counts, invalid=invalid)

    def estimate(self, counts: Sequence[int], n: int, confidence: float = 0.95) -> list[Estimate]:
        if len(counts) != self.domain_size:
            raise ValueError(f"expected {self.domain_size} counts, got {len(counts)}")
        p, q = float(self.keep_probability), float(self.other_probability)
        raw = np.asarray(counts, dtype=np.float64)
        estimates = (raw - n * q) / (p - q)
        plug_in = np.clip(estimates, 0.0, float(n))
        return normal_estimates(list(counts), estimates, self.variance(plug_in, n), confidence)

    def variance(self, true_counts: Sequence[float] | FloatArray, n: int) -> FloatArray:
        p, q = float(self.keep_probability), float(self.other_probability)
        truth = np.asarray(true_counts, dtype=np.float64)
        return n * q * (1 - q) / (p - q) ** 2 + truth * (1 - p - q) / (p - q)


class BinaryRandomisedResponse(DirectEncoding):
    """Warner's randomised response on {0, 1}: keep the answer with p = e^eps0 / (1 + e^eps0)."""

    name = "binary_rr"
    proto = pb.BINARY_RR
    summary = "binary randomised response: keep the bit w.p. e^eps0/(1+e^eps0), else flip it"

    @classmethod
    def accounting_domain(cls, domain_size: int | None) -> int:
        if domain_size not in (None, 2):
            raise ValueError("binary_rr has a domain of exactly 2 values")
        return 2

    def __init__(self, epsilon0: float, domain_size: int = 2) -> None:
        if domain_size != 2:
            raise ValueError("binary_rr has a domain of exactly 2 values")
        super().__init__(epsilon0, domain_size)
        bound = exp_lower_bound(epsilon0)
        scale = 1 << PROBABILITY_BITS
        self._keep_threshold = math.floor(scale * bound / (1 + bound))
        self.keep_probability = Fraction(self._keep_threshold, scale)
        self.other_probability = 1 - self.keep_probability

    def randomise(self, value: int, rng: Csprng | None = None) -> bytes:
        self.check_value(value)
        draw = (rng or default_rng()).randbits(PROBABILITY_BITS)
        flip = int(draw >= self._keep_threshold)
        return bytes((int(value) ^ flip,))

    def randomise_many(self, values: Sequence[int], rng: Csprng | None = None) -> list[bytes]:
        """``randomise`` for many devices: the same 64-bit draw and threshold, one array at a time."""
        truth = self.checked_values(values)
        draws = (rng or default_rng()).uint64_array(truth.size)
        flip = (draws >= np.uint64(self._keep_threshold)).astype(np.int64)
        return self._pack_many(truth ^ flip)


class GeneralisedRandomisedResponse(DirectEncoding):
    """k-ary RR (GRR): keep w.p. e^eps0 / (e^eps0 + k - 1), else a uniform other value."""

    name = "grr"
    proto = pb.GRR
    summary = "k-ary randomised response: the true category w.p. e^eps0/(e^eps0+k-1), else another"

    def __init__(self, epsilon0: float, domain_size: int) -> None:
        super().__init__(epsilon0, domain_size)
        if domain_size > 1 << 24:
            raise ValueError("grr supports at most 2**24 categories")
        self._keep_weight = math.floor(exp_lower_bound(epsilon0) * _OTHER_WEIGHT)
        self._total_weight = self._keep_weight + (domain_size - 1) * _OTHER_WEIGHT
        self.keep_probability = Fraction(self._keep_weight, self._total_weight)
        self.other_probability = Fraction(_OTHER_WEIGHT, self._total_weight)

    def randomise(self, value: int, rng: Csprng | None = None) -> bytes:
        self.check_value(value)
        value = int(value)
        draw = (rng or default_rng()).randbelow(self._total_weight)
        keep = int(draw < self._keep_weight)
        # Both candidates are computed every time; the choice is arithmetic, not a branch.
        other_index = max(draw - self._keep_weight, 0) // _OTHER_WEIGHT
        other = other_index + int(other_index >= value)
        chosen = keep * value + (1 - keep) * other
        return self._pack(chosen)

    def randomise_many(self, values: Sequence[int], rng: Csprng | None = None) -> list[bytes]:
        """``randomise`` for many devices: the same exact uniform draw below the total weight and the
        same arithmetic selection, on arrays (scalar path when the weight exceeds 2**62)."""
        if self._total_weight > _MAX_VECTOR_WEIGHT:
            return super().randomise_many(values, rng)
        truth = self.checked_values(values)
        draw = (rng or default_rng()).randbelow_array(self._total_weight, truth.size)
        keep = draw < self._keep_weight
        other_index = np.maximum(draw - self._keep_weight, 0) // _OTHER_WEIGHT
        other = other_index + (other_index >= truth)
        return self._pack_many(np.where(keep, truth, other))
