"""The device re-checks its policy on the description it sends under, and counts devices, not
messages (issue 20, item 7; ADR 0032)."""

from __future__ import annotations

from typing import Any

import pytest

from deniable.client import InMemoryTransport, Reporter
from deniable.client.outbox import Outbox
from deniable.client.reporter import CampaignPolicyError, DevicePolicy, devices_per_batch
from deniable.core.crypto import SigningKey
from deniable.v1 import deniable_pb2 as pb


def _multi_message(n_min: int) -> pb.Campaign:
    """A split-and-mix histogram: every device sends 65 messages, n_min counts messages."""
    return pb.Campaign(
        id="mm",
        mechanism=pb.MULTI_MESSAGE_HISTOGRAM,
        labels=[f"l{i}" for i in range(8)],
        epsilon0=1.0,
        n_min=n_min,
        params={"expected_n": 1000, "delta": 1e-6},
    )


def test_min_batch_counts_devices_not_messages() -> None:
    """n_min 650 messages is 10 devices: a policy asking for 100 devices refuses it."""
    campaign = _multi_message(650)
    assert devices_per_batch(campaign) == 10
    with pytest.raises(CampaignPolicyError, match="10 devices per batch"):
        DevicePolicy(min_batch=100).check(campaign)
    DevicePolicy(min_batch=10).check(campaign)
    DevicePolicy(min_batch=100).check(_multi_message(6500))


async def test_lowered_n_min_after_fetch_is_refused_before_sending(
    make_campaign: Any, signing_key: SigningKey, outbox: Outbox
) -> None:
    """The aggregator re-signs the campaign with n_min 1 after the device fetched it: nothing is sent."""
    transport = InMemoryTransport([make_campaign(n_min=50)])
    policy = DevicePolicy(min_batch=20)
    reporter = await Reporter.fetch(
        "c1", transport, outbox, aggregator_key=signing_key.public_raw, policy=policy
    )
    reporter.record(3)
    transport.add_campaign(make_campaign(n_min=1))  # validly signed, weaker
    with pytest.raises(CampaignPolicyError, match="n_min changed from 50 to 1"):
        await reporter.send_pending()
    assert transport.submitted == [] and outbox.count("c1") == 1


async def test_the_same_attack_is_sent_without_the_recheck(
    make_campaign: Any, signing_key: SigningKey, outbox: Outbox
) -> None:
    """Checked only at fetch (no policy kept), the report goes out under the weaker description."""
    transport = InMemoryTransport([make_campaign(n_min=50)])
    reporter = await Reporter.fetch(
        "c1", transport, outbox, aggregator_key=signing_key.public_raw, policy=DevicePolicy(min_batch=20)
    )
    reporter.policy = None
    reporter.record(3)
    transport.add_campaign(make_campaign(n_min=1))
    assert (await reporter.send_pending()).acknowledged == 1


async def test_a_policy_breach_other_than_n_min_is_refused_at_send(
    make_campaign: Any, signing_key: SigningKey, outbox: Outbox
) -> None:
    """A description whose ε0 grew past the policy after fetch is refused before sending."""
    transport = InMemoryTransport([make_campaign(n_min=50)])
    reporter = await Reporter.fetch(
        "c1", transport, outbox, aggregator_key=signing_key.public_raw, policy=DevicePolicy(max_epsilon0=1.0)
    )
    reporter.record(3)
    transport.add_campaign(make_campaign(n_min=50, epsilon0=4.0))
    with pytest.raises(CampaignPolicyError, match="exceeds"):
        await reporter.send_pending()
    assert transport.submitted == []


async def test_an_unchanged_description_sends_and_an_unreachable_one_keeps_the_pinned(
    make_campaign: Any, signing_key: SigningKey, outbox: Outbox
) -> None:
    transport = InMemoryTransport([make_campaign(n_min=50)])
    reporter = await Reporter.fetch(
        "c1", transport, outbox, aggregator_key=signing_key.public_raw, policy=DevicePolicy(min_batch=20)
    )
    reporter.record(3)
    assert (await reporter.send_pending()).acknowledged == 1
    transport.fail_next(0)
    del transport.campaigns["c1"]  # GetCampaign now fails permanently: the pinned copy stands
    reporter.record(4)
    result = await reporter.send_pending()
    assert result.acknowledged == 0 and result.rejected == 1  # the fake shuffler no longer knows it
