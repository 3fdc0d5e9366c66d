"""Sequential composition (basic, DRV advanced) and Poisson subsampling."""

from __future__ import annotations

import math

import pytest

from deniable.core.accounting import (
    Guarantee,
    advanced_composition,
    basic_composition,
    best_composition,
    poisson_subsampling,
)


def test_basic_composition_adds_both() -> None:
    assert basic_composition([(0.1, 1e-6), (0.25, 2e-6), (1.0, 0.0)]) == pytest.approx((1.35, 3e-6))
    assert basic_composition([]) == Guarantee(0.0, 0.0)
    assert basic_composition([(1.0, 0.7), (1.0, 0.7)]).delta == 1.0


def test_advanced_composition_formula() -> None:
    eps, delta, k, slack = 0.1, 1e-7, 100, 1e-6
    expected = math.sqrt(2 * k * math.log(1 / slack)) * eps + k * eps * (math.exp(eps) - 1)
    assert advanced_composition(eps, delta, k, slack) == pytest.approx((expected, k * delta + slack))


def test_best_composition_picks_the_smaller_epsilon() -> None:
    many_small = best_composition(0.01, 0.0, 10_000, 1e-6)
    assert many_small == advanced_composition(0.01, 0.0, 10_000, 1e-6)
    assert many_small.epsilon < 100 * 0.01 * 10
    few_large = best_composition(1.0, 1e-6, 3, 1e-6)
    assert few_large == Guarantee(3.0, 3e-6)


def test_poisson_subsampling_formula() -> None:
    eps, delta, rate = 1.0, 1e-6, 0.01
    assert poisson_subsampling(eps, delta, rate) == pytest.approx(
        (math.log(1 + rate * (math.e - 1)), rate * delta)
    )
    assert poisson_subsampling(eps, delta, 1.0) == pytest.approx((eps, delta))
    assert poisson_subsampling(eps, delta, 0.0) == (0.0, 0.0)
    small = poisson_subsampling(1e-9, 0.0, 0.5)
    assert small.epsilon == pytest.approx(0.5e-9, rel=1e-6)


@pytest.mark.parametrize(
    "call",
    [
        lambda: basic_composition([(-1.0, 0.0)]),
        lambda: basic_composition([(1.0, 1.5)]),
        lambda: advanced_composition(1.0, 0.0, -1, 1e-6),
        lambda: advanced_composition(1.0, 0.0, 5, 0.0),
        lambda: poisson_subsampling(1.0, 0.0, 1.5),
        lambda: poisson_subsampling(math.inf, 0.0, 0.5),
    ],
)
def test_bad_arguments_raise(call: object) -> None:
    with pytest.raises(ValueError):
        call()  # type: ignore[operator]
