"""Issue 8 item 8 end to end: every query answer states its manipulation budget, and m fake
well-formed reports sent through the real ingest path move the estimate no further than stated."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from deniable.aggregator.handlers import AggregatorHandlers
from deniable.core.campaigns import randomiser_for
from deniable.sim.render import answer_json, manipulation_line
from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:  # the kit fixture's type only
    from support.aggregator_kit import Kit


async def _fakes_move_within_budget(
    handlers: AggregatorHandlers,
    kit: Kit,
    campaign: pb.Campaign,
    before: pb.QueryResponse,
    target: int,
    payload: bytes,
) -> float:
    """Ingest the budget's m fakes carrying ``payload``: every estimate moves within the stated budget
    and the ``target`` bucket by exactly its max_raise (attained); how far the target moved."""
    budget = before.manipulation
    fakes = [kit.seal(campaign, payload=payload).report for _ in range(budget.fake_reports)]
    await handlers.ingest_batch(kit.batch_of(campaign.id, fakes, "fakes"))
    after = await handlers.query(pb.QueryRequest(campaign_id=campaign.id), binary=False)
    for j, (old, new) in enumerate(zip(before.buckets, after.buckets, strict=True)):
        moved = new.estimate - old.estimate
        assert -budget.max_lower[j] - 1e-6 <= moved <= budget.max_raise[j] + 1e-6
    moved_target = after.buckets[target].estimate - before.buckets[target].estimate
    assert moved_target == pytest.approx(budget.max_raise[target], rel=1e-6)  # attained
    return moved_target


async def test_fake_reports_move_the_estimate_within_the_stated_budget(
    handlers: AggregatorHandlers, kit: Kit
) -> None:
    campaign = await handlers.create_campaign(kit.categorical_request(epsilon0=1.0))
    honest = [kit.seal(campaign, i % 3).report for i in range(1000)]
    await handlers.ingest_batch(kit.batch_of(campaign.id, honest, "honest"))
    before = await handlers.query(pb.QueryRequest(campaign_id=campaign.id), binary=False)
    budget = before.manipulation
    assert budget.computed and budget.fake_reports == 10 and "1%" in budget.rule
    assert len(budget.max_raise) == len(budget.max_lower) == 3
    target = 2  # the attacker's bucket: m copies of the payload that pushes it up most
    payload = randomiser_for(campaign).fake_payloads()[target]  # type: ignore[index]
    moved_target = await _fakes_move_within_budget(handlers, kit, campaign, before, target, payload)
    assert moved_target > 0.99 * budget.max_raise[target]  # a smaller bound would be violated


async def test_the_budget_is_shown_in_text_and_json(handlers: AggregatorHandlers, kit: Kit) -> None:
    campaign = await handlers.create_campaign(kit.binary_request())
    batch = [kit.seal(campaign, i % 2).report for i in range(200)]
    await handlers.ingest_batch(kit.batch_of(campaign.id, batch, "b"))
    answer = await handlers.query(pb.QueryRequest(campaign_id=campaign.id), binary=True)
    line = manipulation_line(answer)
    assert line.startswith("manipulation: 2 fake well-formed reports") and "raise" in line
    shown = answer_json(answer)["manipulation"]
    assert shown["fake_reports"] == 2 and shown["computed"] is True
    assert [b["label"] for b in shown["buckets"]] == ["no", "yes"]
    assert shown["buckets"][1]["max_raise"] == pytest.approx(2 * shown["buckets"][1]["max_raise_per_report"])


async def test_every_mechanism_states_a_bound_or_why_there_is_none(
    handlers: AggregatorHandlers, kit: Kit
) -> None:
    """Changed by the budget branch: 300 buckets used to say "not derived"; now the closed form
    answers, and a split-and-mix sum says it is unbounded (one fake device sets the sum mod q)."""
    labels = [f"l{i}" for i in range(300)]
    campaign = await handlers.create_campaign(kit.categorical_request("wide", labels, epsilon0=1.0))
    answer = await handlers.query(pb.QueryRequest(campaign_id=campaign.id), binary=False)
    assert answer.manipulation.computed and len(answer.manipulation.max_raise) == 300
    assert min(answer.manipulation.max_raise) > 0 and min(answer.manipulation.max_lower) > 0
    params = {"expected_n": 500.0, "delta": 1e-6}
    split = await handlers.create_campaign(
        kit.binary_request("sum", mechanism=pb.MULTI_MESSAGE_SUM, params=params)
    )
    answer = await handlers.query(pb.QueryRequest(campaign_id=split.id), binary=True)
    assert not answer.manipulation.computed and answer.manipulation.note.startswith("unbounded")
    assert "unbounded" in manipulation_line(answer)


async def test_an_operator_given_m_scales_the_budget_and_is_named(
    handlers: AggregatorHandlers, kit: Kit
) -> None:
    """The operator may state m (e.g. quota × sources); the budget is linear in it and says so."""
    from deniable.core.errors import InvalidRequest

    campaign = await handlers.create_campaign(kit.binary_request())
    batch = [kit.seal(campaign, i % 2).report for i in range(200)]
    await handlers.ingest_batch(kit.batch_of(campaign.id, batch, "b"))
    default = await handlers.query(pb.QueryRequest(campaign_id=campaign.id), binary=True)
    given = await handlers.query(pb.QueryRequest(campaign_id=campaign.id, fake_reports=50), binary=True)
    assert given.manipulation.fake_reports == 50 and "operator" in given.manipulation.rule
    assert given.manipulation.max_raise[1] == pytest.approx(25 * default.manipulation.max_raise[1])
    with pytest.raises(InvalidRequest, match="fake_reports"):
        await handlers.query(pb.QueryRequest(campaign_id=campaign.id, fake_reports=2**60), binary=True)


def _supporting_payload(campaign: pb.Campaign, target: int) -> bytes:
    """A payload the randomiser emits that counts towards ``target`` (the one pushing it up most)."""
    randomiser = randomiser_for(campaign)
    for _ in range(200):  # P[a report of the target supports it] >= 1/2 for these mechanisms
        payload = randomiser.randomise(target)
        one = randomiser.tally([payload]).counts
        support = randomiser.support_counts(one) if hasattr(randomiser, "support_counts") else one
        if support[target]:
            return payload
    raise AssertionError("no supporting payload in 200 draws")  # probability < 2**-200


@pytest.mark.parametrize(
    ("mechanism", "params"),
    [(pb.OLH, {}), (pb.HADAMARD_RESPONSE, {}), (pb.SUBSET_SELECTION, {}), (pb.OUE, {})],
)
async def test_closed_form_budgets_hold_through_the_real_ingest_path(
    handlers: AggregatorHandlers, kit: Kit, mechanism: int, params: dict[str, float]
) -> None:
    """Mechanisms that used to say "not derived" (20 buckets): m fakes move each estimate within
    the stated budget and the target bucket by exactly its max_raise."""
    labels = [f"l{i}" for i in range(20)]
    request = kit.categorical_request("wide", labels, mechanism=mechanism, params=params)
    campaign = await handlers.create_campaign(request)
    honest = [kit.seal(campaign, i % 20).report for i in range(400)]
    await handlers.ingest_batch(kit.batch_of(campaign.id, honest, "honest"))
    before = await handlers.query(pb.QueryRequest(campaign_id=campaign.id), binary=False)
    budget = before.manipulation
    assert budget.computed and budget.fake_reports == 4 and len(budget.max_raise) == 20
    target = 3
    payload = _supporting_payload(campaign, target)
    await _fakes_move_within_budget(handlers, kit, campaign, before, target, payload)
