"""The aggregator's side of the benchmarks: a sink that only acknowledges, and shuffled batches.

``bench`` and ``bench --memory`` measure the shuffler alone against ``SinkAggregator`` (it serves
the campaign and counts what it is sent, decrypting nothing), and the aggregator alone by sending
it pre-serialised ``ShuffledBatch`` messages, as a shuffler's forwarder would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import grpc

from deniable.core.batches import batch_digest
from deniable.sim import benchkit
from deniable.v1 import deniable_pb2 as pb


class SinkAggregator:
    """Serves some campaigns and acknowledges every batch without decrypting anything.

    Only the three RPCs a shuffler calls are served; gRPC answers UNIMPLEMENTED for the rest.
    """

    def __init__(self, campaigns: Sequence[pb.Campaign]) -> None:
        self.campaigns = {c.id: c for c in campaigns}
        self.reports = 0
        self.batches = 0

    async def GetCampaign(self, request: pb.GetCampaignRequest, context: Any) -> pb.Campaign:  # noqa: N802
        campaign = self.campaigns.get(request.campaign_id)
        if campaign is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such campaign")
            raise AssertionError("abort returned")
        return campaign

    async def ListCampaigns(  # noqa: N802
        self, request: pb.ListCampaignsRequest, context: Any
    ) -> pb.ListCampaignsResponse:
        return pb.ListCampaignsResponse(campaigns=list(self.campaigns.values()))

    async def IngestBatch(self, request: pb.ShuffledBatch, context: Any) -> pb.IngestBatchResponse:  # noqa: N802
        self.batches += 1
        self.reports += len(request.reports)
        return pb.IngestBatchResponse(batch_id=request.batch_id, counted=len(request.reports))

    def handler(self) -> grpc.GenericRpcHandler:
        """The served RPCs under the Aggregator service's name."""
        served: dict[str, tuple[Any, Any, Any]] = {
            "GetCampaign": (self.GetCampaign, pb.GetCampaignRequest, pb.Campaign),
            "ListCampaigns": (self.ListCampaigns, pb.ListCampaignsRequest, pb.ListCampaignsResponse),
            "IngestBatch": (self.IngestBatch, pb.ShuffledBatch, pb.IngestBatchResponse),
        }
        return grpc.method_handlers_generic_handler(
            "deniable.v1.Aggregator",
            {
                name: grpc.unary_unary_rpc_method_handler(
                    method,
                    request_deserializer=request.FromString,
                    response_serializer=response.SerializeToString,
                )
                for name, (method, request, response) in served.items()
            },
        )


async def start_sink(campaigns: Sequence[pb.Campaign]) -> tuple[grpc.aio.Server, SinkAggregator, str]:
    """The sink on a free loopback port: (server, sink, address)."""
    from deniable.core.plumbing import service

    sink = SinkAggregator(campaigns)
    server = service.new_server()
    server.add_generic_rpc_handlers((sink.handler(),))
    port = service.bind(server, "127.0.0.1:0")
    await server.start()
    return server, sink, f"127.0.0.1:{port}"


def shuffled_batches(sealed: benchkit.Sealed, size: int, prefix: str) -> list[tuple[bytes, int]]:
    """Pre-serialised ShuffledBatch messages of ``size`` reports (the order a shuffler would send)."""
    campaign = sealed.campaign
    out = []
    for index, start in enumerate(range(0, sealed.count, size)):
        chunk = sealed.ciphertexts[start : start + size]
        head = pb.ShuffledBatch(
            batch_id=f"{prefix}-{index:06d}", campaign_id=campaign.id, digest=batch_digest(chunk)
        ).SerializeToString()
        elements = benchkit.report_elements(campaign.id, campaign.key_id, chunk, field_number=3)
        out.append((head + b"".join(elements), len(chunk)))
    return out


async def ingest_batches(address: str, batches: Sequence[tuple[bytes, int]], concurrency: int = 1) -> int:
    """IngestBatch each pre-serialised batch, ``concurrency`` at a time (the forwarder's window)."""
    channel = benchkit.plaintext_channel(address)
    ingest = channel.unary_unary(
        benchkit.INGEST_METHOD,
        request_serializer=lambda raw: raw,
        response_deserializer=pb.IngestBatchResponse.FromString,
    )
    counted = 0
    queue = list(reversed(batches))

    async def worker() -> None:
        nonlocal counted
        while queue:
            raw, _ = queue.pop()
            response: pb.IngestBatchResponse = await ingest(raw, timeout=600)
            counted += response.counted

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await channel.close()
    return counted
