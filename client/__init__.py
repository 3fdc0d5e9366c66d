"""Deniable client SDK: randomise answers on the device, seal them, queue them, deliver them."""

from deniable.client.budget import BudgetExceeded, BudgetLedger
from deniable.client.outbox import Outbox, OutboxRow
from deniable.client.reporter import (
    CampaignClosed,
    CampaignInvalid,
    CampaignPolicyError,
    DevicePolicy,
    Reporter,
    SendResult,
    verify_description,
)
from deniable.client.transport import GrpcTransport, InMemoryTransport, Transport, TransportError
from deniable.core.crypto import CampaignSignatureError

__all__ = [
    "BudgetExceeded",
    "BudgetLedger",
    "CampaignClosed",
    "CampaignInvalid",
    "CampaignPolicyError",
    "CampaignSignatureError",
    "DevicePolicy",
    "GrpcTransport",
    "InMemoryTransport",
    "Outbox",
    "OutboxRow",
    "Reporter",
    "SendResult",
    "Transport",
    "TransportError",
    "verify_description",
]
