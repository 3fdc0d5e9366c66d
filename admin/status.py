"""A running deployment in one JSON-able dict: the aggregator's campaigns and keys, the shufflers'
spools (ADR 0021: through the operator surfaces)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import grpc

from deniable.admin.rpc import call
from deniable.admin.shuffler import spool, spool_rows
from deniable.core.plumbing.tls import Transport
from deniable.v1 import deniable_pb2 as pb


async def gather_status(
    aggregator: str, shufflers: Sequence[str], tls: Transport, shuffler_tls: Transport | None = None
) -> dict[str, Any]:
    """The deployment as one JSON-able dict; an unreachable shuffler is reported, not fatal.

    ``shuffler_tls`` reaches the shufflers' operator ports (default ``tls``)."""
    answer: pb.StatusResponse = await call(
        aggregator, lambda s: s.Status(pb.StatusRequest(), timeout=30), tls=tls
    )
    spools = await asyncio.gather(*(spool(a, shuffler_tls or tls) for a in shufflers), return_exceptions=True)
    held: dict[str, dict[str, int]] = {}
    shuffler_rows: list[dict[str, Any]] = []
    for address, stats in zip(shufflers, spools, strict=True):
        if isinstance(stats, BaseException):
            shuffler_rows.append({"address": address, "error": _error(stats)})
            continue
        shuffler_rows.append({"address": address, "campaigns": spool_rows(stats)})
        for row in stats.campaigns:
            total = held.setdefault(row.campaign_id, {"pending": 0, "in_flight": 0})
            total["pending"] += row.pending
            total["in_flight"] += row.in_flight
    return {
        "aggregator": {"address": aggregator, "version": answer.version, "now_unix": answer.now_unix},
        "campaigns": [_campaign_row(c, held.get(c.campaign.id)) for c in answer.campaigns],
        "keys": [
            {"key_id": k.key_id, "state": k.state, "kem": k.kem, "campaigns": list(k.campaigns)}
            for k in answer.keys
        ],
        "shufflers": shuffler_rows,
    }


def _error(exc: BaseException) -> str:
    """A failed shuffler call in one line."""
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"


def _campaign_row(row: pb.StatusCampaign, held: dict[str, int] | None) -> dict[str, Any]:
    """One campaign's counts at the aggregator and what the shufflers still hold of it."""
    c = row.campaign
    return {
        "id": c.id,
        "question": c.question,
        "mechanism": pb.Mechanism.Name(c.mechanism).lower(),
        "n_min": c.n_min,
        "batch_target": c.batch_target or c.expected_n or c.n_min,
        "window_end_unix": c.window_end_unix or None,
        "closed": row.closed,
        "counted": row.counted,
        "batches": row.batches,
        "smallest_batch": row.smallest_batch,
        "last_batch_unix": row.last_batch_unix or None,
        "rejected": {r.reason: r.count for r in row.rejected},
        "key_id": c.key_id,
        "held_at_shufflers": held,
    }
