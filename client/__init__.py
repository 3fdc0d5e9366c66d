"""Deniable client SDK: randomise answers on the device, seal them, queue them, deliver them."""

from deniable.client.budget import BudgetExceeded, BudgetLedger
from deniable.client.outbox import Outbox, OutboxRow
from deniable.client.reporter import CampaignClosed, CampaignInvalid, Reporter, SendResult
from deniable.client.transport import GrpcTransport, InMemoryTransport, Transport, TransportError
from deniable.core.tls import ClientTls

__all__ = [
    "BudgetExceeded",
    "BudgetLedger",
    "CampaignClosed",
    "CampaignInvalid",
    "ClientTls",
    "GrpcTransport",
    "InMemoryTransport",
    "Outbox",
    "OutboxRow",
    "Reporter",
    "SendResult",
    "Transport",
    "TransportError",
]
