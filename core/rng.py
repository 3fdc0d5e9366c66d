"""The one cryptographically secure random source for privacy noise and the shuffle.

A ChaCha20 keystream keyed from ``os.urandom`` (re-keyed in every forked child), read as
unsigned integers. The keystream is a sequence of 64 KiB chunks, chunk ``i`` being ChaCha20 under
the key with nonce ``i``, blocks 1 to 1024 (``deniable.core.primitives.keystream_chunk``): the
same bytes from cryptography and from PyNaCl (the bare device SDK, ADR 0039). Every privacy
decision is an integer comparison against an exact threshold; nothing here returns a float.
``random`` and ``numpy.random`` are never used.
"""

from __future__ import annotations

import bisect
import functools
import math
import os
import threading
import weakref
from fractions import Fraction
from typing import TYPE_CHECKING, Final

from deniable.core.primitives import KEYSTREAM_CHUNK, keystream_chunk

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
else:
    from deniable.core.lazy import numpy as np
    from deniable.core.lazy import numpy_typing as npt

_BUFFER_BYTES: Final = KEYSTREAM_CHUNK


_UNKEYED: weakref.WeakSet[Csprng] = weakref.WeakSet()


class Csprng:
    """ChaCha20 keystream generator; thread safe; re-keyed from the OS after ``fork``."""

    def __init__(self, key: bytes | None = None) -> None:
        """Key from ``os.urandom`` unless a key is given (tests that need reproducible streams)."""
        self._lock = threading.Lock()
        self._fixed_key = key
        self._rekey()
        if key is None:
            _UNKEYED.add(self)

    def _rekey(self) -> None:
        key = self._fixed_key if self._fixed_key is not None else os.urandom(32)
        if len(key) != 32:
            raise ValueError("a Csprng key is 32 bytes")
        self._key = key
        self._chunk = 0  # index (ChaCha20 nonce) of the next keystream chunk; a new key restarts it
        self._buffer = b""
        self._offset = 0

    def reseed_after_fork(self) -> None:
        """Draw a fresh OS key so a forked child never repeats its parent's stream.

        Runs in the child right after fork, where only the forking thread exists: the lock may
        have been copied in the held state by another parent thread, so it is replaced, not taken.
        """
        self._lock = threading.Lock()
        self._fixed_key = None
        self._rekey()

    def bytes(self, count: int) -> bytes:
        """Return ``count`` uniformly random bytes.

        They come from the current 64 KiB keystream chunk, then from as many following chunks as
        needed; the stream is the same whatever the sizes of the reads.
        """
        if count < 0:
            raise ValueError("count must be non-negative")
        with self._lock:
            available = len(self._buffer) - self._offset
            if count <= available:
                start = self._offset
                self._offset += count
                return self._buffer[start : self._offset]
            parts = [self._buffer[self._offset :]]
            rest = count - available
            while True:
                self._buffer = keystream_chunk(self._key, self._chunk)
                self._chunk += 1
                if rest <= _BUFFER_BYTES:
                    self._offset = rest
                    parts.append(self._buffer[:rest])
                    return b"".join(parts)
                parts.append(self._buffer)
                rest -= _BUFFER_BYTES

    def randbits(self, bits: int) -> int:
        """Uniform integer in [0, 2**bits)."""
        if bits <= 0:
            return 0
        raw = int.from_bytes(self.bytes((bits + 7) // 8), "big")
        return raw >> ((8 - bits % 8) % 8)

    def randbelow(self, upper: int) -> int:
        """Uniform integer in [0, upper), exact, by rejection on ``bit_length(upper)`` bits.

        The number of draws depends only on ``upper`` (public), never on a private value.
        """
        if upper <= 0:
            raise ValueError("upper must be positive")
        bits = upper.bit_length()
        while True:
            candidate = self.randbits(bits)
            if candidate < upper:
                return candidate

    def bernoulli(self, probability: Fraction) -> bool:
        """True with exactly the rational ``probability``."""
        if not 0 <= probability <= 1:
            raise ValueError("probability must lie in [0, 1]")
        return self.randbelow(probability.denominator) < probability.numerator

    def uint64_array(self, count: int) -> npt.NDArray[np.uint64]:
        """``count`` independent uniform 64-bit integers as a numpy array."""
        return np.frombuffer(self.bytes(8 * count), dtype="<u8").astype(np.uint64)

    def randbelow_array(self, upper: int, count: int) -> npt.NDArray[np.int64]:
        """``count`` independent exact uniform integers in [0, upper), vectorised rejection."""
        if not 0 < upper <= 1 << 62:
            raise ValueError("upper must be in (0, 2**62]")
        bits = upper.bit_length()
        out = np.empty(count, dtype=np.int64)
        filled = 0
        while filled < count:
            need = count - filled
            draw = self.uint64_array(need + need // 4 + 16) >> np.uint64(64 - bits)
            ok = draw[draw < np.uint64(upper)][:need]
            out[filled : filled + len(ok)] = ok.astype(np.int64)
            filled += len(ok)
        return out

    def bernoulli_array(self, probability: Fraction, count: int) -> npt.NDArray[np.bool_]:
        """``count`` independent exact Bernoulli(probability) draws; denominator at most 2**62."""
        if not 0 <= probability <= 1:
            raise ValueError("probability must lie in [0, 1]")
        return self.randbelow_array(probability.denominator, count) < probability.numerator

    def bernoulli_exp(self, gamma: Fraction) -> bool:
        """True with probability exactly exp(-gamma), gamma >= 0 rational.

        Canonne, Kamath, Steinke 2020, Algorithm 1 (gamma > 1 as floor(gamma) factors e^-1 and one rest).
        """
        gamma = Fraction(gamma)
        if gamma < 0:
            raise ValueError("gamma must be non-negative")
        for _ in range(math.floor(gamma)):
            if not self._bernoulli_exp_at_most_one(Fraction(1)):
                return False
        return self._bernoulli_exp_at_most_one(gamma - math.floor(gamma))

    def _bernoulli_exp_at_most_one(self, gamma: Fraction) -> bool:
        k = 1
        while self.bernoulli(gamma / k):
            k += 1
        return k % 2 == 1

    def geometric(self, scale: Fraction) -> int:
        """X >= 0 with P[X = x] = (1 - e^(-1/scale)) e^(-x/scale), exactly; scale > 0 rational.

        Canonne, Kamath, Steinke 2020, Algorithm 2 (scale = t/s: floor((U + t V) / s)).
        """
        scale = Fraction(scale)
        if scale <= 0:
            raise ValueError("scale must be positive")
        t, s = scale.numerator, scale.denominator
        while True:
            u = self.randbelow(t)
            if not self.bernoulli_exp(Fraction(u, t)):
                continue
            v = 0
            while self.bernoulli_exp(Fraction(1)):
                v += 1
            return (u + t * v) // s

    def discrete_laplace(self, scale: Fraction) -> int:
        """Z with P[Z = z] proportional to e^(-|z|/scale), exactly (CKS 2020, Algorithm 2); scale > 0.

        A geometric magnitude and a fair sign; "negative zero" is rejected so 0 is not counted twice.
        """
        while True:
            magnitude = self.geometric(scale)
            negative = self.randbits(1) == 1
            if negative and magnitude == 0:
                continue
            return -magnitude if negative else magnitude

    def discrete_laplace_many(self, scale: Fraction, count: int) -> npt.NDArray[np.int64]:
        """``count`` independent ``discrete_laplace(scale)`` draws (a loop: same exact law)."""
        return np.fromiter((self.discrete_laplace(scale) for _ in range(count)), dtype=np.int64, count=count)

    def polya_many(self, nonzero: Fraction, shares: int, count: int) -> npt.NDArray[np.int64]:
        """``count`` exact draws of NB(1/shares, a) with a = 1 - (1 - nonzero)**shares.

        ``shares`` such draws add up to a geometric (P[k] = (1 - a) a^k; Polya infinite
        divisibility), so two sums differ by a discrete Laplace. A draw is 0 w.p. exactly
        1 - nonzero (one vectorised Bernoulli); the rare others come from ``_polya_positive``.
        """
        nonzero = Fraction(nonzero)
        if not 0 < nonzero < 1 or shares < 1:
            raise ValueError("need 0 < nonzero < 1 and shares >= 1")
        out = np.zeros(count, dtype=np.int64)
        hits = np.flatnonzero(self.bernoulli_array(nonzero, count))
        if hits.size:
            low, high = _polya_table(nonzero, shares)
            for index in hits:
                out[index] = self._polya_positive_fast(nonzero, shares, low, high)
        return out

    def _polya_positive_fast(self, nonzero: Fraction, shares: int, low: list[int], high: list[int]) -> int:
        """``_polya_positive`` decided from 64 bits of U and a cached table when that is certain.

        low[k-1] <= 2^64 F_k <= high[k-1] (F_k the cumulative law given >= 1): U < F_k is certain
        when w + 1 <= low[k-1], U >= F_k when w >= high[k-1]. Otherwise (probability about
        2^-60) the exact routine continues with the same 64 bits, so the law is unchanged.
        """
        word = self.randbits(64)
        k = bisect.bisect_left(low, word + 1) + 1  # first k with low[k-1] >= w + 1
        if k <= len(low) and bisect.bisect_right(high, word) >= k - 1:
            return k
        return self._polya_positive(nonzero, shares, word)

    def _polya_positive(self, nonzero: Fraction, shares: int, word: int | None = None) -> int:
        """K given K >= 1, K ~ NB(1/shares, a): inversion of an exact uniform, a bracketed lazily.

        P[K = k | K >= 1] = (1 - nonzero) / nonzero * c_k a^k, c_k = prod_{j<k} (1/shares + j)/(j + 1).
        The cumulative sums rise with a, so brackets of a bracket them; U's bits and a's precision
        are refined until every comparison is certain: the result is the exact inversion of U.
        """
        scale = (1 - nonzero) / nonzero
        shape = Fraction(1, shares)
        bits = 64
        word = self.randbits(64) if word is None else word
        precision = 128
        while True:
            low_a, high_a = polya_alpha_bounds(nonzero, shares, precision)
            u_low, u_high = Fraction(word, 1 << bits), Fraction(word + 1, 1 << bits)
            k, coefficient = 1, shape
            term_low, term_high = low_a, high_a  # c_k a^k at both ends
            cum_low = cum_high = Fraction(0)
            while True:
                cum_low += coefficient * term_low
                cum_high += coefficient * term_high
                if u_high <= scale * cum_low:
                    return k  # U < F_k for certain (and U >= F_{k-1} was certain)
                if u_low < scale * cum_high:
                    break  # undecided: refine U and a
                coefficient *= (shape + k) / (k + 1)
                term_low *= low_a
                term_high *= high_a
                k += 1
            word = (word << 64) | self.randbits(64)
            bits += 64
            precision *= 2

    def permutation(self, count: int) -> npt.NDArray[np.int64]:
        """A uniformly random permutation of range(count).

        Sorts by independent 64-bit keys; if any two keys collide the keys are drawn again, so
        every permutation has exactly equal probability.
        """
        if count < 0:
            raise ValueError("count must be non-negative")
        while True:
            keys = self.uint64_array(count)
            order = np.argsort(keys, kind="stable")
            sorted_keys = keys[order]
            if count < 2 or not bool(np.any(sorted_keys[1:] == sorted_keys[:-1])):
                return order.astype(np.int64)


def polya_alpha_bounds(nonzero: Fraction, shares: int, precision: int) -> tuple[Fraction, Fraction]:
    """Rationals lo <= a <= hi, a = 1 - (1 - nonzero)**shares, to about 2**-precision relative.

    Repeated squaring with every product rounded down (for the lower power) or up (upper), so
    no huge exact power (shares may be 10**6) is ever formed.
    """
    base = 1 - Fraction(nonzero)
    one = 1 << precision
    base_low = (base.numerator << precision) // base.denominator
    base_high = -((-base.numerator << precision) // base.denominator)
    power_low = power_high = one
    exponent = shares
    while exponent:
        if exponent & 1:
            power_low = (power_low * base_low) >> precision
            power_high = -((-power_high * base_high) >> precision)
        exponent >>= 1
        if exponent:
            base_low = (base_low * base_low) >> precision
            base_high = -((-base_high * base_high) >> precision)
    return Fraction(one - min(power_high, one), one), Fraction(one - power_low, one)


@functools.lru_cache(maxsize=32)
def _polya_table(nonzero: Fraction, shares: int) -> tuple[list[int], list[int]]:
    """Integers bracketing 2^64 F_k (cumulative law of a Polya draw given >= 1) for k = 1, 2, ...

    Built from a's bracket at 128 bits; the list stops once the lower end is within 2^-20 of 1
    (later k go to the exact routine).
    """
    scale = (1 - nonzero) / nonzero
    shape = Fraction(1, shares)
    low_a, high_a = polya_alpha_bounds(nonzero, shares, 128)
    one = 1 << 64
    low: list[int] = []
    high: list[int] = []
    coefficient, term_low, term_high = shape, low_a, high_a
    cum_low = cum_high = Fraction(0)
    k = 1
    while k <= 10_000:
        cum_low += coefficient * term_low
        cum_high += coefficient * term_high
        low.append(math.floor(scale * cum_low * one))
        high.append(math.ceil(scale * cum_high * one))
        if low[-1] >= one - (one >> 20):
            break
        coefficient *= (shape + k) / (k + 1)
        term_low *= low_a
        term_high *= high_a
        k += 1
    return low, high


def polya_probability(k: int, nonzero: Fraction, shares: int) -> Fraction:
    """Exact P[K = k] for K ~ NB(1/shares, a), a = 1 - (1 - nonzero)**shares (tests, auditors)."""
    if k < 0:
        return Fraction(0)
    silent = 1 - Fraction(nonzero)
    a = 1 - silent**shares
    shape = Fraction(1, shares)
    coefficient = Fraction(1)
    for j in range(k):
        coefficient *= (shape + j) / (j + 1)
    return silent * coefficient * a**k


_default = Csprng()


def _reseed_all_after_fork() -> None:
    for rng in list(_UNKEYED):
        rng.reseed_after_fork()


os.register_at_fork(after_in_child=_reseed_all_after_fork)


def default_rng() -> Csprng:
    """The process-wide CSPRNG used by every production randomiser and by the shuffle."""
    return _default
