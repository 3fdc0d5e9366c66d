"""How a device reaches the shuffler: a small async ``Transport`` protocol and two implementations.

``GrpcTransport`` talks to a real shuffler; ``InMemoryTransport`` stands in for one in tests.
Every failure surfaces as ``TransportError`` with ``retryable`` telling the caller whether trying
the same request again later can succeed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Final, Protocol, runtime_checkable

import grpc

from deniable.core.plumbing.tls import ClientTls, open_channel
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc

log = logging.getLogger("deniable.client")

RETRYABLE_CODES: Final = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
    }
)
"""Status codes after which the same request may succeed later; every other code is permanent."""


class TransportError(Exception):
    """A request to the shuffler failed; ``retryable`` says whether repeating it may succeed."""

    def __init__(self, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable

    def __repr__(self) -> str:
        return f"TransportError({self.message!r}, retryable={self.retryable})"


@runtime_checkable
class Transport(Protocol):
    """What the Reporter needs from a connection to the shuffler."""

    async def submit(self, reports: Sequence[pb.EncryptedReport]) -> pb.SubmitReportsResponse:
        """Send sealed reports; the response accounts for every one (accepted or rejected)."""
        ...

    async def get_campaign(self, campaign_id: str) -> pb.Campaign:
        """The campaign description as the shuffler relays it."""
        ...

    async def close(self) -> None:
        """Release connections (GrpcTransport reopens on a later call; the in-memory one refuses)."""
        ...


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


class InMemoryTransport:
    """A fake shuffler for tests only: keeps campaigns, records what it accepts, injects faults.

    It checks envelopes the way a shuffler does (known campaign, key id, ciphertext length), can
    fail the next N submits with a retryable error, and can reject reports with a chosen reason.
    """

    def __init__(self, campaigns: Sequence[pb.Campaign] = ()) -> None:
        """Start with ``campaigns`` known, nothing submitted and no faults armed."""
        self.campaigns: dict[str, pb.Campaign] = {}
        self.submitted: list[pb.EncryptedReport] = []
        self.submit_calls = 0
        self.closed = False
        self._fail_next = 0
        self._fail_message = "injected failure"
        self._reject_reason: pb.RejectReason.ValueType | None = None
        self._reject_detail = ""
        self._reject_campaign: str | None = None
        for campaign in campaigns:
            self.add_campaign(campaign)

    def add_campaign(self, campaign: pb.Campaign) -> None:
        """Make ``campaign`` known (replacing one with the same id)."""
        copy = pb.Campaign()
        copy.CopyFrom(campaign)
        self.campaigns[campaign.id] = copy

    def fail_next(self, count: int, message: str = "injected failure") -> None:
        """Make the next ``count`` submits raise a retryable TransportError (nothing is accepted)."""
        self._fail_next = count
        self._fail_message = message

    def reject_with(
        self, reason: pb.RejectReason.ValueType | None, detail: str = "", campaign_id: str | None = None
    ) -> None:
        """Reject every following report (of ``campaign_id`` if given) with ``reason``; None stops."""
        self._reject_reason = reason
        self._reject_detail = detail
        self._reject_campaign = campaign_id

    def _check(self, report: pb.EncryptedReport) -> tuple[pb.RejectReason.ValueType, str] | None:
        if self._reject_reason is not None and self._reject_campaign in (None, report.campaign_id):
            return self._reject_reason, self._reject_detail
        campaign = self.campaigns.get(report.campaign_id)
        if campaign is None:
            return pb.UNKNOWN_CAMPAIGN, f"unknown campaign {report.campaign_id!r}"
        if report.key_id != campaign.key_id:
            return pb.UNKNOWN_KEY_ID, f"key id {report.key_id} is not the campaign's"
        if len(report.ciphertext) != campaign.ciphertext_length:
            return pb.WRONG_CIPHERTEXT_LENGTH, f"{len(report.ciphertext)} bytes"
        return None

    async def submit(self, reports: Sequence[pb.EncryptedReport]) -> pb.SubmitReportsResponse:
        """Accept or reject each report, or fail the whole call if a fault is armed."""
        if self.closed:
            raise TransportError("transport is closed", retryable=False)
        self.submit_calls += 1
        if self._fail_next > 0:
            self._fail_next -= 1
            raise TransportError(self._fail_message, retryable=True)
        response = pb.SubmitReportsResponse()
        for index, report in enumerate(reports):
            verdict = self._check(report)
            if verdict is None:
                kept = pb.EncryptedReport()
                kept.CopyFrom(report)
                self.submitted.append(kept)
                response.accepted += 1
            else:
                response.rejected.add(index=index, reason=verdict[0], detail=verdict[1])
        return response

    async def get_campaign(self, campaign_id: str) -> pb.Campaign:
        """A copy of the known campaign; a permanent TransportError (NOT_FOUND) otherwise."""
        if self.closed:
            raise TransportError("transport is closed", retryable=False)
        try:
            campaign = self.campaigns[campaign_id]
        except KeyError:
            raise TransportError(f"GetCampaign failed: NOT_FOUND: {campaign_id}", retryable=False) from None
        copy = pb.Campaign()
        copy.CopyFrom(campaign)
        return copy

    async def close(self) -> None:
        """Refuse further calls, like a closed connection."""
        self.closed = True
