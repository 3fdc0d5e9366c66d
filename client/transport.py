"""How a device reaches the shuffler: a small async ``Transport`` protocol and its implementations.

``HttpTransport`` (client/http_transport.py, standard library only) and ``GrpcTransport``
(client/grpc_transport.py, the ``[grpc]`` extra, imported from here only when asked for) talk to
a real shuffler; ``InMemoryTransport`` stands in for one in tests.
Every failure surfaces as ``TransportError`` with ``retryable`` telling the caller whether trying
the same request again later can succeed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol, runtime_checkable

from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:
    from deniable.client.grpc_transport import RETRYABLE_CODES as RETRYABLE_CODES
    from deniable.client.grpc_transport import GrpcTransport as GrpcTransport
    from deniable.client.grpc_transport import error_from_rpc as error_from_rpc

RETRYABLE_STATUS: Final = frozenset(
    {"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED", "ABORTED", "INTERNAL", "UNKNOWN", "CANCELLED"}
)
"""gRPC status names after which the same request may succeed later; every other status is permanent."""
GRPC_STATUS_NAMES: Final = (
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
    "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
)  # fmt: skip
"""gRPC's status names by number (the fixed table of the gRPC spec), for answers carried without grpcio."""
GRPC_HINT: Final = (
    "GrpcTransport needs grpcio: pip install 'deniable[grpc]' (or use HttpTransport: standard library only)"
)
_LAZY: Final = frozenset({"GrpcTransport", "RETRYABLE_CODES", "error_from_rpc"})


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


def __getattr__(name: str) -> Any:
    """``GrpcTransport``, ``RETRYABLE_CODES`` and ``error_from_rpc`` import grpcio on first use only."""
    if name in _LAZY:
        from deniable.client import grpc_transport

        return getattr(grpc_transport, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
