"""Shuffle-only campaigns carry no local guarantee: the ledger never books them as local epsilon,
and a device that requires local DP refuses them."""

from __future__ import annotations

from typing import Any

import pytest

from deniable.client.budget import BudgetExceeded, BudgetLedger
from deniable.client.outbox import Outbox
from deniable.client.reporter import CampaignRefused, Reporter
from deniable.client.transport import InMemoryTransport
from deniable.core import mechanisms
from deniable.core.campaigns import layout_for, local_epsilon, mechanism_has_local_guarantee
from deniable.v1 import deniable_pb2 as pb

SHUFFLE_ONLY = {
    "cheu_binary_sum",
    "balcer_cheu_histogram",
    "flooded_histogram",
    "multi_message_sum",
    "multi_message_sum_binomial",
    "multi_message_histogram",
    "sample_and_threshold",
}


def shuffle_only_campaign(make_campaign: Any, **overrides: Any) -> pb.Campaign:
    randomiser = mechanisms.create("balcer_cheu_histogram", epsilon0=1.0, domain_size=4, expected_n=1000.0)
    layout = layout_for(randomiser)
    campaign: pb.Campaign = make_campaign(
        campaign_id="bc",
        domain_size=4,
        payload_length=layout.payload_length,
        plaintext_length=layout.plaintext_length,
        ciphertext_length=layout.ciphertext_length,
        device_budget_epsilon=2.0,
        **overrides,
    )
    campaign.mechanism = pb.BALCER_CHEU_HISTOGRAM
    campaign.params.update(randomiser.parameters())
    return campaign


def test_the_predicate_follows_the_mechanism_not_the_description(make_campaign: Any) -> None:
    for name in mechanisms.names():
        assert mechanisms.mechanism_class(name).local_privacy == (name not in SHUFFLE_ONLY), name
    local = make_campaign()
    assert mechanism_has_local_guarantee(local) and local_epsilon(local) == 1.0
    lying = shuffle_only_campaign(make_campaign, local_guarantee=True, local_epsilon=1.0)
    assert not mechanism_has_local_guarantee(lying) and local_epsilon(lying) is None


def test_shuffle_only_reports_are_participations_never_local_epsilon(
    make_campaign: Any, outbox: Outbox
) -> None:
    """Budget 2, target 1: two central-only reports, the third refused; the local spend (and the
    device-wide local limit of 0.5, which a booking as epsilon would break) stays untouched."""
    campaign = shuffle_only_campaign(make_campaign)
    ledger = BudgetLedger(None, total_limit=0.5)
    reporter = Reporter(campaign, outbox, InMemoryTransport([campaign]), ledger)
    reporter.record(1)
    reporter.record(3)
    with pytest.raises(BudgetExceeded, match="central-only"):
        reporter.record(0)
    assert ledger.spent() == 0.0 and ledger.spent("bc") == 0.0
    assert ledger.participations("bc") == 2 and ledger.participations() == 2
    local = make_campaign(epsilon0=0.5, device_budget_epsilon=1.0)
    Reporter(local, outbox, InMemoryTransport([local]), ledger).record(2)
    assert ledger.spent() == 0.5 and ledger.participations() == 2


def test_a_device_requiring_local_dp_refuses_shuffle_only_campaigns(
    make_campaign: Any, outbox: Outbox
) -> None:
    campaign = shuffle_only_campaign(make_campaign)
    with pytest.raises(CampaignRefused, match="no local guarantee"):
        Reporter(campaign, outbox, InMemoryTransport([campaign]), require_local_guarantee=True)
    Reporter(campaign, outbox, InMemoryTransport([campaign]))  # accepted by default
    local = make_campaign()
    Reporter(local, outbox, InMemoryTransport([local]), require_local_guarantee=True)


async def test_fetch_passes_the_requirement_on(make_campaign: Any, outbox: Outbox) -> None:
    campaign = shuffle_only_campaign(make_campaign)
    with pytest.raises(CampaignRefused):
        await Reporter.fetch(
            "bc",
            InMemoryTransport([campaign]),
            outbox,
            require_local_guarantee=True,
            insecure_skip_verify=True,
        )
