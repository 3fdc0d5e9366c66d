"""Small (epsilon, delta) calculus: sequential composition and Poisson subsampling.

Basic composition: Dwork, McSherry, Nissim, Smith 2006 / Dwork-Lei 2009. Advanced composition:
Dwork, Rothblum, Vadhan, "Boosting and Differential Privacy", FOCS 2010, Theorem III.3.
Subsampling: Balle, Barthe, Gaboardi, "Privacy Amplification by Subsampling", NeurIPS 2018.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple


class Guarantee(NamedTuple):
    """An (epsilon, delta)-DP guarantee."""

    epsilon: float
    delta: float


def _check(epsilon: float, delta: float) -> None:
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError("epsilon must be finite and non-negative")
    if not 0 <= delta <= 1:
        raise ValueError("delta must lie in [0, 1]")


def basic_composition(guarantees: Iterable[tuple[float, float]]) -> Guarantee:
    """Running mechanisms in sequence: the epsilons add and the deltas add."""
    total_epsilon = 0.0
    total_delta = 0.0
    for epsilon, delta in guarantees:
        _check(epsilon, delta)
        total_epsilon += epsilon
        total_delta += delta
    return Guarantee(total_epsilon, min(1.0, total_delta))


def advanced_composition(epsilon: float, delta: float, k: int, delta_slack: float) -> Guarantee:
    """k-fold adaptive composition of (eps, delta)-DP (DRV 2010): for any slack delta' in (0, 1),

    eps' = sqrt(2 k ln(1/delta')) eps + k eps (e^eps - 1), delta_total = k delta + delta'.
    """
    _check(epsilon, delta)
    if k < 0 or int(k) != k:
        raise ValueError("k must be a non-negative integer")
    if not 0 < delta_slack < 1:
        raise ValueError("delta_slack must lie in (0, 1)")
    eps_total = math.sqrt(2 * k * math.log(1 / delta_slack)) * epsilon + k * epsilon * math.expm1(epsilon)
    return Guarantee(eps_total, min(1.0, k * delta + delta_slack))


def best_composition(epsilon: float, delta: float, k: int, delta_slack: float) -> Guarantee:
    """The better of basic and advanced composition for k uses (by epsilon; delta follows)."""
    basic = basic_composition([(epsilon, delta)] * k)
    advanced = advanced_composition(epsilon, delta, k, delta_slack)
    return advanced if advanced.epsilon < basic.epsilon else basic


def poisson_subsampling(epsilon: float, delta: float, rate: float) -> Guarantee:
    """Each record kept independently with probability s, then an (eps, delta)-DP mechanism:

    eps' = ln(1 + s (e^eps - 1)), delta' = s delta (add/remove neighbours).
    """
    _check(epsilon, delta)
    if not 0 <= rate <= 1:
        raise ValueError("rate must lie in [0, 1]")
    return Guarantee(math.log1p(rate * math.expm1(epsilon)), rate * delta)
