"""The shuffler keeps its own floor (issue 20, item 7; ADR 0032).

An aggregator that lowers n_min or the batch target, or closes early, after devices joined must
not get a one-request release; descriptions below the shuffler's configured minimums, or not
signed by the configured aggregator key, are refused and counted.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from deniable.core.crypto import SigningKey
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc

CAMPAIGN = "floor"


def _refused(shuffler: Any, reason: str) -> float:
    value = shuffler.metrics.registry.get_sample_value(
        "deniable_shuffler_descriptions_refused_total", {"reason": reason}
    )
    return float(value or 0.0)


async def _one_request(
    stub: deniable_pb2_grpc.ShufflerAsyncStub, kit: SimpleNamespace, campaign: pb.Campaign
) -> None:
    """A single device's request, accepted and spooled."""
    answer = await stub.SubmitReports(
        pb.SubmitReportsRequest(reports=kit.make_reports(campaign, 1)), timeout=5
    )
    assert answer.accepted == 1


async def _lower_after_join(
    upstream: Any, start: Any, channel_to: Any, kit: SimpleNamespace, **floor: Any
) -> Any:
    """Devices join under n_min 5; the aggregator then lowers n_min to 1 and closes the window."""
    signer = SigningKey.generate()
    fair = signer.sign_campaign(kit.make_campaign(CAMPAIGN, n_min=5, batch_target=5))
    upstream.fake.add(fair)
    shuffler = await start(signing_key=signer.public_raw.hex(), campaign_ttl_s=0.0, **floor)
    stub = channel_to(shuffler)
    await _one_request(stub, kit, fair)
    lowered = kit.make_campaign(CAMPAIGN, n_min=1, batch_target=1, closed=True)
    upstream.fake.add(signer.sign_campaign(lowered))
    await shuffler.handlers.directory.refresh(CAMPAIGN, force=True)
    await shuffler.flush()  # what the batcher does at every tick, operator override aside
    return shuffler


async def test_aggregator_lowering_n_min_after_devices_joined_gets_no_release(
    upstream: Any, start: Any, channel_to: Any, kit: SimpleNamespace
) -> None:
    shuffler = await _lower_after_join(upstream, start, channel_to, kit)
    assert upstream.fake.calls == []  # no one-request release
    assert shuffler.handlers.store.pending_count(CAMPAIGN) == 1
    pinned = await shuffler.handlers.directory.get(CAMPAIGN)
    assert pinned is not None and pinned.n_min == 5 and not pinned.closed
    assert _refused(shuffler, "n_min") >= 1


async def test_the_same_attack_succeeds_without_the_floor(
    upstream: Any, start: Any, channel_to: Any, kit: SimpleNamespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the pinning removed the lowered description is taken and one request is released alone."""
    monkeypatch.setattr("deniable.shuffler.campaigns.change_refused", lambda old, new: None)
    shuffler = await _lower_after_join(upstream, start, channel_to, kit)
    await kit.eventually(lambda: len(upstream.fake.acked) == 1)
    assert len(upstream.fake.acked[0].reports) == 1
    assert shuffler.handlers.store.pending_count(CAMPAIGN) == 0


async def test_configured_minimum_refuses_a_lower_description(
    upstream: Any, start: Any, channel_to: Any, kit: SimpleNamespace
) -> None:
    """A description with n_min 1 below the shuffler's --min-n-min 3 is refused: nothing accepted."""
    upstream.fake.add(kit.make_campaign(CAMPAIGN, n_min=1, batch_target=1))
    shuffler = await start(min_n_min=3)
    stub = channel_to(shuffler)
    answer = await stub.SubmitReports(
        pb.SubmitReportsRequest(reports=kit.make_reports(kit.make_campaign(CAMPAIGN), 1)), timeout=5
    )
    assert answer.accepted == 0 and answer.rejected[0].reason == pb.UNKNOWN_CAMPAIGN
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.GetCampaign(pb.GetCampaignRequest(campaign_id=CAMPAIGN), timeout=5)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert _refused(shuffler, "n_min") >= 1


async def test_configured_batch_target_floor_holds_a_release(
    upstream: Any, start: Any, channel_to: Any, kit: SimpleNamespace
) -> None:
    """n_min 2, target 2 described, floor target 3: refused; floor target 2: two reports released."""
    upstream.fake.add(kit.make_campaign(CAMPAIGN, n_min=2, batch_target=2))
    shuffler = await start(min_batch_target=3)
    assert await shuffler.handlers.directory.get(CAMPAIGN) is None
    assert _refused(shuffler, "batch") >= 1


async def test_floor_raises_the_release_point_of_an_accepted_description(
    upstream: Any, start: Any, channel_to: Any, kit: SimpleNamespace
) -> None:
    """A description at the floor is accepted; batches are released at max(floor, description)."""
    campaign = upstream.fake.add(kit.make_campaign(CAMPAIGN, n_min=2, batch_target=2))
    shuffler = await start(min_n_min=2, min_batch_target=2)
    stub = channel_to(shuffler)
    await _one_request(stub, kit, campaign)
    await shuffler.flush()
    assert upstream.fake.calls == []  # one device: below the floor, held
    await _one_request(stub, kit, campaign)
    await kit.eventually(lambda: len(upstream.fake.acked) == 1)
    assert len(upstream.fake.acked[0].reports) == 2


async def test_unsigned_or_foreign_descriptions_are_refused_with_a_key(
    upstream: Any, start: Any, kit: SimpleNamespace
) -> None:
    signer, stranger = SigningKey.generate(), SigningKey.generate()
    upstream.fake.add(kit.make_campaign("unsigned"))
    upstream.fake.add(stranger.sign_campaign(kit.make_campaign("foreign")))
    upstream.fake.add(signer.sign_campaign(kit.make_campaign("good")))
    shuffler = await start(signing_key=signer.public_raw.hex())
    directory = shuffler.handlers.directory
    assert await directory.get("unsigned") is None
    assert await directory.get("foreign") is None
    assert (await directory.get("good")) is not None
    assert _refused(shuffler, "signature") == 2


async def test_a_forged_lower_n_min_is_refused_even_before_devices_join(
    upstream: Any, start: Any, kit: SimpleNamespace
) -> None:
    """An altered copy of a signed description (n_min lowered, old signature kept) never verifies."""
    signer = SigningKey.generate()
    signed = signer.sign_campaign(kit.make_campaign(CAMPAIGN, n_min=5))
    forged = pb.Campaign()
    forged.CopyFrom(signed)
    forged.n_min = 1
    upstream.fake.add(forged)
    shuffler = await start(signing_key=signer.public_raw.hex())
    assert await shuffler.handlers.directory.get(CAMPAIGN) is None


async def test_raising_n_min_before_anyone_joined_is_accepted(
    upstream: Any, start: Any, kit: SimpleNamespace
) -> None:
    """Pinning applies only once this shuffler holds reports: an idle campaign may change."""
    upstream.fake.add(kit.make_campaign(CAMPAIGN, n_min=5))
    shuffler = await start(campaign_ttl_s=0.0)
    directory = shuffler.handlers.directory
    assert (await directory.get(CAMPAIGN)).n_min == 5
    upstream.fake.add(kit.make_campaign(CAMPAIGN, n_min=3))
    await directory.refresh(CAMPAIGN, force=True)
    await asyncio.sleep(0)
    assert (await directory.get(CAMPAIGN)).n_min == 3


async def test_list_relays_only_accepted_descriptions(
    upstream: Any, start: Any, kit: SimpleNamespace
) -> None:
    """ListCampaigns (and so the MQTT announcements) never relays a description the floor refused."""
    upstream.fake.add(kit.make_campaign("low", n_min=1))
    upstream.fake.add(kit.make_campaign("fine", n_min=5))
    shuffler = await start(min_n_min=3)
    listed = await shuffler.handlers.list_campaigns()
    assert [c.id for c in listed.campaigns] == ["fine"]
