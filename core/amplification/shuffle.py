"""Amplification by shuffling.

Feldman, McMillan and Talwar, "Hiding Among the Clones" (FOCS 2021), Theorem 3.1: for any
epsilon0-LDP randomisers, n reports and delta in (0, 1) with
epsilon0 <= ln(n / (16 ln(2 / delta))), the shuffled output is (epsilon, delta)-DP with

    epsilon <= ln(1 + (e^eps0 - 1) / (e^eps0 + 1) * (8 sqrt(e^eps0 ln(4/delta)) / sqrt(n) + 8 e^eps0 / n)).

Outside that condition the bound says nothing: we report "not applicable" and fall back to the
local guarantee epsilon0 (which holds for any n, with delta = 0), never a number the theorem
does not give. ``tightest.tightest_bound`` also tries the numerical and mechanism-specific
analyses a mechanism declares and returns the tightest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

LOCAL_ONLY = "local (no amplification)"
FMT21_CLOSED_FORM = "FMT 2021 Theorem 3.1 (closed form)"


@dataclass(frozen=True)
class AmplificationBound:
    """A central guarantee and the analysis that gave it."""

    epsilon: float
    delta: float
    analysis: str
    amplified: bool
    note: str = ""
    evaluated_n: int = 0  # the n' < n the analysis was evaluated at (its cost budget); 0: at n itself


def _check(epsilon0: float, n: int, delta: float) -> None:
    if not (math.isfinite(epsilon0) and epsilon0 > 0):
        raise ValueError("epsilon0 must be positive and finite")
    if n < 0:
        raise ValueError("n must be non-negative")
    if not 0 < delta < 1:
        raise ValueError("delta must lie in (0, 1)")


def fmt21_closed_form_applicable(epsilon0: float, n: int, delta: float) -> bool:
    """The validity condition of Theorem 3.1: epsilon0 <= ln(n / (16 ln(2/delta)))."""
    _check(epsilon0, n, delta)
    threshold = 16 * math.log(2 / delta)
    return n > threshold and epsilon0 <= math.log(n / threshold)


def fmt21_closed_form(epsilon0: float, n: int, delta: float) -> AmplificationBound:
    """Theorem 3.1's epsilon, or epsilon0 labelled "not applicable" outside its condition."""
    if not fmt21_closed_form_applicable(epsilon0, n, delta):
        return AmplificationBound(
            epsilon=epsilon0,
            delta=0.0,
            analysis=LOCAL_ONLY,
            amplified=False,
            note=(
                f"{FMT21_CLOSED_FORM} not applicable: needs epsilon0 <= ln(n / (16 ln(2/delta)))"
                f" (n={n}, delta={delta:g}); the local guarantee holds"
            ),
        )
    e0 = math.exp(epsilon0)
    inner = 8 * math.sqrt(e0 * math.log(4 / delta)) / math.sqrt(n) + 8 * e0 / n
    epsilon = math.log1p((e0 - 1) / (e0 + 1) * inner)
    if epsilon >= epsilon0:
        return AmplificationBound(
            epsilon0, 0.0, LOCAL_ONLY, False, f"{FMT21_CLOSED_FORM} gives no improvement at n={n}"
        )
    return AmplificationBound(epsilon=epsilon, delta=delta, analysis=FMT21_CLOSED_FORM, amplified=True)
