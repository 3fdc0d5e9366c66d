"""Report-building helpers and store-opener types of the aggregator tests, importable by test modules.

They lived in tests/aggregator/conftest.py, which test modules cannot import (importlib mode).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from deniable.aggregator.store import AggregatorStore
from deniable.core.batches import batch_digest
from deniable.core.campaigns import randomiser_for
from deniable.core.crypto import PublicKey, seal_report
from deniable.core.rng import Csprng
from deniable.core.wire import Plaintext, encode, new_report_id
from deniable.v1 import deniable_pb2 as pb

StoreOpener = Callable[[], Coroutine[Any, Any, AggregatorStore]]
StoreFactory = Callable[[pytest.FixtureRequest, Path], AbstractAsyncContextManager[StoreOpener]]


def binary_request(campaign_id: str = "smoke", **fields: object) -> pb.CreateCampaignRequest:
    """A valid binary campaign request, with fields overridden.

    n_min is 1 so that tests may ingest small batches (the aggregator refuses batches below n_min).
    """
    base: dict[str, object] = {
        "id": campaign_id,
        "question": "Did it?",
        "kind": pb.BINARY,
        "epsilon0": 1.0,
        "n_min": 1,
    }
    base.update(fields)
    return pb.CreateCampaignRequest(**base)  # type: ignore[arg-type]


def categorical_request(
    campaign_id: str = "colour", labels: Sequence[str] = ("red", "green", "blue"), **fields: object
) -> pb.CreateCampaignRequest:
    """A valid categorical campaign request, with fields overridden (n_min 1, as above)."""
    base: dict[str, object] = {
        "n_min": 1,
        "id": campaign_id,
        "question": "Favourite?",
        "kind": pb.CATEGORICAL,
        "labels": list(labels),
        "epsilon0": 1.0,
    }
    base.update(fields)
    return pb.CreateCampaignRequest(**base)  # type: ignore[arg-type]


@dataclass
class Sealed:
    """A sealed report and the plaintext facts behind it."""

    report: pb.EncryptedReport
    report_id: bytes
    payload: bytes


def seal(
    campaign: pb.Campaign,
    value: int | None = None,
    *,
    payload: bytes | None = None,
    report_id: bytes | None = None,
    plaintext_campaign: str | None = None,
    plaintext_key_id: int | None = None,
    public_key: PublicKey | None = None,
    plaintext: bytes | None = None,
    rng: Csprng | None = None,
) -> Sealed:
    """Randomise ``value`` (or take ``payload``), encode and seal exactly as a device does."""
    if payload is None:
        payload = randomiser_for(campaign).randomise(value if value is not None else 0, rng)
    report_id = report_id or new_report_id()
    key = public_key or PublicKey(campaign.key_id, campaign.public_key)
    if plaintext is None:
        plaintext = encode(
            Plaintext(
                report_id,
                plaintext_campaign if plaintext_campaign is not None else campaign.id,
                plaintext_key_id if plaintext_key_id is not None else key.key_id,
                payload,
            ),
            campaign.plaintext_length,
        )
    ciphertext = seal_report(plaintext, key, campaign.id, campaign.incarnation)
    return Sealed(
        pb.EncryptedReport(campaign_id=campaign.id, key_id=key.key_id, ciphertext=ciphertext),
        report_id,
        payload,
    )


def batch_of(
    campaign_id: str, reports: Sequence[pb.EncryptedReport], batch_id: str | None = None
) -> pb.ShuffledBatch:
    """A shuffled batch with a correct digest."""
    return pb.ShuffledBatch(
        batch_id=batch_id or uuid.uuid4().hex,
        campaign_id=campaign_id,
        reports=list(reports),
        digest=batch_digest(r.ciphertext for r in reports),
    )


def rejected_map(response: pb.IngestBatchResponse) -> dict[int, int]:
    """RejectReason value → count of an ingest response."""
    return {int(r.reason): int(r.count) for r in response.rejected}


@dataclass(frozen=True)
class Kit:
    """The helpers above, handed to tests as a fixture (importlib mode cannot import conftest)."""

    binary_request: Callable[..., pb.CreateCampaignRequest] = binary_request
    categorical_request: Callable[..., pb.CreateCampaignRequest] = categorical_request
    seal: Callable[..., Sealed] = seal
    batch_of: Callable[..., pb.ShuffledBatch] = batch_of
    rejected_map: Callable[[pb.IngestBatchResponse], dict[int, int]] = rejected_map
