"""Deniable client SDK: randomise answers on the device, seal them, queue them, deliver them."""

from deniable.client.budget import BudgetExceeded, BudgetLedger
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
from deniable.client.transport import GrpcTransport, InMemoryTransport, Transport, TransportError
from deniable.core.crypto import CampaignSignatureError
from deniable.core.plumbing.tls import ClientTls

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
