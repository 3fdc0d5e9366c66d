"""Our Bin(t, 1/2) upper tails (``_binomial.half_upper_tails``), which replace scipy's ``bdtrc`` in
the GRR blanket accountant so that the aggregator's image carries no scipy (ADR 0036).

Deterministic: exact rationals and fixed grids, no randomness (no false failures).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from deniable.core.amplification import _binomial
from deniable.core.amplification._binomial import half_upper_tails
from deniable.core.amplification._blanket import _TAIL_ERROR

UNDERFLOW = Fraction(1, 10**300)  # exact tails below the smallest double are returned as 0


def _exact_tail(t: int, x: int) -> Fraction:
    """P[Bin(t, 1/2) >= x] as an exact rational (one comb, then the integer recurrence)."""
    if x > t:
        return Fraction(0)
    x = max(x, 0)
    c, total = math.comb(t, x), 0
    for j in range(x, t + 1):
        total += c
        c = c * (t - j) // (j + 1)
    return Fraction(total, 2**t)


@pytest.mark.parametrize("t", [0, 1, 2, 3, 5, 10, 37, 100, 1001, 4000])
def test_tails_are_within_their_bound_of_exact_rationals(t: int) -> None:
    """Both branches (series above t/2, reflection below) and the edges 0, t/2, t, t + 1."""
    xs = sorted({0, 1, t // 3, t // 2, t // 2 + 1, (t + 1) // 2, 2 * t // 3, max(t - 1, 0), t, t + 1})
    values, errors = half_upper_tails(xs, [t] * len(xs))
    for x, value, error in zip(xs, values.tolist(), errors.tolist(), strict=True):
        exact = _exact_tail(t, x)
        assert abs(Fraction(value) - exact) <= Fraction(error) + UNDERFLOW, (t, x, value, float(exact))


def test_bounds_fit_the_accountants_budget() -> None:
    """The proven bound stays below the 1e-10 relative the blanket budgets for an anchor."""
    ts = np.repeat(np.array([10, 1_000, 10**5, 10**7, 10**8]), 6)
    xs = ts // 2 + np.tile(np.array([-2_000, -3, 0, 1, 40, 3_000]), 5)
    xs = np.clip(xs, 0, ts + 1)
    values, errors = half_upper_tails(xs, ts)
    assert np.all(errors <= _TAIL_ERROR * values + 1e-300)


def test_tails_agree_with_scipy_across_a_grid() -> None:
    """Against scipy's regularised incomplete beta I_{1/2}(x, t - x + 1), t up to 1e8.

    scipy's ``bdtrc`` (what the accountant called before) agrees to ~1e-11 at t = 1e4 but near t/2
    it drifts: 3e-9 relative at t = 1e6, 0.22 at t = 1e8 (scipy 1.17); ``betainc`` does not, so it
    is the reference here and ``bdtrc`` only where it is accurate.
    """
    special = pytest.importorskip("scipy.special")
    for t in (50, 999, 10**4, 10**6, 10**8):
        xs = np.unique(np.clip(t // 2 + np.array([-t // 4, -30, -1, 0, 1, 2, 7, 30, 300, t // 5]), 1, t))
        ts = np.full(xs.size, t)
        values, errors = half_upper_tails(xs, ts)
        reference = special.betainc(xs, ts - xs + 1, 0.5)
        assert np.all(np.abs(values - reference) <= errors + 1e-13 * reference + 1e-300), t
        if t <= 10**4:
            old = special.bdtrc(xs - 1, ts, 0.5)
            assert np.all(np.abs(values - old) <= errors + 1e-10 * old + 1e-300), t


def test_values_do_not_depend_on_the_batch_or_the_block_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Vectorised (ADR 0036): each element alone, the whole grid at once and the grid cut into
    one-row blocks (``_CELLS`` smaller than a pass) give the same values and bounds; shapes broadcast."""
    ts = np.array([0, 1, 7, 100, 1001, 10**5, 10**6, 10**8])
    xs = np.clip(ts // 2 + np.array([0, 1, -2, 3, 1, -40, 600, 1]), 0, None)
    together = half_upper_tails(xs, ts)
    alone = [half_upper_tails(int(x), int(t)) for x, t in zip(xs, ts, strict=True)]
    assert together[0].tolist() == [float(v) for v, _ in alone]
    assert together[1].tolist() == [float(e) for _, e in alone]
    monkeypatch.setattr(_binomial, "_CELLS", 1)
    blocked = half_upper_tails(xs, ts)
    assert np.array_equal(blocked[0], together[0]) and np.array_equal(blocked[1], together[1])
    grid, grid_errors = half_upper_tails(np.array([[1], [2], [3]]), np.array([2, 4]))
    assert grid.shape == grid_errors.shape == (3, 2)
    assert grid[2, 0] == 0.0 and abs(grid[2, 1] - 5 / 16) <= grid_errors[2, 1]


def test_a_series_cut_early_is_within_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopping at a rest of 2^-20 of the sum (not 2^-60) with passes of 1, 2, 4, ... terms: the
    bound must then carry the neglected rest (far above rounding) and still hold exactly."""
    monkeypatch.setattr(_binomial, "_REST", 2.0**-20)
    monkeypatch.setattr(_binomial, "_LOG_REACH", 1.0)
    monkeypatch.setattr(_binomial, "_CHUNK", 1)
    for t in (100, 1001, 4000):
        xs = [t // 2 + 1, t // 2 + 3, t // 2 + 20, t // 3]
        values, errors = half_upper_tails(xs, [t] * len(xs))
        assert max((errors / values).tolist()) > 2.0**-40  # the rest dominates the bound here
        for x, value, error in zip(xs, values.tolist(), errors.tolist(), strict=True):
            exact = _exact_tail(t, x)
            assert abs(Fraction(value) - exact) <= Fraction(error) + UNDERFLOW, (t, x, value, float(exact))
