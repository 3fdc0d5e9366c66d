"""Deniable client SDK: randomise answers on the device, seal them, queue them, deliver them."""

from deniable.client.budget import BudgetExceeded, BudgetLedger
from deniable.client.outbox import Outbox, OutboxRow
from deniable.client.reporter import (
    CampaignClosed,
    CampaignInvalid,
    CampaignUnavailable,
    Reporter,
    SendResult,
)
from deniable.client.sync import SyncReporter
from deniable.client.transport import GrpcTransport, InMemoryTransport, Transport, TransportError
from deniable.core.tls import ClientTls

__all__ = [
    "BudgetExceeded",
    "BudgetLedger",
    "CampaignClosed",
    "CampaignInvalid",
    "CampaignUnavailable",
    "ClientTls",
    "GrpcTransport",
    "InMemoryTransport",
    "Outbox",
    "OutboxRow",
    "Reporter",
    "SendResult",
    "SyncReporter",
    "Transport",
    "TransportError",
]
