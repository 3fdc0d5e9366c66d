"""Devices pin a campaign's incarnation: an older life of the same id is refused (issue 20, item 5).

The attack: the aggregator deletes campaign ``c1`` (ε0 = 1) and creates it again (ε0 = 4); the old
signed description still verifies, so a shuffler (or anyone caching descriptions) could serve
either to a device. Without pinning, a device that joined the first life would follow the second;
with pinning it refuses every description whose incarnation differs from the one it first saw.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from deniable.client.budget import BudgetLedger, IncarnationMismatch
from deniable.client.outbox import Outbox
from deniable.client.reporter import CampaignInvalid, Reporter
from deniable.client.transport import InMemoryTransport
from deniable.core.crypto import KeyPair, open_report
from deniable.core.crypto.envelope import DecryptionError
from deniable.core.wire import decode

from .conftest import CampaignFactory

FIRST = bytes(range(16))
SECOND = bytes(range(16, 32))


def test_a_ledger_pins_the_first_incarnation_and_refuses_another(tmp_path: Path) -> None:
    with BudgetLedger(tmp_path / "ledger.db") as ledger:
        ledger.pin_incarnation("c1", FIRST)
        ledger.pin_incarnation("c1", FIRST)  # the same life again is fine
        with pytest.raises(IncarnationMismatch, match="another incarnation"):
            ledger.pin_incarnation("c1", SECOND)
        ledger.pin_incarnation("c2", SECOND)  # other ids are independent
    with BudgetLedger(tmp_path / "ledger.db") as reopened, pytest.raises(IncarnationMismatch):
        reopened.pin_incarnation("c1", SECOND)  # the pin survives a restart


def test_descriptions_without_an_incarnation_are_neither_pinned_nor_refused() -> None:
    with BudgetLedger() as ledger:
        ledger.pin_incarnation("c1", b"")
        ledger.pin_incarnation("c1", FIRST)
        ledger.pin_incarnation("c1", b"")


def test_a_device_refuses_an_older_life_of_a_campaign_id(
    make_campaign: CampaignFactory, outbox: Outbox
) -> None:
    """Recreated with a larger ε0: the device that joined the new life refuses the old one, and
    the other way round; without a ledger (no pin) the old life would be accepted."""
    old = make_campaign("c1", incarnation=FIRST)
    new = make_campaign("c1", incarnation=SECOND, epsilon0=4.0, device_budget_epsilon=4.0)
    with BudgetLedger() as ledger:
        Reporter(new, outbox, InMemoryTransport(), ledger)
        with pytest.raises(CampaignInvalid, match="another incarnation"):
            Reporter(old, outbox, InMemoryTransport(), ledger)
    Reporter(old, outbox, InMemoryTransport())  # the protection removed: nothing stops it


def test_a_report_opens_only_under_its_own_incarnation(
    make_campaign: CampaignFactory, outbox: Outbox, key_pair: KeyPair
) -> None:
    """The sealed report binds the incarnation: the aggregator of a recreated id cannot open it."""
    campaign = make_campaign("c1", incarnation=FIRST)
    reporter = Reporter(campaign, outbox, InMemoryTransport())
    reporter.record(3)
    (queued,) = outbox.pending(10, campaign.id)
    ciphertext = queued.to_proto().ciphertext
    plain = decode(open_report(ciphertext, key_pair, "c1", FIRST), campaign.plaintext_length)
    assert plain.campaign_id == "c1"
    with pytest.raises(DecryptionError):
        open_report(ciphertext, key_pair, "c1", SECOND)
    with pytest.raises(DecryptionError):
        open_report(ciphertext, key_pair, "c1")
