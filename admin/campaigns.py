"""Campaigns at the aggregator: create, show, list, close and delete, and their JSON form."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from deniable.admin.rpc import call
from deniable.admin.shuffler import spool
from deniable.admin.windows import parse_window
from deniable.core.campaigns import local_epsilon, mechanism_has_local_guarantee
from deniable.core.errors import ConfigurationError
from deniable.core.plumbing.tls import Transport
from deniable.v1 import deniable_pb2 as pb


@dataclass(frozen=True)
class CampaignSpec:
    """What an operator asks for; ``request`` checks it and builds the CreateCampaign request."""

    id: str
    question: str
    kind: str  # "binary" or "categorical"
    labels: Sequence[str] = ()
    mechanism: str | None = None
    epsilon0: float | None = None
    target_epsilon: float | None = None
    expected_n: int = 0
    delta: float = 1e-6
    n_min: int = 0
    budget: float = 0.0
    quota_per_source: int = 0
    kem: str = "x25519"
    window: str | None = None  # a duration from now (90m, 2h, 7d) or an ISO end time
    batch_target: int = 0

    def request(self, now_unix: float) -> pb.CreateCampaignRequest:
        """The request; ValueError (one line) when planning inputs come without each other."""
        mechanism = pb.Mechanism.Value(self.mechanism.upper()) if self.mechanism else pb.MECHANISM_UNSPECIFIED
        if (self.target_epsilon is None) != (self.expected_n == 0):
            raise ValueError("--target-epsilon and --expected-n go together (or give --epsilon0 alone)")
        window_s, window_end = (0, 0) if self.window is None else parse_window(self.window, now_unix)
        return pb.CreateCampaignRequest(
            id=self.id,
            question=self.question,
            kind=pb.BINARY if self.kind == "binary" else pb.CATEGORICAL,
            labels=[label.strip() for label in self.labels if label.strip()],
            mechanism=mechanism,
            epsilon0=self.epsilon0 or 0.0,
            target_epsilon=self.target_epsilon or 0.0,
            expected_n=self.expected_n,
            delta=self.delta,
            n_min=self.n_min,
            device_budget_epsilon=self.budget,
            quota_per_source=self.quota_per_source,
            window_s=window_s,
            window_end_unix=window_end,
            batch_target=self.batch_target,
            kem=self.kem,
        )


async def create_campaign(
    aggregator: str, spec: CampaignSpec | pb.CreateCampaignRequest, tls: Transport
) -> pb.Campaign:
    """Create the campaign (planning, when asked, may take minutes) and return its signed descriptor."""
    request = spec.request(time.time()) if isinstance(spec, CampaignSpec) else spec
    timeout = 300 if request.expected_n else 30
    return await call(aggregator, lambda s: s.CreateCampaign(request, timeout=timeout), tls=tls)


async def get_campaign(aggregator: str, campaign_id: str, tls: Transport) -> pb.Campaign:
    """One campaign's signed descriptor."""
    request = pb.GetCampaignRequest(campaign_id=campaign_id)
    return await call(aggregator, lambda s: s.GetCampaign(request, timeout=30), tls=tls)


async def list_campaigns(aggregator: str, tls: Transport) -> list[pb.Campaign]:
    """Every campaign the aggregator has."""
    listed: pb.ListCampaignsResponse = await call(
        aggregator, lambda s: s.ListCampaigns(pb.ListCampaignsRequest(), timeout=30), tls=tls
    )
    return list(listed.campaigns)


async def close_campaign(aggregator: str, campaign_id: str, tls: Transport) -> pb.Campaign:
    """End the campaign's window now; the aggregator re-signs its descriptor."""
    request = pb.KeyCloseCampaignRequest(campaign_id=campaign_id)
    return await call(aggregator, lambda s: s.CloseCampaign(request, timeout=30), tls=tls)


async def delete_campaign(
    aggregator: str,
    campaign_id: str,
    shufflers: Sequence[str],
    tls: Transport,
    shuffler_tls: Transport | None = None,
) -> pb.StatusDeleteCampaignResponse:
    """Delete a closed campaign; ConfigurationError first if a named shuffler still holds its reports.

    ``shuffler_tls`` reaches the shufflers' operator ports (default ``tls``; with TLS they need
    the shuffler party's CA and a shuffler-operator certificate)."""
    for address in shufflers:
        for row in (await spool(address, shuffler_tls or tls)).campaigns:
            if row.campaign_id == campaign_id and row.pending + row.in_flight:
                raise ConfigurationError(
                    f"shuffler {address} still holds {row.pending + row.in_flight} reports of"
                    f" {campaign_id}: flush it (deniable shuffler flush) before deleting"
                )
    request = pb.StatusDeleteCampaignRequest(campaign_id=campaign_id)
    return await call(aggregator, lambda s: s.DeleteCampaign(request, timeout=60), tls=tls)


def campaign_dict(c: pb.Campaign) -> dict[str, Any]:
    """The descriptor as JSON-ready data, with the local and central guarantees apart."""
    return {
        "id": c.id,
        "question": c.question,
        "kind": pb.DomainKind.Name(c.kind).lower(),
        "labels": list(c.labels),
        "mechanism": pb.Mechanism.Name(c.mechanism).lower(),
        "epsilon0": c.epsilon0,
        "local_guarantee": mechanism_has_local_guarantee(c),
        "local_epsilon": local_epsilon(c),
        "central_target_epsilon": c.target_epsilon
        or (None if mechanism_has_local_guarantee(c) else c.epsilon0),
        "delta": c.delta,
        "n_min": c.n_min,
        "batch_target": c.batch_target,
        "window_start_unix": c.window_start_unix,
        "window_end_unix": c.window_end_unix,
        "closed": c.closed,
        "key_id": c.key_id,
        "hpke_suite": c.hpke_suite,
        "ciphertext_length": c.ciphertext_length,
        "device_budget_epsilon": c.device_budget_epsilon,
        "target_epsilon": c.target_epsilon,
        "expected_n": c.expected_n,
        "params": dict(c.params),
        "signature": c.signature.hex(),
    }
