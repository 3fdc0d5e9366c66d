"""The privacy planner: the epsilon0 it returns meets the target and a slightly larger one does not."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import ClassVar

import numpy as np
import pytest

from deniable.core import mechanisms
from deniable.core.accounting import AmplificationBound, planner
from deniable.core.accounting.planner import (
    MAX_PLANNED_EPSILON0,
    RELATIVE_TOLERANCE,
    DeviceBudget,
    PlanningError,
    central_laplace,
    expected_std_error,
    largest_epsilon0,
    plan,
)
from deniable.core.mechanisms.direct import GeneralisedRandomisedResponse
from deniable.core.mechanisms.sample_threshold import SampleAndThreshold

NUDGE = 1e-3  # "slightly larger": well above the search tolerance


def _central(
    name: str, epsilon0: float, n: int, delta: float, k: int, params: dict[str, float] | None = None
) -> AmplificationBound:
    """A fresh guarantee, computed without the planner."""
    randomiser = mechanisms.create(name, epsilon0=epsilon0, domain_size=k, **(params or {}))
    return randomiser.central_guarantee(n, delta)


def _check_boundary(plan_: planner.Plan) -> None:
    """Every feasible candidate meets the target; 1.001 times its epsilon0 does not (unless capped)."""
    for c in plan_.candidates:
        if not c.feasible:
            continue
        bound = _central(c.mechanism, c.epsilon0, plan_.n, plan_.delta, plan_.domain_size, c.params)
        assert bound.epsilon <= plan_.target_epsilon, c
        assert bound.delta <= plan_.delta, c
        assert bound.epsilon == pytest.approx(c.central_epsilon, rel=1e-9)
        if c.epsilon0 >= MAX_PLANNED_EPSILON0 or not c.local_privacy:
            continue  # capped, or a shuffle-only protocol whose epsilon0 is the target itself
        above = _central(
            c.mechanism, c.epsilon0 * (1 + NUDGE), plan_.n, plan_.delta, plan_.domain_size, c.params
        )
        assert above.epsilon > plan_.target_epsilon, (c, above)


@pytest.mark.parametrize(
    ("target", "delta", "n", "k"),
    [
        (1.0, 1e-6, 20_000, 8),
        (0.5, 1e-8, 5_000, 4),
        (2.0, 1e-6, 2_000, 2),
        # every candidate's exact search at n = 1e5 and a small target: ~45 s, in the slow run
        pytest.param(0.3, 1e-6, 100_000, 16, marks=pytest.mark.slow),
    ],
)
def test_every_candidate_sits_on_the_target_boundary(target: float, delta: float, n: int, k: int) -> None:
    chosen = plan(target, delta, n, k)
    _check_boundary(chosen)
    assert chosen.central_epsilon <= target
    for c in chosen.candidates:
        if c.feasible and c.local_privacy:
            assert c.epsilon0 > target, "LDP randomisers amplify: epsilon0 above the central target"
        elif c.feasible:
            assert c.epsilon0 == target, "a shuffle-only protocol's epsilon0 is the target"


def test_chosen_mechanism_has_the_smallest_expected_error() -> None:
    """The most accurate feasible candidate within the per-device budget (ADR 0035)."""
    chosen = plan(1.0, 1e-6, 20_000, 8)
    budget = DeviceBudget()
    feasible = [c for c in chosen.candidates if c.feasible and budget.fits(c)]
    assert len(feasible) >= 1
    assert chosen.expected_std_error == min(c.expected_std_error for c in feasible)
    assert chosen.chosen.mechanism == chosen.mechanism
    assert chosen.epsilon0 == chosen.chosen.epsilon0
    assert chosen.params == chosen.chosen.params
    assert chosen.analysis == chosen.chosen.analysis
    assert chosen.ratio_to_central == pytest.approx(chosen.expected_std_error / (2 * math.sqrt(2)))


def test_binary_only_mechanisms_only_for_two_values() -> None:
    for_eight = {c.mechanism: c for c in plan(1.0, 1e-6, 20_000, 8).candidates}
    assert not for_eight["binary_rr"].feasible
    assert "not applicable" in for_eight["binary_rr"].note
    for_two = {c.mechanism: c for c in plan(1.0, 1e-6, 1_000, 2).candidates}
    assert for_two["binary_rr"].feasible and for_two["grr"].feasible
    assert set(for_eight) == set(for_two) == set(mechanisms.names())


def test_expected_std_error_is_grr_formula_at_a_uniform_truth() -> None:
    n, k = 20_000, 8
    c = largest_epsilon0("grr", 1.0, 1e-6, n, k)
    grr = GeneralisedRandomisedResponse(c.epsilon0, k)
    p, q = float(grr.keep_probability), float(grr.other_probability)
    variance = n * q * (1 - q) / (p - q) ** 2 + (n / k) * (1 - p - q) / (p - q)
    assert c.expected_std_error == pytest.approx(math.sqrt(variance), rel=1e-12)
    assert expected_std_error(grr, n) == pytest.approx(math.sqrt(variance), rel=1e-12)


def test_more_reports_allow_a_larger_epsilon0() -> None:
    small = largest_epsilon0("grr", 1.0, 1e-6, 2_000, 8)
    large = largest_epsilon0("grr", 1.0, 1e-6, 200_000, 8)
    assert large.epsilon0 > small.epsilon0 > 1.0
    stricter = largest_epsilon0("grr", 0.5, 1e-6, 2_000, 8)
    assert stricter.epsilon0 < small.epsilon0


def test_laplace_baseline_uses_replace_one_sensitivity() -> None:
    binary = central_laplace(0.5, 1e-6, 2)
    assert (binary.sensitivity, binary.scale) == (1.0, 2.0)
    assert binary.std_error == pytest.approx(math.sqrt(2) * 2.0)
    histogram = central_laplace(0.5, 1e-6, 10)
    assert histogram.sensitivity == 2.0
    assert histogram.std_error == pytest.approx(math.sqrt(2) * 4.0)
    assert "replace-one" in histogram.neighbouring
    with pytest.raises(ValueError):
        central_laplace(0.0, 1e-6, 2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0.0, 1e-6, 100, 2), "target epsilon"),
        ((math.nan, 1e-6, 100, 2), "target epsilon"),
        ((1.0, 0.0, 100, 2), "delta"),
        ((1.0, 1.0, 100, 2), "delta"),
        ((1.0, 1e-6, 0, 2), "n must"),
        ((1.0, 1e-6, 100, 1), "domain size"),
    ],
)
def test_bad_targets_are_refused(args: tuple[float, float, int, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan(*args)


def test_unknown_mechanism_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown mechanism"):
        plan(1.0, 1e-6, 1000, 2, mechanisms=["no_such_thing"])


def test_only_binary_mechanisms_for_a_histogram_is_a_planning_error() -> None:
    with pytest.raises(PlanningError, match="binary_rr"):
        plan(1.0, 1e-6, 1000, 5, mechanisms=["binary_rr"])


def test_to_dict_has_the_documented_keys() -> None:
    data = plan(1.0, 1e-6, 5_000, 4).to_dict()
    for key in ("epsilon", "delta", "analysis", "mechanism", "epsilon0", "expected_std_error"):
        assert key in data, key
    assert data["epsilon"] <= 1.0
    assert data["central_laplace"]["std_error"] == pytest.approx(2 * math.sqrt(2))
    names = [row["mechanism"] for row in data["candidates"]]
    assert sorted(names) == mechanisms.names()
    infeasible = [row for row in data["candidates"] if not row["feasible"]]
    assert all(row["epsilon0"] is None for row in infeasible)  # NaN would not be valid JSON


def test_planning_takes_few_evaluations_and_repeats_from_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """What keeps planning fast, as behaviour (its wall time is bench/planner_times.py's, not a test's):
    the secant bracket and Illinois refinement need a handful of guarantees per candidate (plain
    bisection to RELATIVE_TOLERANCE would need over 13), and the same question again computes none."""
    first = plan(1.0, 1e-6, 20_000, 8)  # the same case as above: usually already cached
    searched = [c for c in first.candidates if c.feasible and c.local_privacy]
    assert len(searched) >= 5
    assert all(1 <= c.evaluations <= 10 for c in searched), [(c.mechanism, c.evaluations) for c in searched]

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cached plan computed a guarantee")

    monkeypatch.setattr(mechanisms, "create", refuse)  # the registry the planner searches with
    again = plan(1.0, 1e-6, 20_000, 8)
    assert again.to_dict() == first.to_dict()


# ---------------------------------------------------------------- the search itself


def _evaluator(central: object) -> planner.Evaluate:
    def evaluate(x: float) -> tuple[bool, float]:
        eps = central(x)  # type: ignore[operator]
        return eps <= 1.0, math.log(eps) if eps > 0 and math.isfinite(eps) else math.nan

    return evaluate


@pytest.mark.parametrize(
    "central",
    [
        lambda x: x * x / 2,  # smooth: root sqrt(2)
        lambda x: 0.1 * math.exp(x),  # root ln(10)
        lambda x: math.inf if x > 3 else x / 3,  # a jump at 3 to a value with no log
    ],
)
def test_bracket_and_refine_keep_lo_feasible_and_close_the_bracket(central: object) -> None:
    evaluate = _evaluator(central)
    bracket = planner._bracket(evaluate, 1.0, MAX_PLANNED_EPSILON0, 1e-3)
    assert bracket is not None
    lo, hi = bracket
    assert evaluate(lo)[0] and not evaluate(hi)[0]
    found = planner._refine(evaluate, lo, hi, lambda: False)
    assert evaluate(found)[0]
    assert not evaluate(found * (1 + 2 * RELATIVE_TOLERANCE))[0]


def test_bracket_halves_down_and_gives_up() -> None:
    evaluate = _evaluator(lambda x: 4 * x)  # root 0.25: below the start
    assert planner._bracket(evaluate, 1.0, MAX_PLANNED_EPSILON0, 1e-3) == (0.25, 0.5)
    never = _evaluator(lambda x: 2.0)
    assert planner._bracket(never, 1.0, MAX_PLANNED_EPSILON0, 1e-3) is None
    always = _evaluator(lambda x: 0.5)
    assert planner._bracket(always, 1.0, 20.0, 1e-3) == (20.0, 20.0)


# ---------------------------------------------------------------- generic over the registry


class _ShuffleOnly(GeneralisedRandomisedResponse):
    """A stand-in shuffle-only protocol: its epsilon0 is the central epsilon once n >= 500."""

    name: ClassVar[str] = "test_shuffle_only"
    local_privacy: ClassVar[bool] = False

    def central_guarantee(self, n: int, delta: float) -> AmplificationBound:
        if n < 500:
            raise ValueError("needs n >= 500")
        return AmplificationBound(self.epsilon0, delta, "test protocol's own", True)


class _BinaryOnly(GeneralisedRandomisedResponse):
    """A stand-in binary-only randomiser."""

    name: ClassVar[str] = "test_binary_only"

    def __init__(self, epsilon0: float, domain_size: int = 2) -> None:
        if domain_size != 2:
            raise ValueError("test_binary_only has a domain of exactly 2 values")
        super().__init__(epsilon0, domain_size)


class _NeedsParams(GeneralisedRandomisedResponse):
    """A stand-in whose accuracy depends on a parameter it cannot default (like a sample rate)."""

    name: ClassVar[str] = "test_needs_params"

    def __init__(self, epsilon0: float, domain_size: int, width: float = 0.0) -> None:
        if not 0 < width <= 1:
            raise ValueError(f"width must lie in (0, 1], got {width}")
        super().__init__(epsilon0, domain_size)
        self.width = width

    def parameters(self) -> dict[str, float]:
        return {"width": self.width}

    def variance(self, true_counts: object, n: int) -> np.ndarray:
        return super().variance(true_counts, n) / self.width  # type: ignore[arg-type]

    @classmethod
    def planning_parameters(cls, target: float, delta: float, n: int, k: int) -> list[dict[str, float]]:
        return [{"width": 0.25}, {"width": 0.5}, {"width": 1.0}]


@pytest.fixture
def extra_mechanisms(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Two more registered mechanisms, as other modules would add them."""
    registry = dict(mechanisms._REGISTRY)
    registry[_ShuffleOnly.name] = _ShuffleOnly
    registry[_BinaryOnly.name] = _BinaryOnly
    registry[_NeedsParams.name] = _NeedsParams
    monkeypatch.setattr(mechanisms, "_REGISTRY", registry)
    planner.clear_cache()
    yield
    planner.clear_cache()


@pytest.mark.usefixtures("extra_mechanisms")
def test_shuffle_only_protocols_get_epsilon0_equal_to_the_target() -> None:
    c = largest_epsilon0("test_shuffle_only", 0.7, 1e-6, 1000, 4)
    assert c.feasible and c.epsilon0 == 0.7 and not c.local_privacy
    assert c.analysis == "test protocol's own"
    too_few = largest_epsilon0("test_shuffle_only", 0.7, 1e-6, 100, 4)
    assert not too_few.feasible and "no epsilon0" in too_few.note


@pytest.mark.usefixtures("extra_mechanisms")
def test_new_mechanisms_join_the_candidates() -> None:
    names = {c.mechanism: c for c in plan(1.0, 1e-6, 2000, 2).candidates}
    assert names["test_binary_only"].feasible and names["test_shuffle_only"].feasible
    eight = {c.mechanism: c for c in plan(1.0, 1e-6, 2000, 8).candidates}
    assert not eight["test_binary_only"].feasible
    assert "exactly 2" in eight["test_binary_only"].note
    # The shuffle-only stand-in has GRR's estimator at epsilon0 = 1: far worse than amplified GRR.
    chosen = plan(1.0, 1e-6, 2000, 8)
    assert chosen.mechanism != "test_shuffle_only"
    only = plan(1.0, 1e-6, 2000, 8, mechanisms=["test_shuffle_only"])
    assert only.mechanism == "test_shuffle_only" and only.epsilon0 == 1.0


@pytest.mark.usefixtures("extra_mechanisms")
def test_planning_parameters_hook_picks_the_most_accurate_set() -> None:
    assert "width must" in (planner.applicable("test_needs_params", 4) or "")
    chosen = plan(1.0, 1e-6, 2000, 4, mechanisms=["test_needs_params"])
    assert chosen.params == {"width": 1.0}
    fixed = plan(1.0, 1e-6, 2000, 4, mechanisms=["test_needs_params"], params={"width": 0.5})
    assert fixed.params == {"width": 0.5}
    assert fixed.expected_std_error == pytest.approx(chosen.expected_std_error * math.sqrt(2))


def test_expected_std_error_matches_a_simulation() -> None:
    """The variance the planner ranks by is what GRR's estimator really shows (10,000 draws)."""
    n, k = 4_000, 4
    c = largest_epsilon0("grr", 1.0, 1e-6, n, k)
    grr = GeneralisedRandomisedResponse(c.epsilon0, k)
    p, q = float(grr.keep_probability), float(grr.other_probability)
    rng = np.random.default_rng(7)
    truth = np.full(k, n // k)
    probs = np.full((k, k), q) + np.eye(k) * (p - q)
    counts = sum(rng.multinomial(int(t), probs[j], size=10_000) for j, t in enumerate(truth))
    estimates = (counts - n * q) / (p - q)
    observed = float(np.sqrt(np.mean(np.var(estimates, axis=0))))
    assert observed == pytest.approx(c.expected_std_error, rel=0.05)


# ---------------------------------------------------------------- sample and threshold

ST = "sample_and_threshold"


def test_sample_and_threshold_is_planned_from_its_hook() -> None:
    """Every proposed (s, tau) is tried at epsilon0 = target; the least error wins and beats the default."""
    eps, delta, n, k = 1.0, 1e-6, 100_000, 200
    proposed = SampleAndThreshold.planning_parameters(eps, delta, n, k)
    tried = [largest_epsilon0(ST, eps, delta, n, k, {**p, "delta": delta}) for p in proposed]
    assert all(c.feasible and c.epsilon0 == eps and c.central_epsilon <= eps for c in tried)
    chosen = plan(eps, delta, n, k, mechanisms=[ST])
    _check_boundary(chosen)
    assert chosen.params in [c.params for c in tried]
    assert chosen.expected_std_error == min(c.expected_std_error for c in tried)
    assert not chosen.chosen.local_privacy
    default = largest_epsilon0(ST, eps, delta, n, k, {"delta": delta})  # s spends half the target
    assert default.feasible and chosen.expected_std_error < 0.9 * default.expected_std_error


def test_sample_and_threshold_joins_the_full_plan() -> None:
    chosen = plan(1.0, 1e-6, 100_000, 200)
    rows = {c.mechanism: c for c in chosen.candidates}
    assert rows[ST].feasible and rows[ST].central_epsilon <= 1.0 and rows[ST].params["threshold"] > 0
    # Since issue 15 Balcer-Cheu's noise comes from its exact profile and beats sample-and-threshold.
    assert rows["balcer_cheu_histogram"].expected_std_error < rows[ST].expected_std_error
    assert chosen.expected_std_error <= rows[ST].expected_std_error


def test_sample_and_threshold_error_counts_the_suppression_bias() -> None:
    """Where tau is about the uniform bucket's sampled count, the planner's figure is the RMSE of
    the thresholded estimate, bias included: 200,000 seeded Bin(x, s) draws, within 2% (the
    Monte-Carlo error of the RMSE is about 0.3%)."""
    s, tau, n, k = 0.527618408203125, 214, 1620, 4  # x = 405 users, x s = 213.7 ~ tau
    c = largest_epsilon0(ST, 1.0, 1e-6, n, k, {"sample_rate": s, "threshold": float(tau), "delta": 1e-6})
    assert c.feasible
    x = n // k
    randomiser = SampleAndThreshold(1.0, k, sample_rate=s, threshold=float(tau))
    sd = float(np.sqrt(randomiser.variance([x], n)[0]))
    assert sd < 0.9 * c.expected_std_error, "the bias is a large part of the error here"
    counts = np.random.default_rng(2026).binomial(x, s, size=200_000)
    estimates = np.where(counts > tau, counts / s, 0.0)
    observed = float(np.sqrt(np.mean((estimates - x) ** 2)))
    assert observed == pytest.approx(c.expected_std_error, rel=0.02)
    small = plan(1.0, 1e-6, 1000, 200, mechanisms=[ST])  # 5 users per bucket: all suppressed
    assert small.expected_std_error == pytest.approx(5.0)


def test_sample_and_threshold_without_parameters_for_the_target_is_skipped_with_a_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An empty hook list is final: the constructor's defaults (a slow threshold scan) are not tried."""

    def no_defaults(self: SampleAndThreshold) -> int:
        raise AssertionError("the planner fell back to the default threshold")

    monkeypatch.setattr(SampleAndThreshold, "_smallest_threshold", no_defaults)
    planner.clear_cache()
    c = planner.best_configuration(ST, 5e-4, 1e-6, 100_000, 10)
    assert not c.feasible and "no parameters meet central epsilon <= 0.0005" in c.note
    with pytest.raises(PlanningError, match="sample_and_threshold: no parameters meet"):
        plan(5e-4, 1e-6, 100_000, 10, mechanisms=[ST])
