"""The amplification-by-shuffling accountant: FMT 2021 Theorem 3.1 and its validity condition.

Feldman, McMillan, Talwar, "Hiding Among the Clones: A Simple and Nearly Optimal Analysis of
Privacy Amplification by Shuffling", FOCS 2021, Theorem 3.1: for eps0 <= ln(n / (16 ln(2/delta)))
the shuffled n reports are (eps, delta)-DP with
eps <= ln(1 + (e^eps0 - 1)/(e^eps0 + 1) * (8 sqrt(e^eps0 ln(4/delta)) / sqrt(n) + 8 e^eps0 / n)).
"""

from __future__ import annotations

import itertools
import math
from decimal import Decimal, localcontext

import pytest

from deniable.core.accounting import (
    AmplificationBound,
    central_guarantee,
    fmt21_closed_form,
    fmt21_closed_form_applicable,
)


def fmt21_reference(eps0: float, n: int, delta: float) -> Decimal:
    """Theorem 3.1's epsilon, computed independently with 50-digit decimals."""
    with localcontext() as ctx:
        ctx.prec = 50
        e0 = Decimal(eps0).exp()
        d = Decimal(delta)
        inner = 8 * (e0 * (4 / d).ln()).sqrt() / Decimal(n).sqrt() + 8 * e0 / Decimal(n)
        return (1 + (e0 - 1) / (e0 + 1) * inner).ln()


def boundary(n: int, delta: float) -> float:
    """The largest eps0 the theorem covers: ln(n / (16 ln(2/delta)))."""
    with localcontext() as ctx:
        ctx.prec = 50
        return float((Decimal(n) / (16 * (2 / Decimal(delta)).ln())).ln())


@pytest.mark.parametrize(
    ("eps0", "n", "delta"),
    [
        (1.0, 10_000, 1e-6),
        (0.5, 1_000_000, 1e-6),
        (2.0, 100_000, 1e-8),
        (4.0, 1_000_000, 1e-9),
        (3.0, 50_000, 1e-5),
        (6.0, 10**8, 1e-10),
    ],
)
def test_closed_form_matches_an_independent_computation(eps0: float, n: int, delta: float) -> None:
    assert eps0 <= boundary(n, delta)
    result = fmt21_closed_form(eps0, n, delta)
    assert result.amplified
    assert result.delta == delta
    assert "FMT" in result.analysis and "3.1" in result.analysis
    assert result.epsilon == pytest.approx(float(fmt21_reference(eps0, n, delta)), rel=1e-12)
    assert result.epsilon < eps0


def test_one_value_by_hand() -> None:
    """eps0 = 1, n = 10^4, delta = 1e-6, evaluated step by step with floats."""
    e = math.e
    inner = 8 * math.sqrt(e * math.log(4e6)) / 100 + 8 * e / 10_000
    expected = math.log(1 + (e - 1) / (e + 1) * inner)
    assert 0.2 < expected < 0.3
    assert fmt21_closed_form(1.0, 10_000, 1e-6).epsilon == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("n", "delta"), [(100_000, 1e-6), (10**7, 1e-9), (10_000, 1e-5)])
def test_validity_boundary(n: int, delta: float) -> None:
    edge = boundary(n, delta)
    inside, outside = edge * (1 - 1e-9), edge * (1 + 1e-9)

    assert fmt21_closed_form_applicable(inside, n, delta)
    amplified = fmt21_closed_form(inside, n, delta)
    assert amplified.amplified
    assert "FMT" in amplified.analysis
    assert 0 < amplified.epsilon < inside
    assert amplified.delta == delta

    assert not fmt21_closed_form_applicable(outside, n, delta)
    local = fmt21_closed_form(outside, n, delta)
    assert not local.amplified
    assert local.epsilon == outside
    assert local.delta == 0.0
    assert "not applicable" in local.note
    assert "FMT" in local.note


def test_boundary_in_n() -> None:
    """For fixed eps0 the theorem starts at n = 16 ln(2/delta) e^eps0."""
    eps0, delta = 2.0, 1e-6
    n_star = 16 * math.log(2 / delta) * math.exp(eps0)
    assert fmt21_closed_form_applicable(eps0, math.ceil(n_star) + 1, delta)
    assert not fmt21_closed_form_applicable(eps0, math.floor(n_star) - 1, delta)
    assert fmt21_closed_form(eps0, math.floor(n_star) - 1, delta).epsilon == eps0


@pytest.mark.parametrize("n", [0, 1, 2, 100, 221])
def test_tiny_n_is_local_only(n: int) -> None:
    result = fmt21_closed_form(0.5, n, 1e-6)  # 16 ln(2e6) ~ 232 > n
    assert result == AmplificationBound(result.epsilon, 0.0, result.analysis, False, result.note)
    assert result.epsilon == 0.5
    assert not result.amplified


@pytest.mark.parametrize(("eps0", "delta"), [(0.5, 1e-6), (1.0, 1e-6), (3.0, 1e-9)])
def test_monotone_decreasing_in_n(eps0: float, delta: float) -> None:
    start = math.ceil(16 * math.log(2 / delta) * math.exp(eps0)) + 1
    ns = sorted({start, *(int(start * 1.5**i) for i in range(1, 40))})
    values = [fmt21_closed_form(eps0, n, delta).epsilon for n in ns]
    assert all(b < a for a, b in itertools.pairwise(values))
    assert values[-1] < eps0 / 10


def test_never_worse_than_local_and_labelled_consistently() -> None:
    for eps0 in (0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 8.0):
        for n in (10, 1000, 10**4, 10**5, 10**6, 10**8):
            for delta in (1e-4, 1e-6, 1e-10):
                result = fmt21_closed_form(eps0, n, delta)
                assert result.epsilon <= eps0
                assert result.amplified == (result.epsilon < eps0)
                assert result.delta == (delta if result.amplified else 0.0)


@pytest.mark.parametrize(
    ("eps0", "n", "delta"), [(1.0, 10_000, 1e-6), (4.0, 1_000_000, 1e-9), (2.0, 1000, 1e-6), (0.5, 100, 1e-6)]
)
def test_central_guarantee_is_never_looser_than_the_closed_form(eps0: float, n: int, delta: float) -> None:
    """central_guarantee may use tighter analyses (the accountant), never a looser one."""
    closed = fmt21_closed_form(eps0, n, delta)
    central = central_guarantee(eps0, n, delta)
    assert central.epsilon <= closed.epsilon + 1e-12
    assert central.epsilon <= eps0
    assert central.delta <= delta


def test_small_eps0_at_the_boundary_gives_no_improvement_and_says_so() -> None:
    """At the edge the bound is ~ln(1 + 2.08 tanh(eps0/2)), above eps0 for small eps0: the
    accountant must fall back to eps0, not report a larger central epsilon."""
    delta = 1e-6
    eps0 = 0.01
    n = math.ceil(16 * math.log(2 / delta) * math.exp(eps0)) + 1
    assert fmt21_closed_form_applicable(eps0, n, delta)
    assert float(fmt21_reference(eps0, n, delta)) >= eps0
    result = fmt21_closed_form(eps0, n, delta)
    assert not result.amplified
    assert result.epsilon == eps0
    assert result.delta == 0.0
    assert "no improvement" in result.note


@pytest.mark.parametrize(
    ("eps0", "n", "delta"),
    [
        (0.0, 1000, 1e-6),
        (-1.0, 1000, 1e-6),
        (math.nan, 1000, 1e-6),
        (math.inf, 1000, 1e-6),
        (1.0, -1, 1e-6),
        (1.0, 1000, 0.0),
        (1.0, 1000, 1.0),
        (1.0, 1000, -1e-6),
        (1.0, 1000, math.nan),
        (1.0, 1000, 2.0),
    ],
)
def test_bad_arguments_raise(eps0: float, n: int, delta: float) -> None:
    for function in (fmt21_closed_form, fmt21_closed_form_applicable, central_guarantee):
        with pytest.raises(ValueError):
            function(eps0, n, delta)
