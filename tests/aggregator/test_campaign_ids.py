"""A campaign id is never reused, and reports of one incarnation never count in another (issue 20, item 5).

The reproduced attack: ``DeleteCampaign`` then ``CreateCampaign`` with the same id (ε0 1 → 4);
the old signed description still verified on devices and old ciphertexts replayed into the new
campaign were counted. Now the re-creation is refused (the id is tombstoned) and, as a second
wall, a ciphertext sealed for one incarnation does not open under another.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from deniable.aggregator.handlers import AggregatorHandlers
from deniable.core.errors import AlreadyExists
from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:  # the kit fixture's type only
    from support.aggregator_kit import Kit


async def test_a_deleted_id_is_never_created_again(handlers: AggregatorHandlers, kit: Kit) -> None:
    first = await handlers.create_campaign(kit.binary_request("dark-mode", epsilon0=1.0))
    assert len(first.incarnation) == 16
    await handlers.close_campaign(pb.KeyCloseCampaignRequest(campaign_id="dark-mode"))
    await handlers.delete_campaign(pb.StatusDeleteCampaignRequest(campaign_id="dark-mode"))
    with pytest.raises(AlreadyExists, match="never reused"):
        await handlers.create_campaign(kit.binary_request("dark-mode", epsilon0=4.0))
    other = await handlers.create_campaign(kit.binary_request("dark-mode-2", epsilon0=4.0))
    assert other.incarnation != first.incarnation


async def test_every_creation_draws_a_fresh_incarnation(handlers: AggregatorHandlers, kit: Kit) -> None:
    made = [await handlers.create_campaign(kit.binary_request(f"c{i}")) for i in range(5)]
    assert len({c.incarnation for c in made}) == 5


async def test_reports_of_another_incarnation_are_never_counted(
    handlers: AggregatorHandlers, kit: Kit
) -> None:
    """Even if a campaign of the same id came back (a restored backup, a store edited by hand),
    reports sealed for the old life fail to open: UNDECRYPTABLE, nothing counted. With the
    incarnation left out of the HPKE info (the protection removed) they would open and count."""
    campaign = await handlers.create_campaign(kit.binary_request("replayed"))
    old_reports = [kit.seal(campaign, 1).report for _ in range(4)]
    later = pb.Campaign()
    later.CopyFrom(campaign)
    later.incarnation = bytes(16)
    await handlers.save_campaign(later)
    response = await handlers.ingest_batch(kit.batch_of("replayed", old_reports))
    assert response.counted == 0
    assert kit.rejected_map(response) == {pb.UNDECRYPTABLE: 4}
    fresh = await handlers.ingest_batch(
        kit.batch_of("replayed", [kit.seal(later, 1).report for _ in range(4)])
    )
    assert fresh.counted == 4
