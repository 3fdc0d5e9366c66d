"""Optimised local hashing (OLH, Wang, Blocki, Li, Jha, USENIX Security 2017).

Each device draws a public seed s uniformly from a finite pool, hashes its value v to
y = h_s(v) in [g], and applies k-ary RR over [g] to y (exact integer weights, as ``grr``). The
pool is the projective linear family over GF(g), g a prime power: h_a(v) = <a, digits_g(v)> for
one representative a of every line through 0 in GF(g)^r, g^r >= d. For every pair u != v the
fraction of seeds on which they collide is exactly kappa = (g^(r-1) - 1) / (g^r - 1), so the
support-count estimator is exactly unbiased and its variance (truth-dependent term included) is
exact. Aggregation: an S x g table of (seed, bucket) counts, then sum_s table[s, h_s(v)] in
O(S d) numpy work, S = (g^r - 1) / (g - 1) < 2 d. See docs/mechanisms/olh.md.
"""

from __future__ import annotations

import functools
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
from deniable.core.mechanisms.exact import exp_lower_bound
from deniable.core.rng import Csprng, default_rng
from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
else:
    from deniable.core.lazy import numpy as np
    from deniable.core.lazy import numpy_typing as npt

OTHER_WEIGHT = 1 << 40  # weight of each non-kept bucket in the k-ary RR step (as grr)
MAX_BUCKETS = 1 << 16  # g: the bucket fits in two bytes
MAX_TOTAL_WEIGHT = 1 << 62  # randbelow_array's limit: epsilon0 up to about 15
MAX_AGGREGATION_WORK = 1 << 28  # S * d hash evaluations per estimate
MAX_EXACT_OUTPUTS = 1 << 16  # output_distribution enumerates S * g payloads
TABLE_ENTRIES = 1 << 22  # S * d up to which h_s(v) is kept as a table (uint16, 8 MiB)
_CHUNK = 1 << 21  # hash evaluations per numpy block when there is no table


def prime_power(n: int) -> tuple[int, int] | None:
    """(p, k) with n = p**k for a prime p, or None."""
    if n < 2:
        return None
    p = next((f for f in range(2, math.isqrt(n) + 1) if n % f == 0), n)
    k = 0
    while n % p == 0:
        n //= p
        k += 1
    return (p, k) if n == 1 else None


def nearest_prime_power(target: float) -> int:
    """The prime power closest to ``target`` (the smaller one on a tie), at least 2."""
    below = max(2, math.floor(target))
    while below > 2 and prime_power(below) is None:
        below -= 1
    above = max(2, math.ceil(target))
    while prime_power(above) is None:
        above += 1
    return below if target - below <= above - target else above


def least_prime_power_at_least(n: int) -> int:
    """Smallest prime power >= n (and >= 2)."""
    m = max(2, n)
    while prime_power(m) is None:
        m += 1
    return m


def _poly_mul_mod(a: list[int], b: list[int], coeffs: list[int], p: int) -> list[int]:
    """a * b mod (x^k + sum coeffs[i] x^i) over GF(p), polynomials as k coefficient lists."""
    k = len(coeffs)
    product = [0] * (2 * k - 1)
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            product[i + j] += x * y
    for top in range(2 * k - 2, k - 1, -1):
        c = product[top] % p
        for j in range(k):
            product[top - k + j] -= c * coeffs[j]
    return [c % p for c in product[:k]]


def _x_is_primitive(coeffs: list[int], p: int) -> bool:
    """True if x has order p^k - 1 modulo the monic polynomial (which is then primitive)."""
    k = len(coeffs)
    order = p**k - 1
    one = [1] + [0] * (k - 1)

    def power(exponent: int) -> list[int]:
        result, base = one, [0, 1] + [0] * (k - 2)
        while exponent:
            if exponent & 1:
                result = _poly_mul_mod(result, base, coeffs, p)
            base = _poly_mul_mod(base, base, coeffs, p)
            exponent >>= 1
        return result

    if power(order) != one:
        return False
    rest, factor = order, 2
    while rest > 1:
        if factor * factor > rest:
            factor = rest
        if rest % factor == 0:
            if power(order // factor) == one:
                return False
            while rest % factor == 0:
                rest //= factor
        factor += 1
    return True


@functools.lru_cache(maxsize=16)
def _exp_log_tables(p: int, k: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Power and log tables of GF(p**k) (k >= 2) from the first primitive polynomial found.

    Elements are integers whose base-p digits are polynomial coefficients. ``exp`` is extended
    with zeros and log(0) = 2q - 2, so mul(a, b) = exp[log a + log b] needs no branch on zero.
    """
    q = p**k
    for low in range(1, q):
        coeffs = [(low // p**i) % p for i in range(k)]  # x^k = -sum coeffs[i] x^i
        if coeffs[0] != 0 and _x_is_primitive(coeffs, p):
            break
    else:  # pragma: no cover - primitive polynomials exist for every prime power
        raise AssertionError(f"no primitive polynomial of degree {k} over GF({p})")
    weights = [p**i for i in range(k)]
    digits = [1] + [0] * (k - 1)
    powers: list[int] = []
    for _ in range(q - 1):
        powers.append(sum(c * w for c, w in zip(digits, weights, strict=True)))
        top = digits[-1]
        digits = [(c - top * f) % p for c, f in zip([0, *digits[:-1]], coeffs, strict=True)]
    log = [0] * q
    log[0] = 2 * q - 2
    for t, e in enumerate(powers):
        log[e] = t
    return tuple(powers * 2 + [0] * (2 * q - 1)), tuple(log)


class GaloisField:
    """GF(q), q = p**k, on the integers 0..q-1; scalar and numpy operations, no data branches."""

    def __init__(self, q: int) -> None:
        factors = prime_power(q)
        if factors is None:
            raise ValueError(f"GF({q}) does not exist: {q} is not a prime power")
        self.p, self.k = factors
        self.q = q
        if self.k > 1:
            exp, log = _exp_log_tables(self.p, self.k)
            self._exp, self._log = exp, log

    @functools.cached_property
    def _exp_array(self) -> IntArray:
        """The exponent table for the vectorised paths (built on first use, not on the device)."""
        return np.array(self._exp, dtype=np.int64)

    @functools.cached_property
    def _log_array(self) -> IntArray:
        """The logarithm table for the vectorised paths (built on first use, not on the device)."""
        return np.array(self._log, dtype=np.int64)

    def add(self, a: int, b: int) -> int:
        """a + b in GF(q)."""
        if self.k == 1:
            return (a + b) % self.p
        if self.p == 2:
            return a ^ b
        total, scale = 0, 1
        for _ in range(self.k):
            total += ((a // scale + b // scale) % self.p) * scale
            scale *= self.p
        return total

    def mul(self, a: int, b: int) -> int:
        """a * b in GF(q)."""
        if self.k == 1:
            return (a * b) % self.p
        return self._exp[self._log[a] + self._log[b]]

    def add_array(self, a: IntArray, b: IntArray) -> IntArray:
        """Elementwise (broadcast) a + b in GF(q)."""
        if self.k == 1:
            return (a + b) % self.p
        if self.p == 2:
            return a ^ b
        total = np.zeros(np.broadcast_shapes(a.shape, b.shape), dtype=np.int64)
        scale = 1
        for _ in range(self.k):
            total += ((a // scale + b // scale) % self.p) * scale
            scale *= self.p
        return total

    def mul_array(self, a: IntArray, b: IntArray) -> IntArray:
        """Elementwise (broadcast) a * b in GF(q)."""
        if self.k == 1:
            return (a * b) % self.p
        product: IntArray = self._exp_array[self._log_array[a] + self._log_array[b]]
        return product


class LinearHashFamily:
    """The projective linear family over GF(g) on [d]: h_a(v) = <a, base-g digits of v>.

    Seeds are one representative a of every line through 0 in GF(g)^r (g^r >= d): leading
    coefficient a_j = 1, a_i free for i < j, a_i = 0 for i > j. Any two values collide on exactly
    a fraction (g^(r-1) - 1) / (g^r - 1) of the seeds (a hyperplane's share of the lines).
    """

    def __init__(self, g: int, domain_size: int) -> None:
        self.g = g
        self.domain_size = domain_size
        self.field = GaloisField(g)
        powers = [1]  # g**0, g**1, ..., g**r with g**r >= d > g**(r - 1)
        while powers[-1] < domain_size:
            powers.append(powers[-1] * g)
        if len(powers) == 1:
            powers.append(g)
        self.powers = tuple(powers)
        self.digits = r = len(powers) - 1
        self.offsets = tuple((power - 1) // (g - 1) for power in powers)
        self.seeds = self.offsets[r]
        self.collision_probability = Fraction(powers[r - 1] - 1, powers[r] - 1)
        self._table: npt.NDArray[np.uint16] | None = None

    def seed_parts(self, seed: int) -> tuple[int, int]:
        """Leading position j and the index of the free coefficients a_0..a_{j-1} of a seed."""
        lead = sum(1 for offset in self.offsets[1:-1] if offset <= seed)
        return lead, seed - self.offsets[lead]

    def hash_value(self, seed: int, value: int) -> int:
        """h_seed(value) over GF(g); the same r steps for every value."""
        field, g = self.field, self.g
        lead, low = self.seed_parts(seed)
        acc = (value // self.powers[lead]) % g  # a_lead = 1
        for power in self.powers[:-1]:
            acc = field.add(acc, field.mul((low // power) % g, (value // power) % g))
        return acc

    def hash_array(self, seeds: IntArray, values: IntArray) -> IntArray:
        """h_seed(value) for broadcast arrays of seeds and values (the numpy twin of ``hash_value``)."""
        field, g = self.field, self.g
        offsets = np.array(self.offsets, dtype=np.int64)
        lead = np.searchsorted(offsets[1:-1], seeds, side="right").astype(np.int64)
        low = seeds - offsets[lead]
        acc = (values // np.array(self.powers, dtype=np.int64)[lead]) % g
        for power in self.powers[:-1]:
            acc = field.add_array(acc, field.mul_array((low // power) % g, (values // power) % g))
        return acc

    def table(self) -> npt.NDArray[np.uint16] | None:
        """The S x d table of h_s(v), built once, if it has at most ``TABLE_ENTRIES`` entries."""
        if self._table is None and self.seeds * self.domain_size <= TABLE_ENTRIES:
            seeds = np.arange(self.seeds, dtype=np.int64)[:, None]
            values = np.arange(self.domain_size, dtype=np.int64)[None, :]
            self._table = self.hash_array(seeds, values).astype(np.uint16)
        return self._table

    def lookup(self, seeds: IntArray, values: IntArray) -> IntArray:
        """h_seed(value) elementwise: a gather from the table when there is one."""
        table = self.table()
        if table is None:
            return self.hash_array(seeds, values)
        return table[seeds, values].astype(np.int64)


@functools.lru_cache(maxsize=8)
def hash_family(g: int, domain_size: int) -> LinearHashFamily:
    """The (shared, cached) hash family for g buckets on a domain of ``domain_size`` values."""
    return LinearHashFamily(g, domain_size)


def _check_integer(name: str, value: float) -> int:
    """An integer parameter that may arrive as a float (campaign params are doubles)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return int(value)


def default_buckets(epsilon0: float, domain_size: int) -> int:
    """The prime power nearest e^eps0 + 1 (Wang et al.'s optimum), capped where hashing stops paying.

    The cap is the least prime power >= the domain size (there OLH is k-ary RR) and 2**16.
    """
    target = math.exp(epsilon0) + 1 if epsilon0 < 50 else math.inf
    cap = min(least_prime_power_at_least(domain_size), MAX_BUCKETS)
    return nearest_prime_power(min(target, cap))


class OptimisedLocalHashing(LocalRandomiser):
    """OLH: a public seed from the projective linear family over GF(g), then k-ary RR over [g]."""

    name = "olh"
    proto = pb.OLH
    summary = "optimised local hashing: hash to g buckets with a public seed, then k-ary RR on the bucket"

    def __init__(self, epsilon0: float, domain_size: int, g: float | None = None) -> None:
        super().__init__(epsilon0, domain_size)
        buckets = default_buckets(self.epsilon0, self.domain_size) if g is None else _check_integer("g", g)
        if not 2 <= buckets <= MAX_BUCKETS:
            raise ValueError(f"olh needs 2 <= g <= {MAX_BUCKETS}, got {buckets}")
        if prime_power(buckets) is None:
            lower = nearest_prime_power(buckets - 0.5)
            upper = least_prime_power_at_least(buckets)
            raise ValueError(
                f"olh needs g to be a prime power (its hash family is linear over GF(g)); "
                f"got {buckets}, nearest {lower} or {upper}"
            )
        self.g = buckets
        self.family = hash_family(buckets, self.domain_size)
        self.seeds = self.family.seeds
        if self.seeds * self.domain_size > MAX_AGGREGATION_WORK:
            raise ValueError(
                f"olh aggregation needs S * d = {self.seeds * self.domain_size} hash evaluations "
                f"(S = {self.seeds} seeds); at most {MAX_AGGREGATION_WORK}: use a larger g or "
                "hadamard_response"
            )
        self.collision_probability = self.family.collision_probability

        self._keep_weight = math.floor(exp_lower_bound(self.epsilon0) * OTHER_WEIGHT)
        self._total_weight = self._keep_weight + (buckets - 1) * OTHER_WEIGHT
        if self._total_weight > MAX_TOTAL_WEIGHT:
            raise ValueError(f"epsilon0 = {epsilon0} is too large for olh (e^eps0 * 2**40 > 2**62)")
        self.keep_probability = Fraction(self._keep_weight, self._total_weight)
        self.other_probability = Fraction(OTHER_WEIGHT, self._total_weight)
        # P(a report supports v | the device holds u != v): kept on a collision, or hit by noise.
        kappa = self.collision_probability
        self.support_probability = (
            self.other_probability + (self.keep_probability - self.other_probability) * kappa
        )
        self._seed_bytes = max(1, ((self.seeds - 1).bit_length() + 7) // 8)
        self._bucket_bytes = max(1, ((buckets - 1).bit_length() + 7) // 8)

    # ------------------------------------------------------------------ payload and hashing

    @property
    def payload_length(self) -> int:
        return self._seed_bytes + self._bucket_bytes

    @property
    def count_cells(self) -> int:
        return self.seeds * self.g

    def parameters(self) -> dict[str, float]:
        return {"g": float(self.g)}

    def pack(self, seed: int, bucket: int) -> bytes:
        """Payload bytes: the seed index, then the reported bucket, both big-endian."""
        return seed.to_bytes(self._seed_bytes, "big") + bucket.to_bytes(self._bucket_bytes, "big")

    def hash_value(self, seed: int, value: int) -> int:
        """h_seed(value), the bucket a device holding ``value`` randomises under ``seed``."""
        return self.family.hash_value(seed, value)

    # ------------------------------------------------------------------ device side

    def randomise(self, value: int, rng: Csprng | None = None) -> bytes:
        self.check_value(value)
        value = int(value)
        rng = rng or default_rng()
        seed = rng.randbelow(self.seeds)
        draw = rng.randbelow(self._total_weight)
        bucket = self.hash_value(seed, value)
        keep = int(draw < self._keep_weight)
        # Both candidates every time; the choice is arithmetic, not a branch (as grr).
        other_index = max(draw - self._keep_weight, 0) // OTHER_WEIGHT
        other = other_index + int(other_index >= bucket)
        return self.pack(seed, keep * bucket + (1 - keep) * other)

    def randomise_many(self, values: Sequence[int], rng: Csprng | None = None) -> list[bytes]:
        array = self.checked_values(values)
        n = int(array.size)
        if n == 0:
            return []
        rng = rng or default_rng()
        seeds = rng.randbelow_array(self.seeds, n)
        draws = rng.randbelow_array(self._total_weight, n)
        bucket = self.family.lookup(seeds, array)
        keep = (draws < self._keep_weight).astype(np.int64)
        other_index = np.maximum(draws - self._keep_weight, 0) // OTHER_WEIGHT
        other = other_index + (other_index >= bucket)
        chosen = keep * bucket + (1 - keep) * other
        rows = np.empty((n, self.payload_length), dtype=np.uint8)
        for c in range(self._seed_bytes):
            rows[:, c] = (seeds >> (8 * (self._seed_bytes - 1 - c))) & 0xFF
        for c in range(self._bucket_bytes):
            rows[:, self._seed_bytes + c] = (chosen >> (8 * (self._bucket_bytes - 1 - c))) & 0xFF
        return split_rows(rows)

    # ------------------------------------------------------------------ auditors

    def output_distribution(self, value: int) -> dict[bytes, Fraction]:
        self.check_value(value)
        if self.count_cells > MAX_EXACT_OUTPUTS:
            raise ValueError(
                f"exact law has S * g = {self.count_cells} outputs; enumerated up to {MAX_EXACT_OUTPUTS}"
            )
        law: dict[bytes, Fraction] = {}
        for seed in range(self.seeds):
            hashed = self.hash_value(seed, int(value))
            for bucket in range(self.g):
                p = self.keep_probability if bucket == hashed else self.other_probability
                law[self.pack(seed, bucket)] = p / self.seeds
        return law

    @property
    def realised_epsilon(self) -> float:
        """ln(keep / other weight): attained, since some seed separates any two values (kappa < 1)."""
        return math.log(self._keep_weight) - math.log(OTHER_WEIGHT)

    # ------------------------------------------------------------------ aggregator side

    def tally(self, payloads: Sequence[bytes]) -> Tally:
        width = self.payload_length
        n = len(payloads)
        matrix, lengths_ok = payload_matrix(payloads, width)
        seeds = big_endian(matrix, 0, self._seed_bytes)
        buckets = np.zeros(n, dtype=np.int64)
        for column in range(self._seed_bytes, width):
            buckets = buckets * 256 + matrix[:, column]
        invalid = ~lengths_ok | (seeds >= self.seeds) | (buckets >= self.g)
        cells = seeds[~invalid] * self.g + buckets[~invalid]
        counts = np.bincount(cells, minlength=self.count_cells).astype(np.int64)
        return Tally(counts=counts, invalid=invalid)

    def support_counts(self, counts: Sequence[int] | IntArray) -> IntArray:
        """C_v = number of reports (s, y) with h_s(v) = y, for every v: sum_s table[s, h_s(v)]."""
        table = np.asarray(counts, dtype=np.int64)
        if table.shape != (self.count_cells,):
            raise ValueError(f"expected {self.count_cells} counts, got {table.shape}")
        table = table.reshape(self.seeds, self.g)
        hashes = self.family.table()
        if hashes is not None:
            gathered: IntArray = np.take_along_axis(table, hashes.astype(np.intp), axis=1)
            total: IntArray = gathered.sum(axis=0, dtype=np.int64)
            return total
        values = np.arange(self.domain_size, dtype=np.int64)
        support = np.zeros(self.domain_size, dtype=np.int64)
        block = max(1, _CHUNK // self.domain_size)
        for start in range(0, self.seeds, block):
            seeds = np.arange(start, min(start + block, self.seeds), dtype=np.int64)
            hashed = self.family.hash_array(seeds[:, None], values[None, :])
            support += np.take_along_axis(table[seeds], hashed, axis=1).sum(axis=0)
        return support

    def manipulation_per_report(self) -> tuple[FloatArray, FloatArray]:
        """est_v = (C_v - n q) / (p - q), C_v the reports (s, y) with h_s(v) = y; a fake (s, y) supports
        v or not at will (g >= 2): raise (1 - q)/(p - q), lower q/(p - q)."""
        p, q = float(self.keep_probability), float(self.support_probability)
        return support_shift(self.domain_size, q, p - q)

    def estimate(self, counts: Sequence[int], n: int, confidence: float = 0.95) -> list[Estimate]:
        if len(counts) != self.count_cells:
            raise ValueError(f"expected {self.count_cells} counts, got {len(counts)}")
        support = self.support_counts(counts)
        p, q = float(self.keep_probability), float(self.support_probability)
        estimates = ((support - n * q) / (p - q)).astype(np.float64)
        plug_in = np.clip(estimates, 0.0, float(n))
        return normal_estimates(support.tolist(), estimates, self.variance(plug_in, n), confidence)

    def variance(self, true_counts: Sequence[float] | FloatArray, n: int) -> FloatArray:
        p, q = float(self.keep_probability), float(self.support_probability)
        truth = np.asarray(true_counts, dtype=np.float64)
        return n * q * (1 - q) / (p - q) ** 2 + truth * (1 - p - q) / (p - q)
