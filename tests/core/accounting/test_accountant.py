"""The accountant: ordering of the analyses, the minimum and its name, the cliff, caching."""

from __future__ import annotations

import itertools
import math

import pytest

from deniable.core.accounting import (
    AmplificationBound,
    BinaryRRExact,
    FMT21ClosedForm,
    FMT21NumericalClones,
    GRRBlanket,
    GRRFullBlanket,
    all_bounds,
    analyses_for,
    best_bound,
    central_guarantee,
)
from deniable.core.accounting.accountant import clear_cache
from deniable.core.amplification.shuffle import LOCAL_ONLY


def by_type(eps0: float, n: int, mechanism: str | None = None, k: int | None = None) -> dict[type, object]:
    return {type(a): a for a in analyses_for(eps0, n, mechanism, k)}


@pytest.mark.parametrize(
    ("eps0", "n", "delta"),
    [
        (0.5, 3000, 1e-4),
        (1.0, 1000, 1e-6),
        (1.0, 10_000, 1e-6),
        (2.0, 5000, 1e-6),
        (3.0, 8000, 1e-8),
        (4.0, 10_000, 1e-6),
    ],
)
def test_exact_below_blanket_below_clones_below_closed_form(eps0: float, n: int, delta: float) -> None:
    analyses = by_type(eps0, n, "binary_rr")
    exact = analyses[BinaryRRExact].epsilon_for_delta(delta)  # type: ignore[attr-defined]
    blanket = analyses[GRRBlanket].epsilon_for_delta(delta)  # type: ignore[attr-defined]
    clones = analyses[FMT21NumericalClones].epsilon_for_delta(delta)  # type: ignore[attr-defined]
    assert exact <= blanket <= clones <= eps0
    closed = analyses[FMT21ClosedForm].bound(delta)  # type: ignore[attr-defined]
    if closed.amplified:
        assert clones <= closed.epsilon


@pytest.mark.parametrize(("eps0", "n", "k"), [(1.0, 2000, 3), (3.0, 20_000, 8), (5.0, 50_000, 64)])
def test_grr_blankets_below_clones_below_closed_form(eps0: float, n: int, k: int) -> None:
    """k >= 3: the full blanket beats the restricted one, and both the generic analyses."""
    analyses = by_type(eps0, n, "grr", k)
    delta = 1e-6
    full = analyses[GRRFullBlanket].epsilon_for_delta(delta)  # type: ignore[attr-defined]
    restricted = analyses[GRRBlanket].epsilon_for_delta(delta)  # type: ignore[attr-defined]
    clones = analyses[FMT21NumericalClones].epsilon_for_delta(delta)  # type: ignore[attr-defined]
    assert full <= restricted <= clones <= eps0
    closed = analyses[FMT21ClosedForm].bound(delta)  # type: ignore[attr-defined]
    if closed.amplified:
        assert clones <= closed.epsilon


@pytest.mark.parametrize(("eps0", "n"), [(1.0, 200), (2.0, 3000), (4.0, 100_000)])
def test_profiles_are_ordered_pointwise(eps0: float, n: int) -> None:
    analyses = by_type(eps0, n, "binary_rr")
    for eps in (0.05, 0.2, 0.5 * eps0):
        values = [
            analyses[cls].delta_for_epsilon(eps)  # type: ignore[attr-defined]
            for cls in (GRRBlanket, FMT21NumericalClones, FMT21ClosedForm)
        ]
        assert values[0] <= values[1] <= values[2] + 1e-15
        if n <= 3000:
            # the exact profile carries a ~1e-12 rounding allowance
            assert analyses[BinaryRRExact].delta_for_epsilon(eps) <= values[0] + 1e-11  # type: ignore[attr-defined]


@pytest.mark.parametrize("mechanism", [None, "binary_rr", "grr"])
def test_best_is_the_minimum_and_is_named(mechanism: str | None) -> None:
    k = 4 if mechanism == "grr" else None
    for eps0, n, delta in ((1.0, 2000, 1e-6), (3.0, 50_000, 1e-7), (0.3, 100_000, 1e-5)):
        best = best_bound(eps0, n, delta, mechanism, k)
        candidates = {
            a.name: a.epsilon_for_delta(delta)
            for a in analyses_for(eps0, n, mechanism, k)
            if a.not_applicable_reason(delta) is None
        }
        winner = min(candidates, key=lambda name: candidates[name])
        assert best.amplified
        assert best.analysis == winner
        assert best.epsilon == candidates[winner]
        assert best.delta == delta
        assert winner in best.note


def test_mechanism_specific_analyses_only_for_their_mechanism() -> None:
    assert set(by_type(1.0, 100)) == {FMT21ClosedForm, FMT21NumericalClones}
    assert set(by_type(1.0, 100, "grr", 5)) == {
        FMT21ClosedForm,
        FMT21NumericalClones,
        GRRBlanket,
        GRRFullBlanket,
    }
    assert GRRFullBlanket not in by_type(1.0, 100, "grr", 2)
    assert BinaryRRExact in by_type(1.0, 100, "grr", 2)
    assert BinaryRRExact in by_type(1.0, 100, "binary_rr")
    assert set(by_type(1.0, 100, "some_future_mechanism")) == {FMT21ClosedForm, FMT21NumericalClones}


def test_every_bound_is_at_most_eps0_and_local_when_nothing_helps() -> None:
    for eps0, n, delta in itertools.product(
        (0.05, 1.0, 4.0, 8.0, 12.0), (2, 30, 1000, 10**5), (1e-3, 1e-6, 1e-10)
    ):
        for mechanism, k in ((None, None), ("binary_rr", None), ("grr", 8)):
            result = best_bound(eps0, n, delta, mechanism, k)
            assert result.epsilon <= eps0
            if result.amplified:
                assert result.delta == delta and result.epsilon < eps0
            else:
                assert result == AmplificationBound(eps0, 0.0, LOCAL_ONLY, False, result.note)
                assert "no analysis amplifies" in result.note or "n=" in result.note


def test_the_cliff_is_reported_honestly() -> None:
    """Large eps0, small delta, few reports: clones are ~never present; say so, keep eps0."""
    result = best_bound(10.0, 200, 1e-10)
    assert not result.amplified
    assert result.epsilon == 10.0
    assert result.delta == 0.0
    assert "no analysis amplifies" in result.note
    for bound in all_bounds(10.0, 200, 1e-10):
        assert bound.epsilon <= 10.0


@pytest.mark.parametrize("mechanism", [None, "binary_rr"])
def test_monotone_in_n(mechanism: str | None) -> None:
    """Across the exact analysis's cost budget too (it is then evaluated at a smaller n')."""
    ns = [300, 1000, 3000, 10_000, 15_000, 30_000, 100_000, 1_000_000]
    for eps0 in (1.0, 4.0):
        values = [best_bound(eps0, n, 1e-6, mechanism).epsilon for n in ns]
        assert all(b <= a for a, b in itertools.pairwise(values)), values


def test_huge_eps0_is_local_not_an_overflow() -> None:
    result = best_bound(800.0, 10**6, 1e-6, "binary_rr")
    assert not result.amplified and result.epsilon == 800.0 and "overflow" in result.note


def test_single_or_no_report_is_local() -> None:
    for n in (0, 1):
        result = best_bound(1.0, n, 1e-6, "binary_rr")
        assert not result.amplified and result.epsilon == 1.0 and result.delta == 0.0


def test_central_guarantee_delegates_with_keyword_only_mechanism() -> None:
    assert central_guarantee(2.0, 10_000, 1e-6) == best_bound(2.0, 10_000, 1e-6)
    specific = central_guarantee(2.0, 10_000, 1e-6, mechanism="binary_rr")
    assert specific == best_bound(2.0, 10_000, 1e-6, "binary_rr")
    assert specific.analysis == BinaryRRExact.name
    assert specific.epsilon < central_guarantee(2.0, 10_000, 1e-6).epsilon
    with pytest.raises(TypeError):
        central_guarantee(2.0, 10_000, 1e-6, "binary_rr")  # type: ignore[call-arg]


def test_results_are_cached() -> None:
    clear_cache()
    first = best_bound(1.5, 40_000, 1e-6, "grr", 6)
    assert best_bound(1.5, 40_000, 1e-6, "grr", 6) is first


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((0.0, 100, 1e-6), {}),
        ((math.nan, 100, 1e-6), {}),
        ((1.0, -1, 1e-6), {}),
        ((1.0, 100, 0.0), {}),
        ((1.0, 100, 1.0), {}),
        ((1.0, 100, 1e-6), {"mechanism": "grr"}),
        ((1.0, 100, 1e-6), {"mechanism": "binary_rr", "domain_size": 3}),
    ],
)
def test_bad_arguments_raise(args: tuple[float, int, float], kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        best_bound(*args, **kwargs)  # type: ignore[arg-type]


def test_table_script_rows() -> None:
    from deniable.core.accounting.table import main, rows

    (row,) = rows([2.0], [1000], 1e-6, 20_000_000, 10)
    assert row[:3] == ["2", "1e3", "— (local)"]
    assert float(row[7]) == pytest.approx(best_bound(2.0, 1000, 1e-6, "binary_rr").epsilon, abs=1e-4)
    assert row[8].endswith("(binary RR exact)")
    assert float(row[5]) <= float(row[4])  # GRR k = 10: full blanket <= restricted blanket
    main(["--eps0", "1", "--n", "500"])
