"""Balcer & Cheu (ITC 2020) shuffle-model histogram: error independent of the domain size.

Each device sends its bucket x and, for EVERY bucket j (its own included), one extra "noise"
message j with probability p (close to 1), plus one constant presence message, so the aggregator
knows n. The probability of NOT sending a noise message, 1 - p, is the smallest whose exact
two-bucket profile (``amplification.protocols.balcer_cheu_exact_delta``) meets the central target at
expected_n; the paper's 1 - p = 50 ln(2/delta_b) / (eps_b^2 n) is about 70x larger than needed
and its theorem is kept as a cross-check (``theorem_guarantee``). Expected messages
per device: 1 + d p + 1, about d + 2 for large d. Analyser (the paper's): with c_j the count of
messages j, x_j = c_j - p n if c_j > n, else 0; an empty bucket has c_j <= n always, so it is
estimated as exactly 0. See docs/mechanisms/balcer_cheu_histogram.md for bias and variance.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING

from deniable.core.amplification._binomial import FloatArray, chernoff_window, pmf_run
from deniable.core.amplification.protocols import (
    GRID,
    GRID_BITS,
    balcer_cheu_exact_delta,
    balcer_cheu_exact_gamma,
    balcer_cheu_exact_guarantee,
    balcer_cheu_guarantee,
)
from deniable.core.amplification.shuffle import AmplificationBound
from deniable.core.mechanisms.base import Estimate, LocalRandomiser, Tally
from deniable.core.mechanisms.exact import z_score
from deniable.core.mechanisms.sample_threshold import (
    DEFAULT_DELTA,
    int_param,
    pack_many,
    packed_estimates,
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

MAX_BUCKETS = 4096
MAX_EXACT_BUCKETS = 12  # output_distribution enumerates 2**d noise patterns
_LOG_TAIL = 50.0


@functools.lru_cache(maxsize=64)
def _skip_count_sums(n: int, gamma: float) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For N' ~ Bin(n, gamma) (skipped noise messages) on its window [lo, hi]: prefix sums of
    P, (n gamma - N') P and (n gamma - N')^2 P below each k, and the upper tails P[N' >= k]."""
    lo, hi, _ = chernoff_window(n, gamma, _LOG_TAIL)
    k = np.arange(lo, hi + 1, dtype=np.float64)
    pmf = pmf_run(lo, hi - lo + 1, n, gamma)
    centred = n * gamma - k
    prefix = [np.concatenate(([0.0], np.cumsum(w))) for w in (pmf, centred * pmf, centred**2 * pmf)]
    upper = np.concatenate((np.cumsum(pmf[::-1])[::-1], [0.0]))
    return lo, prefix[0], prefix[1], prefix[2], upper


class BalcerCheuHistogram(LocalRandomiser):
    """Own bucket, a noise message per bucket w.p. p, a presence message; analyser c_j - p n if c_j > n."""

    name = "balcer_cheu_histogram"
    proto = pb.BALCER_CHEU_HISTOGRAM
    summary = "Balcer-Cheu 2020 histogram: own bucket + each bucket w.p. p (1-p from the exact profile)"
    multi_message = True
    local_privacy = False

    def __init__(
        self,
        epsilon0: float,
        domain_size: int,
        expected_n: float = 0.0,
        delta: float = DEFAULT_DELTA,
        skip_probability: float | None = None,
    ) -> None:
        """epsilon0: central target at expected_n; ``skip_probability`` (1 - p) skips the search."""
        super().__init__(epsilon0, domain_size)
        if domain_size > MAX_BUCKETS:
            raise ValueError(f"balcer_cheu_histogram supports at most {MAX_BUCKETS} buckets")
        self.expected_n = int_param(expected_n, "expected_n", 1, 1 << 40)
        self.delta = probability_param(delta, "delta")
        if skip_probability is None:
            numerator = balcer_cheu_exact_gamma(self.epsilon0, self.delta, self.expected_n)
        else:
            gamma = Fraction(float(skip_probability))
            if not 0 < gamma <= Fraction(1, 2):
                raise ValueError(f"skip_probability (1 - p) must lie in (0, 1/2], got {skip_probability!r}")
            numerator = -((-gamma.numerator * GRID) // gamma.denominator)
        self.skip = Fraction(numerator, GRID)  # 1 - p: probability of NOT sending a noise message
        self.send = 1 - self.skip  # p
        self._skip_threshold = numerator  # send noise message j iff a 52-bit draw >= numerator

    def parameters(self) -> dict[str, float]:
        return {
            "expected_n": float(self.expected_n),
            "delta": self.delta,
            "skip_probability": float(self.skip),
        }

    def central_guarantee(self, n: int, delta: float) -> AmplificationBound:
        """Smallest eps of the exact two-bucket profile at the real n for the fixed 1 - p."""
        return balcer_cheu_exact_guarantee(self.skip, int(n), delta)

    def theorem_guarantee(self, n: int, delta: float) -> AmplificationBound:
        """Balcer-Cheu's theorem at the real n (a cross-check; not applicable outside its range)."""
        return balcer_cheu_guarantee(self.skip, n, delta)

    def privacy_profile(self, n: int, epsilon: float) -> float:
        """Exact delta(eps) of the two changed buckets' shuffled counts at the real n."""
        return balcer_cheu_exact_delta(self.skip, int(n), epsilon)

    @property
    def presence(self) -> int:
        """The message value every device sends exactly once."""
        return self.domain_size

    @property
    def expected_messages(self) -> float:
        """1 (own bucket) + d p (noise) + 1 (presence) messages per device on average."""
        return 2 + self.domain_size * float(self.send)

    @property
    def max_messages_per_device(self) -> int:
        """Own bucket, a noise message for every bucket, presence: d + 2 at most."""
        return self.domain_size + 2

    @property
    def payload_length(self) -> int:
        return width_for(self.domain_size)

    @property
    def count_cells(self) -> int:
        return self.domain_size + 1  # buckets, then presence

    def devices(self, counts: Sequence[int], messages: int) -> int:
        """The number of presence messages: one per device."""
        return int(counts[self.presence])

    def _message_counts(self, values: np.ndarray, rng: Csprng) -> np.ndarray:
        """Per device and bucket, how many messages j it sends (own bucket + Bernoulli(p) noise)."""
        d = self.domain_size
        draws = rng.uint64_array(values.size * d).reshape(values.size, d) >> np.uint64(64 - GRID_BITS)
        counts = (draws >= np.uint64(self._skip_threshold)).astype(np.int64)
        counts[np.arange(values.size), values] += 1
        return counts

    def _payloads(self, counts: np.ndarray) -> list[bytes]:
        """Messages in ascending value order (the presence message last), back to back."""
        d, width = self.domain_size, self.payload_length
        with_presence = np.concatenate((counts, np.ones((counts.shape[0], 1), dtype=np.int64)), axis=1)
        flat = pack_many(np.repeat(np.tile(np.arange(d + 1), counts.shape[0]), with_presence.ravel()), width)
        ends = np.cumsum(with_presence.sum(axis=1))
        starts = np.concatenate(([0], ends[:-1]))
        return [b"".join(flat[s:e]) for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]

    def randomise(self, value: int, rng: Csprng | None = None) -> bytes:
        self.check_value(value)
        return self._payloads(self._message_counts(np.array([int(value)]), rng or default_rng()))[0]

    def randomise_many(self, values: Sequence[int], rng: Csprng | None = None) -> list[bytes]:
        array = self.checked_values(values)
        return self._payloads(self._message_counts(array, rng or default_rng())) if array.size else []

    def output_distribution(self, value: int) -> dict[bytes, Fraction]:
        self.check_value(value)
        d = self.domain_size
        if d > MAX_EXACT_BUCKETS:
            raise ValueError(f"the exact law enumerates 2**d payloads: d <= {MAX_EXACT_BUCKETS} only")
        law: dict[bytes, Fraction] = {}
        for pattern in itertools.product((0, 1), repeat=d):
            counts = np.array([pattern], dtype=np.int64)
            counts[0, int(value)] += 1
            sent = sum(pattern)
            law[self._payloads(counts)[0]] = self.send**sent * self.skip ** (d - sent)
        return law

    def tally(self, payloads: Sequence[bytes]) -> Tally:
        values, bad_length = unpack_many(payloads, self.payload_length)
        invalid = bad_length | (values > self.presence)
        counts = np.bincount(values[~invalid], minlength=self.count_cells).astype(np.int64)
        return Tally(counts=counts, invalid=invalid)

    # ----------------------------------------------------------------------- estimator

    def _moments(self, true_counts: Sequence[float] | FloatArray, n: int) -> tuple[FloatArray, ...]:
        """(T0, 1 - T0, T1, T2) at k = ceil(x): T0 = P[N' < k], T1, T2 = E[(n gamma - N')^r 1{N' < k}]."""
        lo, p0, p1, p2, upper = _skip_count_sums(int(n), float(self.skip))
        k = np.ceil(np.clip(np.asarray(true_counts, dtype=np.float64), 0, None)).astype(np.int64)
        index = np.clip(k - lo, 0, p0.size - 1)
        return p0[index], upper[index], p1[index], p2[index]

    def bias(self, true_counts: Sequence[float] | FloatArray, n: int) -> FloatArray:
        """E[estimate] - x = -x P[N' >= x] + E[(n gamma - N') 1{N' < x}], N' ~ Bin(n, 1 - p)."""
        x = np.asarray(true_counts, dtype=np.float64)
        _, above, t1, _ = self._moments(x, n)
        return np.asarray(-x * above + t1, dtype=np.float64)

    def variance(self, true_counts: Sequence[float] | FloatArray, n: int) -> FloatArray:
        """Exact Var[(x + n gamma - N') 1{N' < x}], N' ~ Bin(n, gamma) the skipped noise messages."""
        x = np.asarray(true_counts, dtype=np.float64)
        t0, above, t1, t2 = self._moments(x, n)
        var = x * x * t0 * above + 2 * x * t1 * above + t2 - t1 * t1
        return np.asarray(np.clip(var, 0.0, None), dtype=np.float64)

    def manipulation_at(self, counts: Sequence[int], n: int, fakes: int) -> tuple[FloatArray, FloatArray]:
        """m fake devices send at most M = m (d + 2) messages, each sealed apart, so any mix of valid
        values. x_j = c_j - p n if c_j > n else 0 grows with c_j and falls with n: raise with all M
        on bucket j, lower with all M presence messages (exact at these counts, not linear in m)."""
        raw = np.asarray(counts[: self.domain_size], dtype=np.float64)
        most = fakes * self.max_messages_per_device
        send = float(self.send)

        def analyser(c: FloatArray, devices: int) -> FloatArray:
            return np.asarray(np.where(c > devices, c - send * devices, 0.0), dtype=np.float64)

        now = analyser(raw, n)
        return analyser(raw + most, n) - now, now - analyser(raw, n + most)

    def suppressed_upper(self, n: int, confidence: float) -> int:
        """Smallest u with P[N' >= u] <= (1 - confidence)/2: truths above it are rarely zeroed."""
        lo, _, _, _, upper = _skip_count_sums(int(n), float(self.skip))
        return int(lo + np.argmax(upper <= (1 - confidence) / 2))

    def estimate(self, counts: Sequence[int], n: int, confidence: float = 0.95) -> list[Estimate]:
        """The paper's analyser: c_j - p n if c_j > n else 0 (then the interval [0, u]).

        A zeroed bucket misses only if x > u and N' >= x (prob. <= (1 - confidence)/2); sd at x = u.
        """
        if len(counts) != self.count_cells:
            raise ValueError(f"expected {self.count_cells} counts, got {len(counts)}")
        if n < 1:
            raise ValueError("the Balcer-Cheu analyser needs n >= 1 devices")
        raw = np.asarray(counts[: self.domain_size], dtype=np.int64)
        kept = raw > n
        estimates = np.where(kept, raw - float(self.send) * n, 0.0)
        z = z_score(confidence)
        u = float(self.suppressed_upper(n, confidence))
        plug_in = np.where(kept, np.clip(estimates, 0, n), u)
        std_errors = np.sqrt(self.variance(plug_in, n))
        lows = np.where(kept, estimates - z * std_errors, 0.0)
        highs = np.where(kept, estimates + z * std_errors, u)
        return packed_estimates(raw.tolist(), estimates, std_errors, lows, highs)
