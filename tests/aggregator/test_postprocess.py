"""Query post-processing (pure functions, then through the handlers) and campaigns planned from a target."""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import TYPE_CHECKING

import numpy as np
import pytest
from scipy.optimize import minimize

from deniable.aggregator import postprocess
from deniable.aggregator.handlers import AggregatorHandlers
from deniable.aggregator.postprocess import (
    Options,
    apply,
    bonferroni_confidence,
    bonferroni_z,
    clip_non_negative,
    project_simplex,
    suppress_below,
    top_k,
)
from deniable.core.campaigns import randomiser_for
from deniable.core.errors import InvalidRequest
from deniable.core.rng import Csprng
from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:  # the kit fixture's type only
    from support.aggregator_kit import Kit


# ---------------------------------------------------------------- simplex projection


def _qp_projection(x: np.ndarray, total: float) -> np.ndarray:
    """A general QP solver: minimise ||y - x||^2 subject to y >= 0, sum y = total (SLSQP, rescaled)."""
    scale = max(1.0, float(np.abs(x).max()), total)
    xs, ts, k = x / scale, total / scale, x.size
    result = minimize(
        lambda y: float(np.sum((y - xs) ** 2)),
        x0=np.full(k, ts / k),
        jac=lambda y: 2 * (y - xs),
        bounds=[(0.0, None)] * k,
        constraints=[{"type": "eq", "fun": lambda y: float(np.sum(y) - ts), "jac": lambda y: np.ones(k)}],
        method="SLSQP",
        options={"ftol": 1e-12, "maxiter": 1000},
    )
    assert result.success, result.message
    return np.asarray(result.x) * scale


def _enumerated_projection(x: np.ndarray, total: float) -> np.ndarray:
    """Exhaustive: on each support S the optimum is x_S shifted to sum to total; best feasible one."""
    best, best_cost = None, math.inf
    for mask in range(1, 1 << x.size):
        support = np.array([(mask >> i) & 1 for i in range(x.size)], dtype=bool)
        y = np.zeros_like(x)
        y[support] = x[support] - (x[support].sum() - total) / support.sum()
        cost = float(np.sum((y - x) ** 2))
        if np.all(y >= -1e-12) and cost < best_cost:
            best, best_cost = y, cost
    assert best is not None
    return best


@pytest.mark.parametrize("seed", range(40))
def test_projection_matches_a_brute_force_qp(seed: int) -> None:
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 8))
    x = rng.normal(0, 50, size=k) + rng.uniform(-20, 60)
    total = float(rng.choice([0.0, 1.0, 10.0, 100.0, rng.uniform(0, 300)]))
    ours = project_simplex(x, total)
    reference = _qp_projection(x, total)
    assert np.allclose(ours, reference, atol=1e-5 * max(1.0, total, float(np.abs(x).max())))
    assert np.allclose(ours, _enumerated_projection(x, total), rtol=1e-9, atol=1e-9)
    assert np.all(ours >= 0) and math.isclose(float(ours.sum()), total, rel_tol=1e-12, abs_tol=1e-9)
    assert np.sum((ours - x) ** 2) <= np.sum((reference - x) ** 2) + 1e-9


def test_projection_kkt_conditions_on_larger_inputs() -> None:
    """y = max(x - theta, 0): positive entries share one shift, zero entries lie below it."""
    rng = np.random.default_rng(11)
    for _ in range(50):
        x = rng.normal(100, 400, size=64)
        y = project_simplex(x, 5000.0)
        positive = y > 0
        shifts = x[positive] - y[positive]
        assert np.ptp(shifts) < 1e-8
        assert np.all(x[~positive] <= shifts[0] + 1e-8)
        assert y.sum() == pytest.approx(5000.0)


def test_projection_fixes_points_already_on_the_simplex_and_commutes_with_shifts() -> None:
    point = np.array([1.0, 2.0, 0.0, 7.0])
    assert np.allclose(project_simplex(point, 10.0), point)
    x = np.array([3.0, -1.0, 8.0])
    assert np.allclose(project_simplex(x + 123.0, 5.0), project_simplex(x, 5.0))
    assert np.array_equal(project_simplex(x, 0.0), np.zeros(3))
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            project_simplex(x, bad)
    with pytest.raises(ValueError):
        project_simplex(np.array([1.0, math.nan]), 1.0)


# ---------------------------------------------------------------- the other steps


def test_clip_suppress_and_top_k() -> None:
    x = np.array([-3.0, 5.0, 2.0, 5.0, 0.5])
    assert np.array_equal(clip_non_negative(x), [0.0, 5.0, 2.0, 5.0, 0.5])
    values, mask = suppress_below(x, 2.0)
    assert np.array_equal(values, [0.0, 5.0, 2.0, 5.0, 0.0])  # 2.0 is not under 2.0
    assert mask.tolist() == [True, False, False, False, True]
    values, mask = top_k(x, 2)
    assert mask.tolist() == [True, False, True, False, True]
    values, mask = top_k(np.array([1.0, 4.0, 4.0, 4.0]), 2)  # ties: lower index first
    assert mask.tolist() == [True, False, False, True]
    assert top_k(x, 0)[1].all() and not top_k(x, 5)[1].any()
    with pytest.raises(ValueError):
        top_k(x, 6)


def test_apply_runs_in_the_documented_order_and_never_touches_its_input() -> None:
    estimates = np.array([120.0, -30.0, 60.0, 5.0, 45.0])
    original = estimates.copy()
    everything = Options(clip_non_negative=True, project_simplex=True, suppress_below=10.0, top_k=2)
    out = apply(estimates, 200.0, everything)
    assert np.array_equal(estimates, original)
    assert out.applied == ["project_simplex", "clip_non_negative", "suppress_below(10)", "top_k(2)"]
    projected = project_simplex(original, 200.0)
    expected, hidden = suppress_below(projected, 10.0)
    expected, dropped = top_k(expected, 2)
    assert np.allclose(out.values, expected)
    assert out.suppressed.tolist() == (hidden | dropped).tolist()
    nothing = apply(estimates, 200.0, Options())
    assert nothing.applied == [] and np.array_equal(nothing.values, original) and not nothing.suppressed.any()
    assert not Options().any and everything.any


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (Options(suppress_below=-1.0), "suppress_below"),
        (Options(suppress_below=math.nan), "suppress_below"),
        (Options(suppress_below=math.inf), "suppress_below"),
        (Options(top_k=6), "top_k"),
        (Options(top_k=-1), "top_k"),
    ],
)
def test_bad_options_are_refused(options: Options, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        options.check(5)


def test_bonferroni() -> None:
    assert bonferroni_confidence(0.95, 10) == pytest.approx(0.995)
    assert bonferroni_z(0.95, 1) == pytest.approx(1.959964, abs=1e-6)
    assert bonferroni_z(0.95, 8) == pytest.approx(NormalDist().inv_cdf(1 - 0.05 / 16))
    assert bonferroni_z(0.9, 20) > bonferroni_z(0.9, 5) > bonferroni_z(0.9, 1)
    with pytest.raises(ValueError):
        bonferroni_confidence(1.0, 3)


# ---------------------------------------------------------------- through the handlers


async def _filled(handlers: AggregatorHandlers, kit: Kit) -> pb.Campaign:
    """A 5-bucket GRR campaign with 1,000 counted reports (one rare and one empty bucket)."""
    labels = ["a", "b", "c", "d", "e"]
    campaign = await handlers.create_campaign(kit.categorical_request("pp", labels=labels, epsilon0=1.0))
    rng = Csprng(key=bytes(range(32)))
    truth = [500, 300, 170, 30, 0]
    values = [v for v, count in enumerate(truth) for _ in range(count)]
    reports = [kit.seal(campaign, v, rng=rng).report for v in values]
    await handlers.ingest_batch(kit.batch_of(campaign.id, reports))
    return campaign


async def test_post_processing_leaves_the_raw_fields_alone(handlers: AggregatorHandlers, kit: Kit) -> None:
    campaign = await _filled(handlers, kit)
    plain = await handlers.query(pb.QueryRequest(campaign_id=campaign.id), binary=False)
    assert list(plain.post_processing_applied) == [] and not plain.simultaneous
    assert [b.processed for b in plain.buckets] == [b.estimate for b in plain.buckets]
    assert not any(b.suppressed for b in plain.buckets)
    options = pb.PostProcessing(clip_non_negative=True, project_simplex=True, suppress_below=100.0, top_k=2)
    processed = await handlers.query(
        pb.QueryRequest(campaign_id=campaign.id, post_processing=options), binary=False
    )
    for before, after in zip(plain.buckets, processed.buckets, strict=True):
        for field in ("label", "raw_count", "estimate", "std_error", "ci_low", "ci_high"):
            assert getattr(before, field) == getattr(after, field), field
    assert list(processed.post_processing_applied) == [
        "project_simplex",
        "clip_non_negative",
        "suppress_below(100)",
        "top_k(2)",
    ]
    expected = postprocess.apply(
        np.array([b.estimate for b in plain.buckets]),
        plain.n,
        postprocess.Options(True, True, 100.0, 2),
    )
    assert [b.processed for b in processed.buckets] == pytest.approx(expected.values.tolist())
    assert [b.suppressed for b in processed.buckets] == expected.suppressed.tolist()
    assert [b.suppressed for b in processed.buckets] == [False, False, True, True, True]
    assert processed.privacy == plain.privacy


async def test_simplex_alone_sums_to_n(handlers: AggregatorHandlers, kit: Kit) -> None:
    campaign = await _filled(handlers, kit)
    answer = await handlers.query(
        pb.QueryRequest(campaign_id=campaign.id, post_processing=pb.PostProcessing(project_simplex=True)),
        binary=False,
    )
    values = [b.processed for b in answer.buckets]
    assert min(values) >= 0 and sum(values) == pytest.approx(answer.n)


async def test_simultaneous_intervals_are_wider_around_the_same_estimate(
    handlers: AggregatorHandlers, kit: Kit
) -> None:
    campaign = await _filled(handlers, kit)
    single = await handlers.query(pb.QueryRequest(campaign_id=campaign.id, confidence=0.9), binary=False)
    joint = await handlers.query(
        pb.QueryRequest(campaign_id=campaign.id, confidence=0.9, simultaneous=True), binary=False
    )
    assert joint.simultaneous and joint.confidence == 0.9
    z1, zk = NormalDist().inv_cdf(0.95), bonferroni_z(0.9, 5)
    for a, b in zip(single.buckets, joint.buckets, strict=True):
        assert (a.estimate, a.std_error) == (b.estimate, b.std_error)
        assert b.ci_low < a.ci_low and b.ci_high > a.ci_high
        assert b.ci_high - b.ci_low == pytest.approx((a.ci_high - a.ci_low) * zk / z1)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (pb.PostProcessing(suppress_below=-5.0), "suppress_below"),
        (pb.PostProcessing(suppress_below=math.nan), "suppress_below"),
        (pb.PostProcessing(top_k=6), "top_k"),
    ],
)
async def test_invalid_post_processing_is_an_invalid_request(
    handlers: AggregatorHandlers, kit: Kit, options: pb.PostProcessing, message: str
) -> None:
    campaign = await handlers.create_campaign(kit.categorical_request("bad", labels=list("abcde")))
    with pytest.raises(InvalidRequest, match=message):
        await handlers.query(pb.QueryRequest(campaign_id=campaign.id, post_processing=options), binary=False)


# ---------------------------------------------------------------- campaigns planned from a target


async def test_campaign_planned_from_a_central_target(handlers: AggregatorHandlers, kit: Kit) -> None:
    request = kit.categorical_request("planned", epsilon0=0.0, target_epsilon=1.0, expected_n=5000, n_min=0)
    campaign = await handlers.create_campaign(request)
    assert campaign.target_epsilon == 1.0 and campaign.expected_n == 5000
    randomiser = randomiser_for(campaign)
    # n_min counts messages: what expected_n devices' worth needs (ADR 0045: flooded's count varies)
    assert campaign.n_min == randomiser.message_threshold(5000), "the guarantee needs shuffles of expected_n"
    assert randomiser.devices_within(campaign.n_min) == 5000
    assert campaign.device_budget_epsilon == campaign.epsilon0
    assert randomiser.central_guarantee(5000, campaign.delta).epsilon <= 1.0
    if randomiser.local_privacy:
        assert campaign.epsilon0 > 1.0
        bigger = type(randomiser)(campaign.epsilon0 * 1.001, 3, **dict(campaign.params))
        assert bigger.central_guarantee(5000, campaign.delta).epsilon > 1.0
    else:
        assert campaign.epsilon0 == 1.0
    stored = await handlers.get_campaign(pb.GetCampaignRequest(campaign_id="planned"))
    assert stored == campaign


async def test_planned_campaign_keeps_the_given_mechanism(handlers: AggregatorHandlers, kit: Kit) -> None:
    request = kit.binary_request(
        "bin", epsilon0=0.0, target_epsilon=0.5, expected_n=2000, mechanism=pb.GRR, n_min=4000
    )
    campaign = await handlers.create_campaign(request)
    assert campaign.mechanism == pb.GRR and campaign.n_min == 4000
    assert randomiser_for(campaign).central_guarantee(2000, campaign.delta).epsilon <= 0.5


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"epsilon0": 1.0, "target_epsilon": 1.0, "expected_n": 100}, "either epsilon0 or target_epsilon"),
        ({"epsilon0": 0.0, "target_epsilon": 1.0}, "expected_n"),
        ({"epsilon0": 0.0, "expected_n": 100}, "needs target_epsilon"),
        ({"epsilon0": 0.0, "target_epsilon": -1.0, "expected_n": 100}, "target_epsilon"),
        ({"epsilon0": 0.0, "target_epsilon": math.nan, "expected_n": 100}, "target_epsilon"),
        ({"epsilon0": 0.0, "target_epsilon": 1.0, "expected_n": 100, "delta": 2.0}, "delta"),
        ({"epsilon0": 0.0, "target_epsilon": 1.0, "expected_n": 100, "labels": ["x"]}, "at least 2"),
        (
            {"epsilon0": 0.0, "target_epsilon": 1.0, "expected_n": 100, "mechanism": pb.BINARY_RR},
            "cannot plan",
        ),
    ],
)
async def test_bad_planning_requests(
    handlers: AggregatorHandlers, kit: Kit, fields: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidRequest, match=message):
        await handlers.create_campaign(kit.categorical_request(**fields))
    assert (await handlers.list_campaigns()).campaigns == []
