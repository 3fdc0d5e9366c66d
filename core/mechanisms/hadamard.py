"""Hadamard response (HR, Acharya, Sun, Zhang, AISTATS 2019).

K is the smallest power of two above d; value v owns row w = v + 1 of the K x K Sylvester
Hadamard matrix H[w, i] = (-1)^popcount(w & i) and its set C_v = {i : H[w, i] = +1} of K/2
indices. A device reports a uniform index of C_v with probability e^eps0 / (e^eps0 + 1), else a
uniform index of the complement, so every index has probability 2 e^eps0 / (K (e^eps0 + 1)) or
2 / (K (e^eps0 + 1)). The aggregator keeps the K output counts; one fast Walsh-Hadamard
transform (O(K log K)) gives every support count, hence unbiased estimates with exact variance
n / (2p - 1)^2 - x_v. See docs/mechanisms/hadamard_response.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING

from deniable.core.mechanisms.base import (
    Estimate,
    FloatArray,
    IntArray,
    LocalRandomiser,
    Tally,
    big_endian,
    normal_estimates,
    payload_matrix,
    split_rows,
    support_shift,
)
from deniable.core.mechanisms.exact import PROBABILITY_BITS, exp_lower_bound
from deniable.core.rng import Csprng, default_rng
from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:
    import numpy as np
else:
    from deniable.core.lazy import numpy as np

MAX_DOMAIN = (1 << 24) - 1  # K <= 2**24 count cells
MAX_EXACT_OUTPUTS = 1 << 16  # output_distribution enumerates K payloads


def walsh_hadamard(counts: Sequence[int] | IntArray) -> IntArray:
    """H @ counts for the Sylvester-ordered Hadamard matrix, exactly in int64, O(K log K)."""
    a = np.array(counts, dtype=np.int64)
    size = a.size
    if size & (size - 1) or size == 0:
        raise ValueError(f"length must be a power of two, got {size}")
    h = 1
    while h < size:
        pairs = a.reshape(-1, 2, h)
        a = np.stack((pairs[:, 0] + pairs[:, 1], pairs[:, 0] - pairs[:, 1]), axis=1).reshape(size)
        h *= 2
    return a


class HadamardResponse(LocalRandomiser):
    """HR: an index of the value's Hadamard half w.p. e^eps0 / (e^eps0 + 1), else of the other half."""

    name = "hadamard_response"
    proto = pb.HADAMARD_RESPONSE
    summary = "Hadamard response: an index from the value's Hadamard row half w.p. e^eps0/(e^eps0+1)"

    def __init__(self, epsilon0: float, domain_size: int) -> None:
        super().__init__(epsilon0, domain_size)
        if self.domain_size > MAX_DOMAIN:
            raise ValueError(f"hadamard_response supports at most {MAX_DOMAIN} categories")
        self.order = 1 << self.domain_size.bit_length()  # K: smallest power of two > d
        self._half_bits = self.order.bit_length() - 2  # log2(K / 2)
        bound = exp_lower_bound(self.epsilon0)
        scale = 1 << PROBABILITY_BITS
        self._inside_threshold = math.floor(scale * bound / (1 + bound))
        # P(the report lies in C_v): the side is one comparison of a 64-bit draw.
        self.inside_probability = Fraction(self._inside_threshold, scale)
        self.index_probability_inside = self.inside_probability * Fraction(2, self.order)
        self.index_probability_outside = (1 - self.inside_probability) * Fraction(2, self.order)

    @property
    def payload_length(self) -> int:
        return (self.order.bit_length() - 1 + 7) // 8

    @property
    def count_cells(self) -> int:
        return self.order

    def index_in_half(self, value: int, position: int, inside: int) -> int:
        """Index number ``position`` of C_v (inside = 1) or of its complement (inside = 0).

        A bijection [0, K/2) -> half: insert a bit at the lowest set bit m of w = v + 1, chosen so
        that parity(i & w) is even (C_v) or odd; both candidates are formed, one selected
        arithmetically. Every intermediate is non-negative: ``w & -w`` and ``~low`` would make
        negative ints outside CPython's small-int cache for some values and not others, a few
        nanoseconds that the timing test saw as a value-dependent delay.
        """
        w = value + 1
        m_bit = w ^ (w & (w - 1))  # lowest set bit of w
        low = m_bit - 1
        kept = position & low
        base = ((position - kept) << 1) | kept
        candidate_in = base | (((base & w).bit_count() & 1) * m_bit)
        candidate_out = candidate_in ^ m_bit
        return inside * candidate_in + (1 - inside) * candidate_out

    def randomise(self, value: int, rng: Csprng | None = None) -> bytes:
        self.check_value(value)
        rng = rng or default_rng()
        inside = int(rng.randbits(PROBABILITY_BITS) < self._inside_threshold)
        position = rng.randbits(self._half_bits)  # uniform in [0, K/2), no rejection
        return self.index_in_half(int(value), position, inside).to_bytes(self.payload_length, "big")

    def randomise_many(self, values: Sequence[int], rng: Csprng | None = None) -> list[bytes]:
        array = self.checked_values(values)
        n = int(array.size)
        if n == 0:
            return []
        rng = rng or default_rng()
        inside = (rng.uint64_array(n) < np.uint64(self._inside_threshold)).astype(np.int64)
        position = (rng.uint64_array(n) >> np.uint64(64 - self._half_bits)).astype(np.int64)
        w = array + 1
        m_bit = w & -w
        low = m_bit - 1
        base = ((position & ~low) << 1) | (position & low)
        candidate_in = base | ((np.bitwise_count(base & w).astype(np.int64) & 1) * m_bit)
        candidate_out = candidate_in ^ m_bit
        index = inside * candidate_in + (1 - inside) * candidate_out
        width = self.payload_length
        rows = np.empty((n, width), dtype=np.uint8)
        for c in range(width):
            rows[:, c] = (index >> (8 * (width - 1 - c))) & 0xFF
        return split_rows(rows)

    def output_distribution(self, value: int) -> dict[bytes, Fraction]:
        self.check_value(value)
        if self.order > MAX_EXACT_OUTPUTS:
            raise ValueError(f"exact law has K = {self.order} outputs; enumerated up to {MAX_EXACT_OUTPUTS}")
        w = int(value) + 1
        return {
            i.to_bytes(self.payload_length, "big"): (
                self.index_probability_inside
                if (i & w).bit_count() % 2 == 0
                else self.index_probability_outside
            )
            for i in range(self.order)
        }

    @property
    def realised_epsilon(self) -> float:
        """ln(T / (2^64 - T)): every pair of rows disagrees on K/2 indices, so the ratio is attained."""
        return math.log(self._inside_threshold) - math.log((1 << PROBABILITY_BITS) - self._inside_threshold)

    def tally(self, payloads: Sequence[bytes]) -> Tally:
        width = self.payload_length
        matrix, lengths_ok = payload_matrix(payloads, width)
        index = big_endian(matrix, 0, width)
        invalid = ~lengths_ok | (index >= self.order)
        counts = np.bincount(index[~invalid], minlength=self.order).astype(np.int64)
        return Tally(counts=counts, invalid=invalid)

    def support_counts(self, counts: Sequence[int] | IntArray) -> IntArray:
        """S_v = number of reports in C_v, for every v: (total + (H c)[v + 1]) / 2."""
        cells = np.asarray(counts, dtype=np.int64)
        if cells.shape != (self.order,):
            raise ValueError(f"expected {self.order} counts, got {cells.shape}")
        transformed = walsh_hadamard(cells)
        return (int(cells.sum()) + transformed[1 : self.domain_size + 1]) // 2

    def manipulation_per_report(self) -> tuple[FloatArray, FloatArray]:
        """est_v = (2 S_v - n) / gap; a fake index lies in C_v (index 0 always) or not: 1/gap either way."""
        gap = 2 * float(self.inside_probability) - 1
        return support_shift(self.domain_size, 0.5, gap / 2)

    def estimate(self, counts: Sequence[int], n: int, confidence: float = 0.95) -> list[Estimate]:
        if len(counts) != self.order:
            raise ValueError(f"expected {self.order} counts, got {len(counts)}")
        support = self.support_counts(counts)
        gap = 2 * float(self.inside_probability) - 1
        estimates = (2 * support - n) / gap
        plug_in = np.clip(estimates, 0.0, float(n))
        return normal_estimates(support.tolist(), estimates, self.variance(plug_in, n), confidence)

    def variance(self, true_counts: Sequence[float] | FloatArray, n: int) -> FloatArray:
        gap = 2 * float(self.inside_probability) - 1
        truth = np.asarray(true_counts, dtype=np.float64)
        return n / gap**2 - truth
