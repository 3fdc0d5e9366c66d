"""Deniable client SDK: randomise answers on the device, seal them, queue them, deliver them.

``HttpTransport`` needs only the standard library; ``GrpcTransport`` needs grpcio (``deniable[grpc]``).
"""

from typing import TYPE_CHECKING, Any

from deniable.client.budget import BudgetExceeded, BudgetLedger
from deniable.client.http_transport import HttpTransport
from deniable.client.outbox import Outbox, OutboxRow
from deniable.client.reporter import (
    CampaignClosed,
    CampaignInvalid,
    CampaignPolicyError,
    CampaignRefused,
    CampaignUnavailable,
    DevicePolicy,
    Reporter,
    SendResult,
    verify_description,
)
from deniable.client.sync import SyncReporter
from deniable.client.transport import InMemoryTransport, Transport, TransportError
from deniable.core.crypto import CampaignSignatureError
from deniable.core.plumbing.tls import ClientTls

if TYPE_CHECKING:
    from deniable.client.grpc_transport import GrpcTransport

__all__ = [
    "BudgetExceeded",
    "BudgetLedger",
    "CampaignClosed",
    "CampaignInvalid",
    "CampaignPolicyError",
    "CampaignRefused",
    "CampaignSignatureError",
    "CampaignUnavailable",
    "ClientTls",
    "DevicePolicy",
    "GrpcTransport",
    "HttpTransport",
    "InMemoryTransport",
    "Outbox",
    "OutboxRow",
    "Reporter",
    "SendResult",
    "SyncReporter",
    "Transport",
    "TransportError",
    "verify_description",
]


def __getattr__(name: str) -> Any:
    """``GrpcTransport`` imports grpcio (the ``[grpc]`` extra) on first use only."""
    if name == "GrpcTransport":
        from deniable.client.grpc_transport import GrpcTransport

        return GrpcTransport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
