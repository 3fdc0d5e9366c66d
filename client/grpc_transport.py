"""``GrpcTransport``: the shuffler over gRPC (the ``[grpc]`` extra: ``pip install 'deniable[grpc]'``).

Imported only when used (``deniable.client.GrpcTransport``), so a device on the standard-library
``HttpTransport`` needs no grpcio; without grpcio, using it raises a one-line ModuleNotFoundError.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Final

from deniable.client.transport import GRPC_HINT, RETRYABLE_STATUS, TransportError
from deniable.core.plumbing.tls import ClientTls, open_channel
from deniable.v1 import deniable_pb2 as pb

log = logging.getLogger("deniable.client")

try:
    import grpc

    from deniable.v1 import deniable_pb2_grpc
except ModuleNotFoundError as exc:  # the bare install: tests/sdk/test_bare_install.py
    raise ModuleNotFoundError(GRPC_HINT, name=exc.name) from exc

RETRYABLE_CODES: Final = frozenset(grpc.StatusCode[name] for name in RETRYABLE_STATUS)
"""Status codes after which the same request may succeed later; every other code is permanent."""


def error_from_rpc(exc: grpc.aio.AioRpcError, what: str) -> TransportError:
    """Map a gRPC failure to a TransportError, retryable for transient status codes."""
    code = exc.code()
    return TransportError(f"{what} failed: {code.name}: {exc.details() or ''}", code in RETRYABLE_CODES)


class GrpcTransport:
    """The shuffler over gRPC with TLS, verifying the server's certificate (``tls.ca``, else gRPC's roots)."""

    def __init__(
        self,
        address: str,
        timeout_s: float = 10.0,
        *,
        tls: ClientTls | None = None,
        insecure: bool = False,
    ) -> None:
        """Remember where the shuffler is; the channel opens on first use, inside the running loop.

        ``tls``: the CA to trust (default: gRPC's default roots) and an optional device certificate;
        ``insecure=True``: plaintext, for tests against an insecure shuffler only.
        """
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        if insecure and tls is not None:
            raise ValueError("choose tls or insecure, not both")
        if insecure:
            log.warning("INSECURE: plaintext gRPC to the shuffler at %s (asked for by name)", address)
        self.address = address
        self.timeout_s = timeout_s
        self.tls = tls
        self.insecure = insecure
        self._channel: grpc.aio.Channel | None = None
        self._stub: deniable_pb2_grpc.ShufflerAsyncStub | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _connected_stub(self) -> deniable_pb2_grpc.ShufflerAsyncStub:
        """The stub, (re)creating the channel if there is none or it belongs to another loop."""
        loop = asyncio.get_running_loop()
        if self._stub is None or self._loop is not loop:
            # A channel is bound to the loop it was made in; one from a finished loop is unusable.
            self._channel = open_channel(self.address, self.tls, insecure=self.insecure)
            self._stub = deniable_pb2_grpc.ShufflerStub(self._channel)
            self._loop = loop
        return self._stub

    async def submit(self, reports: Sequence[pb.EncryptedReport]) -> pb.SubmitReportsResponse:
        """One SubmitReports call carrying the whole batch."""
        stub = self._connected_stub()
        try:
            return await stub.SubmitReports(
                pb.SubmitReportsRequest(reports=list(reports)), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, "SubmitReports") from exc

    async def get_campaign(self, campaign_id: str) -> pb.Campaign:
        """One GetCampaign call."""
        stub = self._connected_stub()
        try:
            return await stub.GetCampaign(
                pb.GetCampaignRequest(campaign_id=campaign_id), timeout=self.timeout_s
            )
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc, "GetCampaign") from exc

    async def close(self) -> None:
        """Close the channel if this loop owns one; a later call opens a new one."""
        channel, loop = self._channel, self._loop
        self._channel = self._stub = self._loop = None
        if channel is not None and loop is asyncio.get_running_loop():
            await channel.close()
