"""The thin gRPC face of the shuffler: calls a handler, maps its errors to status codes.

It reads the caller's address and certificate only to turn them at once into opaque quota keys
(``SourceQuota.keys``, never stored, forwarded or logged), and never crashes: an unexpected
exception is logged without any client identifier and answered with INTERNAL.
"""

# ruff: noqa: N802  (the RPC method names are fixed by the generated servicer)

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

import grpc

from deniable.core.errors import RequestRefused
from deniable.core.plumbing.service import status_code
from deniable.shuffler.handlers import ShufflerHandlers
from deniable.shuffler.metrics import ShufflerMetrics
from deniable.shuffler.rawsubmit import RawSubmit
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc

log = logging.getLogger("deniable.shuffler.servicer")

_T = TypeVar("_T")
Context = grpc.aio.ServicerContext[Any, Any]


class ShufflerServicer(deniable_pb2_grpc.ShufflerServicer):
    """Device- and operator-facing RPCs, each delegated to ``ShufflerHandlers``."""

    def __init__(self, handlers: ShufflerHandlers, metrics: ShufflerMetrics) -> None:
        """Wrap the handlers; failures are counted in ``metrics``."""
        self._handlers = handlers
        self._metrics = metrics

    async def SubmitReports(
        self, request: pb.SubmitReportsRequest | RawSubmit, context: Context
    ) -> pb.SubmitReportsResponse:
        """Validate and durably spool envelopes (``RawSubmit``: the server's interceptor kept the bytes)."""
        quota = self._handlers.quota
        source = quota.keys(context) if quota is not None else ()
        return await self._call("SubmitReports", context, self._handlers.submit(request, source))

    async def GetCampaign(self, request: pb.GetCampaignRequest, context: Context) -> pb.Campaign:
        """Relay one campaign (its upstream look-up within the caller's look-up budget)."""
        quota = self._handlers.quota
        source = quota.keys(context) if quota is not None else ()
        return await self._call(
            "GetCampaign", context, self._handlers.get_campaign(request.campaign_id, source)
        )

    async def ListCampaigns(
        self, request: pb.ListCampaignsRequest, context: Context
    ) -> pb.ListCampaignsResponse:
        """Relay every campaign."""
        return await self._call("ListCampaigns", context, self._handlers.list_campaigns())

    async def Flush(self, request: pb.FlushRequest, context: Context) -> pb.FlushResponse:
        """Operator: batch and forward now."""
        return await self._call(
            "Flush", context, self._handlers.flush(request.campaign_id, request.below_n_min)
        )

    async def Stats(self, request: pb.ShufflerStatsRequest, context: Context) -> pb.ShufflerStatsResponse:
        """Operator: spool counts per campaign."""
        return await self._call("Stats", context, self._handlers.stats())

    async def _call(self, rpc: str, context: Context, work: Awaitable[_T]) -> _T:
        try:
            return await work
        except RequestRefused as exc:
            code = status_code(exc)
            message = str(exc)
        except Exception:
            log.exception("unexpected failure", extra={"rpc": rpc})
            code, message = grpc.StatusCode.INTERNAL, "internal error"
        self._metrics.requests_failed.labels(rpc=rpc, code=code.name).inc()
        await context.abort(code, message)
        raise AssertionError("context.abort returned")  # pragma: no cover - abort always raises
