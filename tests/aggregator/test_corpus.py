"""A corpus of malformed reports: each gets its own RejectReason and metric, and no count changes.

Each case is one report inside an otherwise well-formed batch, ingested by the real handlers over a
real store and keyring. (Reports carry no timestamp: "expired" is a report of a campaign whose
retention ended; a report of a not-yet-open campaign is refused at the shuffler, not here.)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from support.clock import Clock

from deniable.aggregator.handlers import AggregatorHandlers
from deniable.aggregator.keys import Keyring
from deniable.aggregator.metrics import AggregatorMetrics, reason_name
from deniable.aggregator.store import SqliteAggregatorStore
from deniable.core.crypto import PublicKey, seal_report
from deniable.core.wire import Plaintext, encode, new_report_id
from deniable.v1 import deniable_pb2 as pb


def _flip(report: pb.EncryptedReport, at: int) -> pb.EncryptedReport:
    ct = bytearray(report.ciphertext)
    ct[at] ^= 0x55
    return pb.EncryptedReport(campaign_id=report.campaign_id, key_id=report.key_id, ciphertext=bytes(ct))


def _resized(report: pb.EncryptedReport, size: int) -> pb.EncryptedReport:
    ct = report.ciphertext[:size] + bytes(max(0, size - len(report.ciphertext)))
    return pb.EncryptedReport(campaign_id=report.campaign_id, key_id=report.key_id, ciphertext=ct)


def _sealed_for_other_campaign(c: pb.Campaign, kit: Any) -> pb.EncryptedReport:
    plaintext = encode(Plaintext(new_report_id(), c.id, c.key_id, bytes([1])), c.plaintext_length)
    ct = seal_report(plaintext, PublicKey(c.key_id, c.public_key), "other")  # HPKE info of "other"
    return pb.EncryptedReport(campaign_id=c.id, key_id=c.key_id, ciphertext=ct)


Case = Callable[[pb.Campaign, Any], pb.EncryptedReport]
CORPUS: list[tuple[str, Case, int]] = [
    (
        "truncated",
        lambda c, kit: _resized(kit.seal(c, 1).report, c.ciphertext_length - 1),
        pb.WRONG_CIPHERTEXT_LENGTH,
    ),
    (
        "oversized",
        lambda c, kit: _resized(kit.seal(c, 1).report, c.ciphertext_length + 64),
        pb.WRONG_CIPHERTEXT_LENGTH,
    ),
    ("empty", lambda c, kit: _resized(kit.seal(c, 1).report, 0), pb.WRONG_CIPHERTEXT_LENGTH),
    (
        "bad key id",
        lambda c, kit: pb.EncryptedReport(
            campaign_id=c.id, key_id=c.key_id + 9, ciphertext=kit.seal(c, 1).report.ciphertext
        ),
        pb.UNKNOWN_KEY_ID,
    ),
    ("bad encapsulated key", lambda c, kit: _flip(kit.seal(c, 1).report, 3), pb.UNDECRYPTABLE),
    ("AEAD failure", lambda c, kit: _flip(kit.seal(c, 1).report, c.ciphertext_length - 1), pb.UNDECRYPTABLE),
    ("sealed for another campaign", _sealed_for_other_campaign, pb.UNDECRYPTABLE),
    (
        "plaintext names another campaign",
        lambda c, kit: kit.seal(c, 1, plaintext_campaign="other").report,
        pb.CAMPAIGN_MISMATCH,
    ),
    (
        "plaintext names another key",
        lambda c, kit: kit.seal(c, 1, plaintext_key_id=c.key_id + 1).report,
        pb.CAMPAIGN_MISMATCH,
    ),
    (
        "envelope names another campaign",
        lambda c, kit: pb.EncryptedReport(
            campaign_id="other", key_id=c.key_id, ciphertext=kit.seal(c, 1).report.ciphertext
        ),
        pb.CAMPAIGN_MISMATCH,
    ),
    (
        "garbage plaintext",
        lambda c, kit: kit.seal(c, plaintext=b"\xff" * c.plaintext_length).report,
        pb.MALFORMED_PLAINTEXT,
    ),
    ("out-of-domain value", lambda c, kit: kit.seal(c, payload=bytes([7])).report, pb.PAYLOAD_OUT_OF_DOMAIN),
    (
        "multi-valued payload",
        lambda c, kit: kit.seal(c, payload=bytes([1, 1])).report,
        pb.PAYLOAD_OUT_OF_DOMAIN,
    ),
    ("empty payload", lambda c, kit: kit.seal(c, payload=b"").report, pb.PAYLOAD_OUT_OF_DOMAIN),
]


@pytest.fixture
async def timed(tmp_path: Path) -> AsyncIterator[tuple[AggregatorHandlers, Clock]]:
    store = SqliteAggregatorStore(tmp_path / "corpus.sqlite3")
    clock = Clock()
    keyring = Keyring.load_or_create(tmp_path / "data")
    yield AggregatorHandlers(store, keyring, AggregatorMetrics(), clock=clock, retention_margin_s=60.0), clock
    await store.close()


def _metric(handlers: AggregatorHandlers, reason: int) -> float:
    value = handlers.metrics.registry.get_sample_value(
        "deniable_aggregator_reports_rejected_total", {"reason": reason_name(reason)}
    )
    return value or 0.0


async def _assert_rejected(
    handlers: AggregatorHandlers, kit: Any, campaign: pb.Campaign, bad: pb.EncryptedReport, reason: int
) -> None:
    """One bad report among honest ones: the honest ones count, the bad one is rejected by reason."""
    honest = [kit.seal(campaign, 0).report for _ in range(2)]
    before, metric = (await handlers.store.snapshot(campaign.id, 2)), _metric(handlers, reason)
    response = await handlers.ingest_batch(kit.batch_of(campaign.id, [*honest, bad]))
    assert (response.counted, kit.rejected_map(response)) == (2, {int(reason): 1})
    after = await handlers.store.snapshot(campaign.id, 2)
    assert (after.n, sum(after.counts)) == (before.n + 2, sum(before.counts) + 2)  # only the honest two
    assert _metric(handlers, reason) == metric + 1


@pytest.mark.parametrize(("name", "make", "reason"), CORPUS, ids=[c[0] for c in CORPUS])
async def test_corpus_case_has_its_reason_and_counts_nothing(
    timed: tuple[AggregatorHandlers, Clock], kit: Any, name: str, make: Case, reason: int
) -> None:
    handlers, _ = timed
    campaign = await handlers.create_campaign(kit.binary_request("corpus"))
    await _assert_rejected(handlers, kit, campaign, make(campaign, kit), reason)


async def test_corpus_duplicate_and_expired(timed: tuple[AggregatorHandlers, Clock], kit: Any) -> None:
    handlers, clock = timed
    campaign = await handlers.create_campaign(kit.binary_request("dup", window_end_unix=int(clock.now) + 5))
    counted = kit.seal(campaign, 1)
    await handlers.ingest_batch(kit.batch_of("dup", [counted.report]))
    await _assert_rejected(handlers, kit, campaign, counted.report, pb.DUPLICATE_REPORT)

    clock.now += 5 + 60  # retention over: every report of the campaign is CAMPAIGN_CLOSED
    before, metric = await handlers.store.snapshot("dup", 2), _metric(handlers, pb.CAMPAIGN_CLOSED)
    response = await handlers.ingest_batch(
        kit.batch_of("dup", [kit.seal(campaign, 1).report, counted.report])
    )
    assert (response.counted, kit.rejected_map(response)) == (0, {int(pb.CAMPAIGN_CLOSED): 2})
    assert (await handlers.store.snapshot("dup", 2)).counts == before.counts
    assert _metric(handlers, pb.CAMPAIGN_CLOSED) == metric + 2
