"""Queries: the aggregator's estimates with confidence intervals and the privacy statement."""

from __future__ import annotations

from deniable.admin.rpc import call
from deniable.core.plumbing.tls import Transport
from deniable.v1 import deniable_pb2 as pb


async def query(
    aggregator: str, request: pb.QueryRequest, tls: Transport, binary: bool = False
) -> pb.QueryResponse:
    """A histogram, or with ``binary`` the estimated number of yes answers."""
    return await call(
        aggregator, lambda s: (s.BinarySum if binary else s.Histogram)(request, timeout=60), tls=tls
    )
