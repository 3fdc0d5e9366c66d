"""What the console asks of a deployment, as one interface: ``AdminBackend`` answers through
``deniable.admin`` (TLS with the operator's certificate); tests pass a fake with the same methods."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from deniable.admin.campaigns import (
    CampaignSpec,
    close_campaign,
    create_campaign,
    get_campaign,
    list_campaigns,
)
from deniable.admin.keys import list_keys, rotate_key
from deniable.admin.queries import query
from deniable.admin.shuffler import release_below_n_min
from deniable.admin.status import gather_status
from deniable.core.plumbing.tls import Transport
from deniable.v1 import deniable_pb2 as pb


class Backend(Protocol):
    """The reads and the four actions the console offers."""

    async def status(self) -> dict[str, Any]:
        """``deniable.admin.status.gather_status``'s dict."""

    async def campaigns(self) -> list[pb.Campaign]:
        """Every campaign's descriptor."""

    async def campaign(self, campaign_id: str) -> pb.Campaign:
        """One signed descriptor."""

    async def estimate(self, campaign_id: str, binary: bool, simultaneous: bool) -> pb.QueryResponse:
        """The query answer at 95 % (per bucket, or simultaneous over the buckets)."""

    async def keys(self) -> pb.ListKeysResponse:
        """The keyring."""

    async def create(self, spec: CampaignSpec) -> pb.Campaign:
        """Create a campaign."""

    async def close(self, campaign_id: str) -> pb.Campaign:
        """Close a campaign's window now."""

    async def release(self, campaign_id: str) -> None:
        """Authorise batches below n_min for a campaign."""

    async def rotate(self, kem: str) -> pb.KeyInfo:
        """A new active HPKE key."""


@dataclass(frozen=True)
class AdminBackend:
    """The aggregator (and optionally a shuffler's operator port) through ``deniable.admin``."""

    aggregator: str
    tls: Transport
    shuffler_operator: str | None = None
    shuffler_tls: Transport | None = None
    """The shuffler party's CA and a shuffler-operator certificate (the aggregator's is refused there)."""

    async def status(self) -> dict[str, Any]:
        """Campaigns, keys, and what the shuffler holds when its operator address is known."""
        shufflers = [self.shuffler_operator] if self.shuffler_operator else []
        return await gather_status(self.aggregator, shufflers, self.tls, self.shuffler_tls)

    async def campaigns(self) -> list[pb.Campaign]:
        """Every campaign's descriptor."""
        return await list_campaigns(self.aggregator, self.tls)

    async def campaign(self, campaign_id: str) -> pb.Campaign:
        """One signed descriptor."""
        return await get_campaign(self.aggregator, campaign_id, self.tls)

    async def estimate(self, campaign_id: str, binary: bool, simultaneous: bool) -> pb.QueryResponse:
        """BinarySum or Histogram at 95 %."""
        request = pb.QueryRequest(campaign_id=campaign_id, confidence=0.95, simultaneous=simultaneous)
        return await query(self.aggregator, request, self.tls, binary=binary)

    async def keys(self) -> pb.ListKeysResponse:
        """The keyring as the running aggregator has it."""
        return await list_keys(self.aggregator, self.tls)

    async def create(self, spec: CampaignSpec) -> pb.Campaign:
        """Create (the aggregator signs the descriptor)."""
        return await create_campaign(self.aggregator, spec, self.tls)

    async def close(self, campaign_id: str) -> pb.Campaign:
        """Close now."""
        return await close_campaign(self.aggregator, campaign_id, self.tls)

    async def release(self, campaign_id: str) -> None:
        """Authorise batches below n_min (recorded and stated in answers)."""
        await release_below_n_min(self.aggregator, campaign_id, self.tls)

    async def rotate(self, kem: str) -> pb.KeyInfo:
        """Rotate the HPKE key."""
        return await rotate_key(self.aggregator, kem, self.tls)
