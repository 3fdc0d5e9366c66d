"""Cheu, Smith, Ullman, Zeber, Zhilyaev (EUROCRYPT 2019) randomiser for binary sums in the shuffle model.

Each device reports its bit with probability 1 - gamma, else a uniform bit: the true bit w.p.
1 - gamma/2, the other w.p. gamma/2 (binary RR with keep = 1 - gamma/2, exact integer threshold
on 53 CSPRNG bits). epsilon0 is the CENTRAL target at ``expected_n`` devices and ``delta``;
gamma is the smallest multiple of 2**-52 (to 1/128 relative) whose exact shuffled binary-RR
profile (``BinaryRRExact``) meets it, not the paper's looser closed form. Every single report is
also locally eps_L-DP, eps_L = ln((2 - gamma)/gamma) (``local_epsilon``), but the campaign's
epsilon0 is the central target, hence ``local_privacy = False``. Estimator (shared with binary
RR): sum = (c_1 - n gamma/2) / (1 - gamma), exact variance n (gamma/2)(1 - gamma/2) / (1 - gamma)^2.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from typing import TYPE_CHECKING

from deniable.core.amplification.protocols import (
    GRID,
    GRID_BITS,
    cheu_delta,
    cheu_flip_for_target,
    cheu_guarantee,
    cheu_local_epsilon,
)
from deniable.core.amplification.shuffle import AmplificationBound
from deniable.core.mechanisms.direct import DirectEncoding
from deniable.core.mechanisms.sample_threshold import DEFAULT_DELTA, int_param, pack_many, probability_param
from deniable.core.rng import Csprng, default_rng
from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:
    import numpy as np
else:
    from deniable.core.lazy import numpy as np

_DRAW_BITS = GRID_BITS + 1  # flip iff a uniform 53-bit draw < g: probability g / 2**53 = gamma / 2


class CheuBinarySum(DirectEncoding):
    """Keep the bit w.p. 1 - gamma, else a fair coin; gamma from the exact shuffled profile."""

    name = "cheu_binary_sum"
    proto = pb.CHEU_BINARY_SUM
    summary = (
        "Cheu et al. 2019 binary sum: the bit w.p. 1-gamma else a fair coin; gamma from the central target"
    )
    local_privacy = False

    def __init__(
        self,
        epsilon0: float,
        domain_size: int = 2,
        expected_n: float = 0.0,
        delta: float = DEFAULT_DELTA,
        flip_probability: float | None = None,
    ) -> None:
        """epsilon0: central target at expected_n; ``flip_probability`` (gamma) skips the search."""
        if domain_size != 2:
            raise ValueError("cheu_binary_sum has a domain of exactly 2 values")
        super().__init__(epsilon0, domain_size)
        self.expected_n = int_param(expected_n, "expected_n", 2, 1 << 40)
        self.delta = probability_param(delta, "delta")
        if flip_probability is None:
            numerator = cheu_flip_for_target(self.epsilon0, self.delta, self.expected_n)
        else:
            gamma = Fraction(float(flip_probability))
            if not 0 < gamma <= 1:
                raise ValueError(f"flip_probability must lie in (0, 1], got {flip_probability!r}")
            numerator = -((-gamma.numerator * GRID) // gamma.denominator)  # rounded up to the grid
        self.flip = Fraction(numerator, GRID)
        self._flip_threshold = numerator
        self.keep_probability = 1 - self.flip / 2
        self.other_probability = self.flip / 2

    @property
    def local_epsilon(self) -> float:
        """ln((2 - gamma) / gamma): what each single report guarantees on its own."""
        return cheu_local_epsilon(self.flip)

    def parameters(self) -> dict[str, float]:
        return {
            "expected_n": float(self.expected_n),
            "delta": self.delta,
            "flip_probability": float(self.flip),
        }

    def central_guarantee(self, n: int, delta: float) -> AmplificationBound:
        """The exact shuffled binary-RR profile at the real n (the local eps_L where that is better)."""
        return cheu_guarantee(self.flip, n, delta)

    def privacy_profile(self, n: int, epsilon: float) -> float:
        """The exact shuffled binary-RR profile at keep = 1 - gamma/2 (0 at the local eps_L)."""
        return cheu_delta(self.flip, n, epsilon)

    def randomise(self, value: int, rng: Csprng | None = None) -> bytes:
        self.check_value(value)
        flip = int((rng or default_rng()).randbits(_DRAW_BITS) < self._flip_threshold)
        return bytes((int(value) ^ flip,))

    def randomise_many(self, values: Sequence[int], rng: Csprng | None = None) -> list[bytes]:
        for value in values:
            self.check_value(value)
        bits = np.asarray([int(v) for v in values], dtype=np.int64)
        draws = (rng or default_rng()).uint64_array(bits.size) >> np.uint64(64 - _DRAW_BITS)
        flips = (draws < np.uint64(self._flip_threshold)).astype(np.int64)
        return pack_many(bits ^ flips, 1)
