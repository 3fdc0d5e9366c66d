"""Deniable client SDK: randomise answers on the device, seal them, queue them, deliver them."""

from deniable.client.budget import BudgetExceeded, BudgetLedger
from deniable.client.outbox import Outbox, OutboxRow
from deniable.client.reporter import CampaignClosed, CampaignInvalid, CampaignRefused, Reporter, SendResult
from deniable.client.transport import GrpcTransport, InMemoryTransport, Transport, TransportError

__all__ = [
    "BudgetExceeded",
    "BudgetLedger",
    "CampaignClosed",
    "CampaignInvalid",
    "CampaignRefused",
    "GrpcTransport",
    "InMemoryTransport",
    "Outbox",
    "OutboxRow",
    "Reporter",
    "SendResult",
    "Transport",
    "TransportError",
]
