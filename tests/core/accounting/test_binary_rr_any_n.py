"""Binary RR at any n: the configuration search (docs/amplification.md §5) against exhaustive values.

Lemma 1 (fewer users, larger divergence) and Lemma 2 (converting one-users) are checked exactly at
small sizes, the search is checked against the exhaustive exact profile, and a mutant reduction
(too few converted users) is shown to break the bound, so the tests can fail.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

from deniable.core.accounting import BinaryRRExact
from deniable.core.amplification._binary_rr import exact_delta, exact_epsilon, grid_delta, grid_epsilon
from deniable.core.amplification.analyses import GRID_TOLERANCE


def divergence(keep: float, ones: int, zeros: int, eps: float) -> float:
    """D_{e^eps}(victim 1 || victim 0) with ``ones``/``zeros`` other users, from scipy pmfs."""
    y = np.convolve(
        binom.pmf(np.arange(ones + 1), ones, keep), binom.pmf(np.arange(zeros + 1), zeros, 1 - keep)
    )
    lower, upper = np.append(y, 0.0), np.insert(y, 0, 0.0)
    one = keep * upper + (1 - keep) * lower
    zero = (1 - keep) * upper + keep * lower
    return float(np.maximum(one - math.exp(eps) * zero, 0).sum())


@pytest.mark.parametrize("eps0", [0.5, 2.0, 5.0])
def test_lemma_1_removing_a_user_never_lowers_the_divergence(eps0: float) -> None:
    keep = math.exp(eps0) / (1 + math.exp(eps0))
    for ones in range(0, 12, 3):
        for zeros in range(1, 12, 2):
            for eps in (0.05, 0.3, 0.8 * eps0):
                assert divergence(keep, ones, zeros - 1, eps) >= divergence(keep, ones, zeros, eps) - 1e-15
                assert divergence(keep, ones, zeros, eps) >= divergence(keep, ones + 1, zeros, eps) - 1e-15


@pytest.mark.parametrize("eps0", [0.5, 2.0, 5.0])
def test_lemma_2_converted_one_users_bound_the_configuration_exactly(eps0: float) -> None:
    """D(a + t, b) <= E_F D(a, b + t - F), F ~ Bin(t, (p - q)/p); a smaller conversion rate fails."""
    keep = math.exp(eps0) / (1 + math.exp(eps0))
    rate = (2 * keep - 1) / keep
    tight, broken = 0.0, 0
    for a, t, b in [(0, 3, 5), (2, 4, 3), (5, 5, 0), (1, 8, 8), (0, 12, 0)]:
        for eps in (0.05, 0.3, 0.7 * eps0):
            f = np.arange(t + 1)
            bound = float(
                np.dot(binom.pmf(f, t, rate), [divergence(keep, a, b + t - int(k), eps) for k in f])
            )
            actual = divergence(keep, a + t, b, eps)
            assert actual <= bound + 1e-14
            tight = max(tight, actual / bound if bound > 0 else 1.0)
            mutant = float(
                np.dot(binom.pmf(f, t, rate / 2), [divergence(keep, a, b + t - int(k), eps) for k in f])
            )
            broken += actual > mutant + 1e-12
    assert tight > 0.5  # the bound is not vacuous
    assert broken > 0  # converting too few users would claim too much


@pytest.mark.parametrize(
    ("eps0", "n", "delta"),
    [(0.5, 2000, 1e-6), (1.0, 3000, 1e-6), (2.0, 1000, 1e-8), (4.0, 4000, 1e-8), (8.0, 500, 1e-3)],
)
def test_search_bounds_the_exhaustive_epsilon_within_tolerance(eps0: float, n: int, delta: float) -> None:
    keep = math.exp(eps0) / (1 + math.exp(eps0))
    exhaustive = exact_epsilon(keep, n, delta)
    found = grid_epsilon(keep, n, delta, GRID_TOLERANCE)
    assert found.value >= exhaustive * (1 - 1e-9)
    assert found.value <= exhaustive * (1 + GRID_TOLERANCE) + 1e-12
    assert found.lower <= exhaustive * (1 + 1e-9)
    assert found.value <= found.lower * (1 + GRID_TOLERANCE) * (1 + 1e-6)


@pytest.mark.parametrize(("eps0", "n"), [(1.0, 1500), (3.0, 800)])
def test_search_bounds_the_exhaustive_profile(eps0: float, n: int) -> None:
    keep = math.exp(eps0) / (1 + math.exp(eps0))
    for eps in (0.02, 0.06, 0.15):
        exhaustive = exact_delta(keep, n, eps)
        found = grid_delta(keep, n, eps, 0.02)
        # the exhaustive FFT carries a ~1e-12 rounding allowance that the direct search does not
        assert exhaustive * (1 - 1e-9) - 1e-11 <= found.value <= exhaustive * 1.02 + 1e-11
        assert found.lower <= found.value


def test_mutant_search_without_conversion_claims_too_little() -> None:
    """Bounding each interval by its left end alone (no converted users) undershoots the exact eps
    at some setting: the reduction is what makes the search valid."""
    import deniable.core.amplification._binary_rr as module

    keep = math.exp(2.0) / (1 + math.exp(2.0))
    exhaustive = exact_epsilon(keep, 1000, 1e-6)
    saved = (module._reduction, module._GRID_START, module._GRID_START_PER_RATE)
    try:
        module._reduction = lambda size, converted: (0, 0.0)
        module._GRID_START, module._GRID_START_PER_RATE = 4, 0
        mutant = grid_epsilon(keep, 1000, 1e-6, 1.0)
    finally:
        module._reduction, module._GRID_START, module._GRID_START_PER_RATE = saved
    assert mutant.value < exhaustive


def test_large_n_is_evaluated_at_n_and_certified() -> None:
    analysis = BinaryRRExact(1.0, 10**6)
    assert not analysis.exhaustive and analysis.evaluated_n == 10**6
    keep = analysis.keep
    found = grid_epsilon(keep, 10**6, 1e-6, GRID_TOLERANCE)
    assert analysis.epsilon_for_delta(1e-6) == pytest.approx(found.value, rel=1e-9)
    assert found.value <= found.lower * (1 + GRID_TOLERANCE) * (1 + 1e-6)


def test_delta_1e_10_at_large_n_is_within_the_numerics() -> None:
    keep = math.exp(0.1) / (1 + math.exp(0.1))
    found = grid_epsilon(keep, 10**6, 1e-10, GRID_TOLERANCE)
    assert 0 < found.lower <= found.value <= found.lower * (1 + GRID_TOLERANCE) * (1 + 1e-6)
