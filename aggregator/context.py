"""What every aggregator handler shares: the store, the keyring, metrics, the clock and policy."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from deniable.aggregator.keys import Keyring
from deniable.aggregator.metrics import AggregatorMetrics
from deniable.aggregator.store import AggregatorStore
from deniable.core.errors import InvalidRequest, NotFound
from deniable.v1 import deniable_pb2 as pb

DEFAULT_KEY_DRAIN_S: Final = 86_400.0
"""A retired key is destroyed this long after the last campaign sealed to it closed."""
DEFAULT_RETENTION_MARGIN_S: Final = 7 * 86_400.0
"""Report ids are kept this long after a campaign's window ends (late batches still dedupe)."""
DEFAULT_CLOSE_GRACE_S: Final = 900.0
"""A batch arriving this long after a campaign's window ended (or it was closed) is not counted:
the shuffler needs a moment to release what it held at the close, no more (issue 20, item 6)."""


@dataclass
class HandlerContext:
    """State the campaign, ingest, query and key handlers share (one per aggregator process)."""

    store: AggregatorStore
    keyring: Keyring
    metrics: AggregatorMetrics
    clock: Callable[[], float] = time.time
    key_drain_s: float = DEFAULT_KEY_DRAIN_S
    retention_margin_s: float = DEFAULT_RETENTION_MARGIN_S
    close_grace_s: float = DEFAULT_CLOSE_GRACE_S
    keys_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held from picking a campaign's key until the campaign is stored, and by every key state
    change: a sweep never sees a key as unused while a campaign sealed to it is being created."""
    last_batch: dict[str, float] = field(default_factory=dict)
    """When each campaign last had a batch ingested by this process (``Status``)."""

    def signed(self, campaign: pb.Campaign) -> pb.Campaign:
        """The description as devices may see it: signed over its current content (so any change,
        such as a closed window, is re-signed)."""
        return self.keyring.signing.sign_campaign(campaign)

    async def campaign(self, campaign_id: str) -> pb.Campaign:
        """The stored campaign; INVALID_ARGUMENT without an id, NOT_FOUND if there is none."""
        if not campaign_id:
            raise InvalidRequest("campaign_id is required")
        campaign = await self.store.get_campaign(campaign_id)
        if campaign is None:
            raise NotFound(f"no campaign {campaign_id[:80]!r}")
        return campaign

    @staticmethod
    def closed(campaign: pb.Campaign, now: float) -> bool:
        """Whether the campaign's window has ended (an open-ended campaign never has)."""
        return campaign.window_end_unix != 0 and campaign.window_end_unix <= now

    def too_late(self, campaign: pb.Campaign, now: float) -> bool:
        """Whether a batch arriving ``now`` comes after the window's end plus the close grace: it is
        not counted, whatever the shuffler says (its reports become CAMPAIGN_CLOSED)."""
        end = campaign.window_end_unix
        return end != 0 and end + self.close_grace_s <= now

    def expired(self, campaign: pb.Campaign, now: float) -> bool:
        """Whether the campaign's retention ended: window closed more than the margin ago.

        A campaign stored without an end keeps its ids until closed (``deniable campaign close``)."""
        end = campaign.window_end_unix
        return end != 0 and end + self.retention_margin_s <= now
