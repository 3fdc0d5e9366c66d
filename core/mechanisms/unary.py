"""Unary encodings: symmetric (SUE, basic RAPPOR) and optimised (OUE), with their shared d-bit codec.

The true value v is one-hot encoded in d bits and every bit is reported independently: 1 with
probability a if it is v's bit, 1 with probability z otherwise (SUE: a = 1 - z = e^(eps0/2) /
(e^(eps0/2) + 1); OUE: a = 1/2, z = 1 / (e^eps0 + 1)). Inputs v, w change the roles of bits v and
w only, so the worst ratio of output probabilities is (a (1 - z)) / (z (1 - a)) (bit v = 1, bit
w = 0): for SUE ((1 - z) / z)**2, for OUE (1 - z) / z.

Exactness: a = A / 2**64 and z = Z / 2**64 with integers A, Z chosen so that this worst ratio is
<= b = ``exp_lower_bound(eps0)`` <= e**eps0 as an integer inequality (SUE: the largest A with
A**2 <= b (2**64 - A)**2, Z = 2**64 - A; OUE: A = 2**63, the smallest Z with 2**64 - Z <= b Z).
Every bit draws one uniform 64-bit integer u and reports u < (its threshold): P = T / 2**64 exactly.
The threshold of each bit is selected arithmetically from the one-hot vector, so the draws and the
work are the same whatever v is. ``randomise_many`` (simulations) reads each u lazily, top byte
first: the same event, so the same law, with about 8 times less keystream.

Estimator (shared with subset selection, see ``BitmapOracle``): with p* = P(bit j | truth j) and
q* = P(bit j | truth != j), x_j = (c_j - n q*) / (p* - q*) and, exactly,
Var = n q* (1 - q*) / (p* - q*)**2 + x_j (1 - p* - q*) / (p* - q*) (zero second term for SUE).
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
import struct
from abc import abstractmethod
from collections.abc import Iterator, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Final

from deniable.core.mechanisms.base import (
    Estimate,
    FloatArray,
    IntArray,
    LocalRandomiser,
    Tally,
    normal_estimates,
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

SCALE: Final = 1 << PROBABILITY_BITS  # thresholds are integers over 2**64
MAX_DOMAIN: Final = 1 << 16  # d-bit payloads: at most 8 KiB
MAX_EXACT_DOMAIN: Final = 12  # output_distribution enumerates up to 2**12 outputs
_CHUNK_ELEMENTS: Final = 1 << 22  # rows x bits processed at once by the vectorised paths
_LOW_BITS: Final = PROBABILITY_BITS - 8  # randomise_many reads a 64-bit draw as top byte + 56 low bits
_LOW_MASK: Final = (1 << _LOW_BITS) - 1

if TYPE_CHECKING:
    BoolMatrix = npt.NDArray[np.bool_]
    Uint64Array = npt.NDArray[np.uint64]


FAKE_ENUMERATION_MAX_DOMAIN: Final = 12


class BitmapOracle(LocalRandomiser):
    """Shared d-bit bitmap codec, tally and estimator of the unary encodings and subset selection."""

    support_true: Fraction  # p*: P(bit j = 1 | the true value is j)
    support_other: Fraction  # q*: P(bit j = 1 | the true value is not j)

    def __init__(self, epsilon0: float, domain_size: int) -> None:
        super().__init__(epsilon0, domain_size)
        if self.domain_size > MAX_DOMAIN:
            raise ValueError(f"{self.name} supports at most {MAX_DOMAIN} categories (d-bit payloads)")

    @functools.cached_property
    def _positions(self) -> IntArray:
        """0..d-1 for the vectorised paths (built on first use: the device path needs no numpy)."""
        return np.arange(self.domain_size, dtype=np.int64)

    def _set_support(self, true: Fraction, other: Fraction) -> None:
        """Record p*, q* and the float coefficients of the estimator and its variance."""
        gap = true - other
        if gap <= 0:
            raise ValueError(f"epsilon0 = {self.epsilon0!r} is too small: reports would carry no information")
        self.support_true, self.support_other = true, other
        self._gap = float(gap)
        self._other = float(other)
        self._base_variance = float(other * (1 - other) / gap**2)
        self._slope = float((1 - true - other) / gap)

    @property
    def payload_length(self) -> int:
        return (self.domain_size + 7) // 8

    @property
    def count_cells(self) -> int:
        return self.domain_size

    def _rows_per_chunk(self) -> int:
        return max(1, _CHUNK_ELEMENTS // self.domain_size)

    def _payloads(self, bits: BoolMatrix) -> list[bytes]:
        """Rows of a (n, d) bit matrix as packed big-endian payloads, spare bits zero."""
        blob = np.packbits(bits, axis=1).tobytes()
        width = self.payload_length
        return [blob[i : i + width] for i in range(0, len(blob), width)]

    def _bitmap(self, members: Sequence[int] | Iterator[int]) -> bytes:
        """The payload whose set bits are exactly ``members``."""
        word = 0
        for position in members:
            word |= 1 << (self.domain_size - 1 - position)
        return (word << (8 * self.payload_length - self.domain_size)).to_bytes(self.payload_length, "big")

    def _check_exact_domain(self) -> None:
        if self.domain_size > MAX_EXACT_DOMAIN:
            raise ValueError(
                f"output_distribution enumerates every output: only for d <= {MAX_EXACT_DOMAIN} "
                f"(got d = {self.domain_size}); realised_epsilon is analytic for any d"
            )

    def _valid_rows(self, bits: npt.NDArray[np.uint8]) -> npt.NDArray[np.bool_]:
        """Extra validity of decoded bit rows (every bit pattern is valid by default)."""
        return np.ones(bits.shape[0], dtype=np.bool_)

    def fake_payloads(self) -> list[bytes] | None:
        """Every bit pattern the oracle can emit, for domains of at most 12 buckets (4096 patterns)."""
        if self.domain_size > FAKE_ENUMERATION_MAX_DOMAIN:
            return None
        return sorted({p for v in range(self.domain_size) for p in self.output_distribution(v)})

    def manipulation_per_report(self) -> tuple[FloatArray, FloatArray]:
        """est_v = (c_v - n q*) / (p* - q*); a fake bitmap may set bit v or not (subset selection:
        1 <= omega <= d - 1): raise (1 - q*)/(p* - q*), lower q*/(p* - q*)."""
        return support_shift(self.domain_size, self._other, self._gap)

    def tally(self, payloads: Sequence[bytes]) -> Tally:
        width, d = self.payload_length, self.domain_size
        n = len(payloads)
        counts = np.zeros(d, dtype=np.int64)
        invalid = np.ones(n, dtype=np.bool_)
        spare = (1 << (8 * width - d)) - 1  # low bits of the last byte that must be zero
        rows = max(1, _CHUNK_ELEMENTS // (8 * width))
        for start in range(0, n, rows):
            chunk = payloads[start : start + rows]
            m = len(chunk)
            lengths_ok = np.fromiter((len(p) == width for p in chunk), dtype=np.bool_, count=m)
            joined = b"".join(p if ok else bytes(width) for p, ok in zip(chunk, lengths_ok, strict=True))
            matrix = np.frombuffer(joined, dtype=np.uint8).reshape(m, width)
            bits = np.unpackbits(matrix, axis=1)[:, :d]
            ok = lengths_ok & ((matrix[:, -1] & np.uint8(spare)) == 0) & self._valid_rows(bits)
            invalid[start : start + m] = ~ok
            counts += bits[ok].sum(axis=0, dtype=np.int64)
        return Tally(counts=counts, invalid=invalid)

    def estimate(self, counts: Sequence[int], n: int, confidence: float = 0.95) -> list[Estimate]:
        if len(counts) != self.domain_size:
            raise ValueError(f"expected {self.domain_size} counts, got {len(counts)}")
        raw = np.asarray(counts, dtype=np.float64)
        estimates = (raw - n * self._other) / self._gap
        plug_in = np.clip(estimates, 0.0, float(n))
        return normal_estimates(list(counts), estimates, self.variance(plug_in, n), confidence)

    def variance(self, true_counts: Sequence[float] | FloatArray, n: int) -> FloatArray:
        truth = np.asarray(true_counts, dtype=np.float64)
        return n * self._base_variance + truth * self._slope


class UnaryEncoding(BitmapOracle):
    """One-hot vector, every bit reported independently with thresholds A (own bit) and Z (others)."""

    def __init__(self, epsilon0: float, domain_size: int) -> None:
        super().__init__(epsilon0, domain_size)
        own, others = self._thresholds(exp_lower_bound(self.epsilon0))
        if not 0 < others <= own < SCALE:
            raise ValueError("thresholds must satisfy 0 < Z <= A < 2**64")
        self.own_threshold, self.other_threshold = own, others
        self._set_support(Fraction(own, SCALE), Fraction(others, SCALE))

    # numpy scalars of the thresholds for the vectorised paths, made on first use (not on devices)
    @functools.cached_property
    def _base(self) -> np.uint64:
        return np.uint64(self.other_threshold)

    @functools.cached_property
    def _step(self) -> np.uint64:
        return np.uint64(self.own_threshold - self.other_threshold)

    @functools.cached_property
    def _own_top(self) -> np.uint8:
        return np.uint8(self.own_threshold >> _LOW_BITS)

    @functools.cached_property
    def _other_top(self) -> np.uint8:
        return np.uint8(self.other_threshold >> _LOW_BITS)

    @functools.cached_property
    def _own_low(self) -> np.uint64:
        return np.uint64(self.own_threshold & _LOW_MASK)

    @functools.cached_property
    def _other_low(self) -> np.uint64:
        return np.uint64(self.other_threshold & _LOW_MASK)

    @staticmethod
    @abstractmethod
    def _thresholds(bound: Fraction) -> tuple[int, int]:
        """(A, Z) whose worst ratio is provably <= ``bound``."""

    def _bits(self, draws: Uint64Array, values: IntArray) -> BoolMatrix:
        """Bit (i, j) = draws[i, j] < threshold, the threshold picked arithmetically from one-hot."""
        hot = (self._positions[None, :] == values[:, None]).astype(np.uint64)
        bits: BoolMatrix = draws < self._base + hot * self._step
        return bits

    def randomise(self, value: int, rng: Csprng | None = None) -> bytes:
        """Pure Python (the device needs no numpy); same draws and bits as ``_bits``: bit j is
        draw_j < Z + [j == v] (A - Z), the threshold picked arithmetically for every j."""
        self.check_value(value)
        v, step, base = operator.index(value), self.own_threshold - self.other_threshold, self.other_threshold
        raw = (rng or default_rng()).bytes(8 * self.domain_size)
        word = 0
        for j, (draw,) in enumerate(struct.iter_unpack("<Q", raw)):
            word = (word << 1) | int(draw < base + int(j == v) * step)
        spare = 8 * self.payload_length - self.domain_size
        return (word << spare).to_bytes(self.payload_length, "big")

    def randomise_many(self, values: Sequence[int], rng: Csprng | None = None) -> list[bytes]:
        """Simulation path, same law as ``randomise`` at about 1/8 of the randomness (``_lazy_bits``)."""
        checked = self.checked_values(values)
        source = rng or default_rng()
        d, rows = self.domain_size, self._rows_per_chunk()
        out: list[bytes] = []
        for start in range(0, len(checked), rows):
            chunk = checked[start : start + rows]
            top = np.frombuffer(source.bytes(len(chunk) * d), dtype=np.uint8).reshape(len(chunk), d)
            out += self._payloads(self._lazy_bits(top, chunk, source))
        return out

    def _lazy_bits(self, top: npt.NDArray[np.uint8], values: IntArray, source: Csprng) -> BoolMatrix:
        """[u < T] for u = 2**56 top + low read lazily: the top byte decides unless it ties with T's
        (probability 1/256 whatever T), then a fresh uniform 56-bit low does. Exactly T / 2**64."""
        hot = self._positions[None, :] == values[:, None]
        threshold_top = np.where(hot, self._own_top, self._other_top)
        bits: BoolMatrix = top < threshold_top
        tied = np.nonzero(top == threshold_top)
        if tied[0].size:
            low = source.uint64_array(tied[0].size) & np.uint64(_LOW_MASK)
            bits[tied] = low < np.where(hot[tied], self._own_low, self._other_low)
        return bits

    def output_distribution(self, value: int) -> dict[bytes, Fraction]:
        """Exact law over all 2**d bitmaps; only for d <= 12 (ValueError above)."""
        self.check_value(value)
        self._check_exact_domain()
        d, v = self.domain_size, operator.index(value)
        a, z = self.support_true, self.support_other
        # P(y) = prod_i P(y_i | role of i) = z^k (1 - z)^(d - k) * [own bit's factor / other's factor]
        background = [z**k * (1 - z) ** (d - k) for k in range(d + 1)]
        own_factor = {1: a / z, 0: (1 - a) / (1 - z)}
        law = {}
        for pattern in itertools.product((0, 1), repeat=d):
            members = [i for i in range(d) if pattern[i]]
            law[self._bitmap(members)] = background[len(members)] * own_factor[pattern[v]]
        return law

    @property
    def worst_ratio(self) -> Fraction:
        """max P(y | v) / P(y | w) over outputs and inputs: (A (2**64 - Z)) / (Z (2**64 - A))."""
        a, z = self.own_threshold, self.other_threshold
        return Fraction(a * (SCALE - z), z * (SCALE - a))

    @property
    def realised_epsilon(self) -> float:
        return math.log1p(float(self.worst_ratio - 1))  # accurate for ratios near 1 too


def _sue_threshold(bound: Fraction) -> int:
    """Largest A in [2**63, 2**64) with (A / (2**64 - A))**2 <= bound, by exact bisection."""
    num, den = bound.numerator, bound.denominator

    def fits(a: int) -> bool:
        return a * a * den <= num * (SCALE - a) ** 2

    low, high = SCALE // 2, SCALE - 1  # fits(low): the ratio is 1 <= bound
    if fits(high):
        return high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


class SymmetricUnaryEncoding(UnaryEncoding):
    """Basic RAPPOR: every bit of the one-hot vector kept w.p. e^(eps0/2) / (e^(eps0/2) + 1)."""

    name = "sue"
    proto = pb.SUE
    summary = "symmetric unary encoding (basic RAPPOR): each one-hot bit kept w.p. e^(eps0/2)/(1+e^(eps0/2))"

    @staticmethod
    def _thresholds(bound: Fraction) -> tuple[int, int]:
        keep = _sue_threshold(bound)
        return keep, SCALE - keep


class OptimisedUnaryEncoding(UnaryEncoding):
    """OUE (Wang et al. 2017): own bit 1 w.p. 1/2, every other bit 1 w.p. 1 / (e^eps0 + 1)."""

    name = "oue"
    proto = pb.OUE
    summary = "optimised unary encoding: own bit 1 w.p. 1/2, each other bit 1 w.p. 1/(e^eps0+1)"

    @staticmethod
    def _thresholds(bound: Fraction) -> tuple[int, int]:
        return SCALE // 2, math.ceil(SCALE / (1 + bound))  # smallest Z with (2**64 - Z) / Z <= bound
