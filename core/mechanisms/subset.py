"""Subset selection: report omega of the d values, a set that contains the true one more often.

Wang, Wu, Hu (2016), "Mutual information optimal locally private discrete distribution
estimation"; Ye & Barg (2018), "Optimal schemes for discrete distribution estimation under locally
differential privacy". The device reports a uniform omega-subset containing its value v with
probability P_in = omega e^eps0 / (omega e^eps0 + d - omega), else a uniform omega-subset of the
other d - 1 values. Default omega = max(1, round(d / (e^eps0 + 1))); payload: the subset as a
d-bit bitmap (big-endian bit order, spare bits zero).

Proof of eps0-LDP, exactly. P(S | v) depends only on whether v is in S:
P_in / C(d-1, omega-1) if v in S, (1 - P_in) / C(d-1, omega) if not. For inputs v, w the ratio
P(S | v) / P(S | w) is 1 unless S holds exactly one of them, and then it is rho or 1 / rho with
rho = [P_in / C(d-1, omega-1)] / [(1 - P_in) / C(d-1, omega)] = P_in (d - omega) / ((1 - P_in) omega).
The code uses P_in = T / 2**64, T = floor(2**64 b omega / (b omega + d - omega)), b =
``exp_lower_bound(eps0)`` <= e**eps0. Then T (b omega + d - omega) <= 2**64 b omega, i.e.
T (d - omega) <= b omega (2**64 - T), i.e. rho <= b; the constructor also checks 1 / rho <= b (it
fails only for eps0 below about 2**-60). So every ratio is <= b <= e**eps0 for the float eps0 given.
P_in = T / 2**64 holds exactly because membership is decided by u < T for a uniform 64-bit u, and the
subsets are exactly uniform: the first k picks of a partial Fisher-Yates shuffle driven by exact
``randbelow`` draws are a uniform k-subset.

Constant work: omega picks are always drawn from the d - 1 "other" slots (slot i is the value
i + [i >= v]); when v is included it replaces the last pick, selected arithmetically, so the draws
and the work do not depend on v or on the inclusion.

Estimator: p* = P(j in S | v = j) = P_in and q* = P(j in S | v != j) =
(P_in (omega - 1) + (1 - P_in) omega) / (d - 1); membership of j is a Bernoulli per device, so the
shared bitmap estimator and its exact variance apply (``unary.BitmapOracle``). p* + (d - 1) q* =
omega makes the estimates sum to n exactly.
"""

from __future__ import annotations

import itertools
import math
import numbers
import operator
from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING

from deniable.core.mechanisms.exact import PROBABILITY_BITS, exp_lower_bound
from deniable.core.mechanisms.unary import SCALE, BitmapOracle
from deniable.core.rng import Csprng, default_rng
from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
else:
    from deniable.core.lazy import numpy as np
    from deniable.core.lazy import numpy_typing as npt


def default_subset_size(epsilon0: float, domain_size: int) -> int:
    """omega = max(1, round(d / (e^eps0 + 1))), the size that maximises utility (Wang et al. 2016)."""
    if epsilon0 > 700:  # e^eps0 overflows a float; d / (e^eps0 + 1) rounds to 0 anyway
        return 1
    return max(1, round(domain_size / (math.exp(epsilon0) + 1)))


class SubsetSelection(BitmapOracle):
    """Report omega values: a set holding the true one w.p. omega e^eps0 / (omega e^eps0 + d - omega)."""

    name = "subset_selection"
    proto = pb.SUBSET_SELECTION
    summary = "subset selection: a size-omega subset that holds the true value w.p. w e^eps0/(w e^eps0+d-w)"

    def __init__(self, epsilon0: float, domain_size: int, subset_size: float | None = None) -> None:
        super().__init__(epsilon0, domain_size)
        d = self.domain_size
        if subset_size is None:
            omega = default_subset_size(self.epsilon0, d)
        else:
            if isinstance(subset_size, bool) or not isinstance(subset_size, numbers.Real):
                raise ValueError(f"subset_size must be a number, got {subset_size!r}")
            if not (math.isfinite(subset_size) and float(subset_size).is_integer()):
                raise ValueError(f"subset_size must be an integer, got {subset_size!r}")
            omega = int(subset_size)
        if not 1 <= omega <= d - 1:
            raise ValueError(f"subset_size must lie in 1..{d - 1}, got {omega}")
        self.subset_size = omega
        bound = exp_lower_bound(self.epsilon0)
        self.include_threshold = math.floor(SCALE * bound * omega / (bound * omega + d - omega))
        if not 1 <= self.worst_ratio <= bound:  # rho >= 1 also bounds 1 / rho; fails for eps0 < ~2**-60
            raise ValueError(f"epsilon0 = {epsilon0!r} is too small for an exact 64-bit threshold")
        p_in = Fraction(self.include_threshold, SCALE)
        self.include_probability = p_in
        self._set_support(p_in, (p_in * (omega - 1) + (1 - p_in) * omega) / (d - 1))

    def parameters(self) -> dict[str, float]:
        return {"subset_size": float(self.subset_size)}

    @property
    def worst_ratio(self) -> Fraction:
        """rho = P(S | v) / P(S | w) for S holding v and not w: T (d - omega) / ((2**64 - T) omega)."""
        t, omega = self.include_threshold, self.subset_size
        return Fraction(t * (self.domain_size - omega), (SCALE - t) * omega)

    @property
    def realised_epsilon(self) -> float:
        rho = self.worst_ratio
        return math.log1p(float(max(rho, 1 / rho) - 1))  # accurate for ratios near 1 too

    def randomise(self, value: int, rng: Csprng | None = None) -> bytes:
        self.check_value(value)
        source = rng or default_rng()
        v, others, omega = operator.index(value), self.domain_size - 1, self.subset_size
        include = int(source.randbits(PROBABILITY_BITS) < self.include_threshold)
        moved: dict[int, int] = {}  # sparse partial Fisher-Yates over the d - 1 other slots
        picks = [0] * omega
        for j in range(omega):
            r = j + source.randbelow(others - j)
            picks[j] = moved.get(r, r)
            moved[r] = moved.get(j, j)
        # As ``_members`` in pure Python (no numpy on the device): slots mapped past v, the last
        # one swapped for v when included, by arithmetic selection.
        chosen = [pick + int(pick >= v) for pick in picks]
        chosen[-1] = include * v + (1 - include) * chosen[-1]
        return self._bitmap(chosen)

    def _members(
        self, picks: npt.NDArray[np.int64], values: npt.NDArray[np.int64], include: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.bool_]:
        """Bit matrix of the reported subsets: other slots mapped past v, the last one swapped for v
        when included (arithmetic selection, no branch on v or on the inclusion)."""
        n = picks.shape[0]
        chosen = picks + (picks >= values[:, None])
        chosen[:, -1] = include * values + (1 - include) * chosen[:, -1]
        bits = np.zeros((n, self.domain_size), dtype=np.bool_)
        bits[np.arange(n)[:, None], chosen] = True
        return bits

    def randomise_many(self, values: Sequence[int], rng: Csprng | None = None) -> list[bytes]:
        """Vectorised: the same law as ``randomise`` (64-bit inclusion draws, partial Fisher-Yates)."""
        checked = self.checked_values(values)
        source = rng or default_rng()
        others, omega = self.domain_size - 1, self.subset_size
        rows = self._rows_per_chunk()
        threshold = np.uint64(self.include_threshold)
        out: list[bytes] = []
        for start in range(0, len(checked), rows):
            chunk = checked[start : start + rows]
            m = len(chunk)
            include = (source.uint64_array(m) < threshold).astype(np.int64)
            slots = np.tile(np.arange(others, dtype=np.int32), m)  # row i at [i * others, (i + 1) * others)
            row_start = np.arange(m, dtype=np.int64) * others
            for j in range(omega):  # step j of every row's Fisher-Yates shuffle: swap slot j with slot r >= j
                here = row_start + j
                there = here + source.randbelow_array(others - j, m)
                taken = slots[there]
                slots[there] = slots[here]
                slots[here] = taken
            picks = slots.reshape(m, others)[:, :omega].astype(np.int64)
            out += self._payloads(self._members(picks, chunk, include))
        return out

    def _valid_rows(self, bits: npt.NDArray[np.uint8]) -> npt.NDArray[np.bool_]:
        """Only bitmaps of exactly omega members can come from an honest device."""
        result: npt.NDArray[np.bool_] = bits.sum(axis=1, dtype=np.int64) == self.subset_size
        return result

    def output_distribution(self, value: int) -> dict[bytes, Fraction]:
        """Exact law over all C(d, omega) subsets; only for d <= 12 (ValueError above)."""
        self.check_value(value)
        self._check_exact_domain()
        d, omega, v = self.domain_size, self.subset_size, operator.index(value)
        p_in = self.include_probability
        holding = p_in / math.comb(d - 1, omega - 1)
        lacking = (1 - p_in) / math.comb(d - 1, omega)
        return {
            self._bitmap(subset): holding if v in subset else lacking
            for subset in itertools.combinations(range(d), omega)
        }
