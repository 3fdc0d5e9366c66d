"""gRPC face of the aggregator: each RPC calls one handler and maps its errors to a status.

Unexpected exceptions are logged (method name only, never a client identifier) and become
INTERNAL; nothing a request does can take the server down.
"""

# ruff: noqa: N802  (the RPC method names are fixed by the generated servicer)

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

import grpc

from deniable.aggregator.handlers import AggregatorHandlers
from deniable.core.errors import RequestRefused
from deniable.core.plumbing.service import status_code
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc

R = TypeVar("R")
Context = grpc.aio.ServicerContext[Any, Any]
log = logging.getLogger("deniable.aggregator")


class AggregatorServicer(pb_grpc.AggregatorServicer):
    """Thin adapter from grpc.aio to ``AggregatorHandlers``."""

    def __init__(self, handlers: AggregatorHandlers) -> None:
        """Serve ``handlers``; failures are counted in ``handlers.metrics``."""
        self._handlers = handlers

    async def _call(self, rpc: str, context: Context, call: Awaitable[R]) -> R:
        """Await one handler call; a refusal or an unexpected error aborts with its status."""
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

    async def CreateCampaign(self, request: pb.CreateCampaignRequest, context: Context) -> pb.Campaign:
        """Create a campaign (the aggregator owns campaigns and their keys)."""
        work = self._handlers.create_campaign(request, deadline_s=context.time_remaining())
        return await self._call("CreateCampaign", context, work)

    async def GetCampaign(self, request: pb.GetCampaignRequest, context: Context) -> pb.Campaign:
        """One campaign by id."""
        return await self._call("GetCampaign", context, self._handlers.get_campaign(request))

    async def ListCampaigns(
        self, request: pb.ListCampaignsRequest, context: Context
    ) -> pb.ListCampaignsResponse:
        """Every campaign."""
        return await self._call("ListCampaigns", context, self._handlers.list_campaigns())

    async def IngestBatch(self, request: pb.ShuffledBatch, context: Context) -> pb.IngestBatchResponse:
        """Count a shuffled batch (idempotent on its batch id)."""
        return await self._call("IngestBatch", context, self._handlers.ingest_batch(request))

    async def BinarySum(self, request: pb.QueryRequest, context: Context) -> pb.QueryResponse:
        """Estimates for a binary campaign."""
        return await self._call("BinarySum", context, self._handlers.query(request, binary=True))

    async def Histogram(self, request: pb.QueryRequest, context: Context) -> pb.QueryResponse:
        """Estimates for every bucket of any campaign."""
        return await self._call("Histogram", context, self._handlers.query(request, binary=False))

    async def ListKeys(self, request: pb.ListKeysRequest, context: Context) -> pb.ListKeysResponse:
        """Public metadata of the aggregator's keys."""
        return await self._call("ListKeys", context, self._handlers.list_keys())

    async def RotateKey(self, request: pb.KeyRotateRequest, context: Context) -> pb.KeyInfo:
        """A new active HPKE key; the previous one is retired."""
        return await self._call("RotateKey", context, self._handlers.rotate_key(request))

    async def DestroyKey(self, request: pb.KeyDestroyRequest, context: Context) -> pb.KeyInfo:
        """Overwrite and remove a retired key whose campaigns are all closed."""
        return await self._call("DestroyKey", context, self._handlers.destroy_key(request))

    async def CloseCampaign(self, request: pb.KeyCloseCampaignRequest, context: Context) -> pb.Campaign:
        """End a campaign's window now; the description is re-signed."""
        return await self._call("CloseCampaign", context, self._handlers.close_campaign(request))

    async def Status(self, request: pb.StatusRequest, context: Context) -> pb.StatusResponse:
        """Operator summary: campaigns, tallies, rejections by reason, keys."""
        return await self._call("Status", context, self._handlers.status())

    async def DeleteCampaign(
        self, request: pb.StatusDeleteCampaignRequest, context: Context
    ) -> pb.StatusDeleteCampaignResponse:
        """Remove a closed campaign and everything counted for it."""
        return await self._call("DeleteCampaign", context, self._handlers.delete_campaign(request))

    async def ReleaseBelowNMin(self, request: pb.ReleaseBelowNMinRequest, context: Context) -> pb.Campaign:
        """Operator: authorise batches below n_min for a while (recorded and stated)."""
        return await self._call("ReleaseBelowNMin", context, self._handlers.release_below_n_min(request))
