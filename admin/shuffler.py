"""A shuffler's operator surface: what it holds, and forwarding it now."""

from __future__ import annotations

from typing import Any

from deniable.admin.rpc import call
from deniable.core.plumbing.tls import Transport
from deniable.v1 import deniable_pb2 as pb


async def spool(shuffler: str, tls: Transport) -> pb.ShufflerStatsResponse:
    """What the shuffler (its operator port) holds, per campaign."""
    return await call(shuffler, lambda s: s.Stats(pb.ShufflerStatsRequest(), timeout=30), "shuffler", tls)


def spool_rows(stats: pb.ShufflerStatsResponse) -> list[dict[str, Any]]:
    """One row per campaign a shuffler holds reports of."""
    return [
        {"campaign": r.campaign_id, "pending": r.pending, "in_flight": r.in_flight} for r in stats.campaigns
    ]


async def release_below_n_min(aggregator: str, campaign_id: str, tls: Transport) -> None:
    """Record at the aggregator that batches of the campaign smaller than n_min may be forwarded.

    ValueError without a campaign: the release is authorised per campaign.
    """
    if not campaign_id:
        raise ValueError("--below-n-min needs --campaign (it is authorised per campaign)")
    release = pb.ReleaseBelowNMinRequest(campaign_id=campaign_id)
    await call(aggregator, lambda s: s.ReleaseBelowNMin(release, timeout=30), tls=tls)


async def flush(
    shuffler: str, tls: Transport, campaign_id: str = "", below_n_min: bool = False
) -> pb.FlushResponse:
    """Forward what the shuffler spools now (one campaign, or all when ``campaign_id`` is empty)."""
    request = pb.FlushRequest(campaign_id=campaign_id, below_n_min=below_n_min)
    return await call(shuffler, lambda s: s.Flush(request, timeout=300), "shuffler", tls)
