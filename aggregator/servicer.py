"""gRPC face of the aggregator: each RPC calls one handler and maps its errors to a status.

Unexpected exceptions are logged (method name only, never a client identifier) and become
INTERNAL; nothing a request does can take the server down.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import TypeVar

import grpc

from deniable.aggregator.handlers import AggregatorHandlers
from deniable.core.errors import RequestRefused
from deniable.core.plumbing.service import status_code
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc

R = TypeVar("R")
log = logging.getLogger("deniable.aggregator")


class AggregatorServicer(pb_grpc.AggregatorServicer):
    """Thin adapter from grpc.aio to ``AggregatorHandlers``."""

    def __init__(self, handlers: AggregatorHandlers) -> None:
        """Serve ``handlers``; failures are counted in ``handlers.metrics``."""
        self._handlers = handlers

    async def _call(self, rpc: str, context: grpc.aio.ServicerContext[object, R], call: Awaitable[R]) -> R:
        try:
            return await call
        except RequestRefused as exc:
            code = status_code(exc)
            message = str(exc)
        except Exception:
            log.exception("unexpected error", extra={"rpc": rpc})
            code, message = grpc.StatusCode.INTERNAL, "internal error (logged at the aggregator)"
        self._handlers.metrics.failed(rpc, code.name)
        await context.abort(code, message)

    async def CreateCampaign(  # noqa: N802 (gRPC method name)
        self, request: pb.CreateCampaignRequest, context: grpc.aio.ServicerContext[object, pb.Campaign]
    ) -> pb.Campaign:
        """Create a campaign (the aggregator owns campaigns and their keys)."""
        work = self._handlers.create_campaign(request, deadline_s=context.time_remaining())
        return await self._call("CreateCampaign", context, work)

    async def GetCampaign(  # noqa: N802 (gRPC method name)
        self, request: pb.GetCampaignRequest, context: grpc.aio.ServicerContext[object, pb.Campaign]
    ) -> pb.Campaign:
        """One campaign by id."""
        return await self._call("GetCampaign", context, self._handlers.get_campaign(request))

    async def ListCampaigns(  # noqa: N802 (gRPC method name)
        self,
        request: pb.ListCampaignsRequest,
        context: grpc.aio.ServicerContext[object, pb.ListCampaignsResponse],
    ) -> pb.ListCampaignsResponse:
        """Every campaign."""
        return await self._call("ListCampaigns", context, self._handlers.list_campaigns())

    async def IngestBatch(  # noqa: N802 (gRPC method name)
        self, request: pb.ShuffledBatch, context: grpc.aio.ServicerContext[object, pb.IngestBatchResponse]
    ) -> pb.IngestBatchResponse:
        """Count a shuffled batch (idempotent on its batch id)."""
        return await self._call("IngestBatch", context, self._handlers.ingest_batch(request))

    async def BinarySum(  # noqa: N802 (gRPC method name)
        self, request: pb.QueryRequest, context: grpc.aio.ServicerContext[object, pb.QueryResponse]
    ) -> pb.QueryResponse:
        """Estimates for a binary campaign."""
        return await self._call("BinarySum", context, self._handlers.query(request, binary=True))

    async def Histogram(  # noqa: N802 (gRPC method name)
        self, request: pb.QueryRequest, context: grpc.aio.ServicerContext[object, pb.QueryResponse]
    ) -> pb.QueryResponse:
        """Estimates for every bucket of any campaign."""
        return await self._call("Histogram", context, self._handlers.query(request, binary=False))

    async def ListKeys(  # noqa: N802 (gRPC method name)
        self, request: pb.ListKeysRequest, context: grpc.aio.ServicerContext[object, pb.ListKeysResponse]
    ) -> pb.ListKeysResponse:
        """Public metadata of the aggregator's keys."""
        return await self._call("ListKeys", context, self._handlers.list_keys())

    async def RotateKey(  # noqa: N802 (gRPC method name)
        self, request: pb.KeyRotateRequest, context: grpc.aio.ServicerContext[object, pb.KeyInfo]
    ) -> pb.KeyInfo:
        """A new active HPKE key; the previous one is retired."""
        return await self._call("RotateKey", context, self._handlers.rotate_key(request))

    async def DestroyKey(  # noqa: N802 (gRPC method name)
        self, request: pb.KeyDestroyRequest, context: grpc.aio.ServicerContext[object, pb.KeyInfo]
    ) -> pb.KeyInfo:
        """Overwrite and remove a retired key whose campaigns are all closed."""
        return await self._call("DestroyKey", context, self._handlers.destroy_key(request))

    async def CloseCampaign(  # noqa: N802 (gRPC method name)
        self, request: pb.KeyCloseCampaignRequest, context: grpc.aio.ServicerContext[object, pb.Campaign]
    ) -> pb.Campaign:
        """End a campaign's window now; the description is re-signed."""
        return await self._call("CloseCampaign", context, self._handlers.close_campaign(request))

    async def Status(  # noqa: N802 (gRPC method name)
        self, request: pb.StatusRequest, context: grpc.aio.ServicerContext[object, pb.StatusResponse]
    ) -> pb.StatusResponse:
        """Operator summary: campaigns, tallies, rejections by reason, keys."""
        return await self._call("Status", context, self._handlers.status())

    async def DeleteCampaign(  # noqa: N802 (gRPC method name)
        self,
        request: pb.StatusDeleteCampaignRequest,
        context: grpc.aio.ServicerContext[object, pb.StatusDeleteCampaignResponse],
    ) -> pb.StatusDeleteCampaignResponse:
        """Remove a closed campaign and everything counted for it."""
        return await self._call("DeleteCampaign", context, self._handlers.delete_campaign(request))

    async def ReleaseBelowNMin(  # noqa: N802 (gRPC method name)
        self, request: pb.ReleaseBelowNMinRequest, context: grpc.aio.ServicerContext[object, pb.Campaign]
    ) -> pb.Campaign:
        """Operator: authorise batches below n_min for a while (recorded and stated)."""
        return await self._call("ReleaseBelowNMin", context, self._handlers.release_below_n_min(request))
