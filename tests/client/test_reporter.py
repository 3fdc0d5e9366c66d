"""Reporter end to end over the in-memory transport: seal, queue, deliver, retry, reject, refuse."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from deniable.client.budget import BudgetExceeded, BudgetLedger
from deniable.client.outbox import Outbox
from deniable.client.reporter import (
    CampaignClosed,
    CampaignInvalid,
    CampaignPolicyError,
    DevicePolicy,
    Reporter,
)
from deniable.client.transport import InMemoryTransport, TransportError
from deniable.core.campaigns import randomiser_for
from deniable.core.crypto import CampaignSignatureError, KeyPair, SigningKey, open_report
from deniable.core.wire import decode
from deniable.v1 import deniable_pb2 as pb


def opened(report: pb.EncryptedReport, key_pair: KeyPair, campaign: pb.Campaign) -> Any:
    """Decrypt and decode one submitted report as the aggregator would."""
    return decode(
        open_report(report.ciphertext, key_pair, campaign.id, campaign.incarnation), campaign.plaintext_length
    )


async def test_record_send_and_open(make_campaign: Any, outbox: Outbox, key_pair: KeyPair) -> None:
    campaign = make_campaign()
    transport = InMemoryTransport([campaign])
    reporter = Reporter(campaign, outbox, transport)
    report_ids = [reporter.record(v) for v in (0, 3, 7)]
    assert outbox.count() == 3 and len(set(report_ids)) == 3

    result = await reporter.send_pending()
    assert (result.acknowledged, result.rejected, result.pending, result.rejections) == (3, 0, 0, {})
    assert outbox.count() == 0
    assert len(transport.submitted) == 3
    for report, report_id in zip(transport.submitted, report_ids, strict=True):
        assert report.campaign_id == campaign.id and report.key_id == campaign.key_id
        assert len(report.ciphertext) == campaign.ciphertext_length
        plaintext = opened(report, key_pair, campaign)
        assert plaintext.campaign_id == campaign.id and plaintext.key_id == campaign.key_id
        assert plaintext.report_id == report_id
        assert len(plaintext.payload) == campaign.payload_length
        assert 0 <= int.from_bytes(plaintext.payload, "big") < len(campaign.labels)


async def test_binary_campaign(make_campaign: Any, outbox: Outbox, key_pair: KeyPair) -> None:
    campaign = make_campaign(campaign_id="yes-no", mechanism="binary_rr", domain_size=2)
    transport = InMemoryTransport([campaign])
    reporter = Reporter(campaign, outbox, transport)
    reporter.record(True)
    reporter.record(0)
    assert (await reporter.send_pending()).acknowledged == 2
    payloads = [opened(r, key_pair, campaign).payload for r in transport.submitted]
    assert all(p in (b"\x00", b"\x01") for p in payloads)


async def test_fetch_builds_reporter_from_shuffler(
    make_campaign: Any, outbox: Outbox, signing_key: SigningKey
) -> None:
    campaign = make_campaign()
    transport = InMemoryTransport([campaign])
    reporter = await Reporter.fetch(campaign.id, transport, outbox, aggregator_key=signing_key.public_raw)
    assert reporter.campaign == campaign
    with pytest.raises(TransportError) as info:
        await Reporter.fetch("missing", transport, outbox, aggregator_key=signing_key.public_raw)
    assert not info.value.retryable


async def test_fetch_rejects_tampered_campaign(make_campaign: Any, outbox: Outbox) -> None:
    campaign = make_campaign()
    campaign.ciphertext_length += 16
    with pytest.raises(CampaignInvalid, match="lengths"):  # checked even when verification is skipped
        await Reporter.fetch(campaign.id, InMemoryTransport([campaign]), outbox, insecure_skip_verify=True)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("ciphertext_length", 1, "lengths"),
        ("plaintext_length", 1, "lengths"),
        ("payload_length", 2, "lengths"),
        ("public_key", bytes(31), "32"),
        ("hpke_suite", "MLKEM768-X25519", "suite"),
        ("mechanism", pb.MECHANISM_UNSPECIFIED, "mechanism"),
        ("epsilon0", 0.0, "epsilon0"),
        ("id", "Bad Id", "campaign id"),
        ("device_budget_epsilon", 0.0, "budget"),
    ],
)
def test_tampered_campaign_is_invalid(
    make_campaign: Any, outbox: Outbox, field: str, value: Any, match: str
) -> None:
    campaign = make_campaign()
    if field in ("ciphertext_length", "plaintext_length", "payload_length"):
        value = getattr(campaign, field) + value
    setattr(campaign, field, value)
    with pytest.raises(CampaignInvalid, match=match):
        Reporter(campaign, outbox, InMemoryTransport())


def test_value_outside_domain_is_refused(make_campaign: Any, outbox: Outbox) -> None:
    campaign = make_campaign()
    ledger = BudgetLedger(None)
    reporter = Reporter(campaign, outbox, InMemoryTransport([campaign]), ledger)
    for bad in (-1, 8, 100):
        with pytest.raises(ValueError, match="outside the domain"):
            reporter.record(bad)
    with pytest.raises(ValueError):
        reporter.record_many([1, 2, 8])
    assert outbox.count() == 0
    assert ledger.spent() == 0


@pytest.mark.parametrize(
    ("start", "end", "match"), [(2000, 0, "opens"), (0, 1000, "closed"), (500, 1000, "closed")]
)
def test_closed_window_is_refused(
    make_campaign: Any, outbox: Outbox, start: int, end: int, match: str
) -> None:
    campaign = make_campaign(window_start_unix=start, window_end_unix=end)
    ledger = BudgetLedger(None)
    reporter = Reporter(campaign, outbox, InMemoryTransport([campaign]), ledger, clock=lambda: 1000.0)
    with pytest.raises(CampaignClosed, match=match):
        reporter.record(1)
    with pytest.raises(CampaignClosed):
        reporter.record_many([1, 2])
    assert outbox.count() == 0 and ledger.spent() == 0


def test_open_window_accepts(make_campaign: Any, outbox: Outbox) -> None:
    campaign = make_campaign(window_start_unix=1000, window_end_unix=1001)
    reporter = Reporter(campaign, outbox, InMemoryTransport([campaign]), clock=lambda: 1000.5)
    reporter.record(1)
    assert outbox.count() == 1


def test_budget_refuses_second_report_and_persists(make_campaign: Any, tmp_path: Path) -> None:
    campaign = make_campaign()  # device_budget_epsilon == epsilon0 == 1.0
    transport = InMemoryTransport([campaign])
    with Outbox(tmp_path / "o.db") as box, BudgetLedger(tmp_path / "budget.db") as ledger:
        reporter = Reporter(campaign, box, transport, ledger)
        reporter.record(2)
        with pytest.raises(BudgetExceeded, match=r"spent 1 \+ requested 1 > limit 1"):
            reporter.record(2)
        assert box.count() == 1
        assert ledger.spent(campaign.id) == 1.0
    with Outbox(tmp_path / "o.db") as box, BudgetLedger(tmp_path / "budget.db") as ledger:
        reporter = Reporter(campaign, box, transport, ledger)
        with pytest.raises(BudgetExceeded):
            reporter.record(5)
        assert box.count() == 1


def test_budget_allows_several_reports_within_limit(make_campaign: Any, outbox: Outbox) -> None:
    campaign = make_campaign(epsilon0=0.1, device_budget_epsilon=0.3)
    ledger = BudgetLedger(None)
    reporter = Reporter(campaign, outbox, InMemoryTransport([campaign]), ledger)
    for _ in range(3):  # 0.1 + 0.1 + 0.1 > 0.3 in floats; the ledger must not be fooled
        reporter.record(1)
    with pytest.raises(BudgetExceeded):
        reporter.record(1)
    assert outbox.count() == 3


def test_record_many_is_not_charged(make_campaign: Any, outbox: Outbox) -> None:
    campaign = make_campaign()
    ledger = BudgetLedger(None)
    reporter = Reporter(campaign, outbox, InMemoryTransport([campaign]), ledger)
    assert reporter.record_many([v % 8 for v in range(50)], progress=True) == 50
    assert outbox.count() == 50 and ledger.spent() == 0


def test_record_many_refuses_when_one_report_exceeds_the_budget(make_campaign: Any, outbox: Outbox) -> None:
    campaign = make_campaign(device_budget_epsilon=0.5)
    reporter = Reporter(campaign, outbox, InMemoryTransport([campaign]))
    with pytest.raises(BudgetExceeded):
        reporter.record_many([1])
    assert outbox.count() == 0


async def test_retryable_failures_then_success(make_campaign: Any, outbox: Outbox, sleeps: Any) -> None:
    campaign = make_campaign()
    transport = InMemoryTransport([campaign])
    reporter = Reporter(campaign, outbox, transport, sleep=sleeps)
    reporter.record_many(list(range(8)) * 3)
    pending = outbox.pending(100)
    transport.fail_next(3)
    result = await reporter.send_pending(batch_size=10, base_delay_s=0.01, max_delay_s=0.02)
    assert (result.acknowledged, result.rejected, result.pending) == (24, 0, 0)
    assert transport.submit_calls == 3 + 3  # three failures, then three batches
    assert len(sleeps.delays) == 3
    sent = [r.ciphertext for r in transport.submitted]
    assert sorted(sent) == sorted(row.ciphertext for row in pending)  # nothing lost, nothing duplicated
    assert len(set(sent)) == 24
    assert outbox.count() == 0


async def test_exhausted_attempts_leave_reports_pending(
    make_campaign: Any, outbox: Outbox, sleeps: Any
) -> None:
    campaign = make_campaign()
    transport = InMemoryTransport([campaign])
    reporter = Reporter(campaign, outbox, transport, sleep=sleeps)
    reporter.record_many([1, 2, 3, 4, 5])
    transport.fail_next(100)
    result = await reporter.send_pending(max_attempts=4)
    assert (result.acknowledged, result.rejected, result.pending) == (0, 0, 5)
    assert transport.submit_calls == 4 and len(sleeps.delays) == 3
    assert all(row.attempts == 4 for row in outbox.pending(10))

    transport.fail_next(0)
    later = await reporter.send_pending()
    assert (later.acknowledged, later.pending) == (5, 0)
    assert len({r.ciphertext for r in transport.submitted}) == len(transport.submitted) == 5


async def test_permanent_rejection_is_removed_and_counted(
    make_campaign: Any, outbox: Outbox, caplog: pytest.LogCaptureFixture
) -> None:
    campaign = make_campaign()
    transport = InMemoryTransport([campaign])
    reporter = Reporter(campaign, outbox, transport)
    reporter.record_many([1, 2, 3])
    transport.reject_with(pb.CAMPAIGN_CLOSED, "window over")
    with caplog.at_level(logging.WARNING, logger="deniable.client"):
        result = await reporter.send_pending()
    assert (result.acknowledged, result.rejected, result.pending) == (0, 3, 0)
    assert result.rejections == {"CAMPAIGN_CLOSED": 3}
    assert outbox.count() == 0 and transport.submitted == []
    logged = [r for r in caplog.records if r.getMessage() == "report rejected by the shuffler"]
    assert len(logged) == 3 and all(getattr(r, "reason", None) == "CAMPAIGN_CLOSED" for r in logged)


async def test_mixed_batch_accepts_good_and_rejects_bad(make_campaign: Any, outbox: Outbox) -> None:
    campaign = make_campaign()
    transport = InMemoryTransport([campaign])
    reporter = Reporter(campaign, outbox, transport)
    reporter.record(1)
    outbox.add_many([pb.EncryptedReport(campaign_id=campaign.id, key_id=1, ciphertext=b"short")])
    reporter.record(2)
    result = await reporter.send_pending()
    assert (result.acknowledged, result.rejected, result.pending) == (2, 1, 0)
    assert result.rejections == {"WRONG_CIPHERTEXT_LENGTH": 1}


async def test_batches_and_campaign_isolation(make_campaign: Any, outbox: Outbox) -> None:
    first, second = make_campaign("first"), make_campaign("second")
    transport = InMemoryTransport([first, second])
    a, b = Reporter(first, outbox, transport), Reporter(second, outbox, transport)
    a.record_many([1] * 25)
    b.record_many([2] * 4)
    result = await a.send_pending(batch_size=10)
    assert result.acknowledged == 25 and transport.submit_calls == 3
    assert outbox.count(first.id) == 0 and outbox.count(second.id) == 4
    assert (await b.send_pending()).acknowledged == 4


async def test_concurrent_sends_do_not_duplicate(make_campaign: Any, outbox: Outbox) -> None:
    campaign = make_campaign()
    transport = InMemoryTransport([campaign])
    reporter = Reporter(campaign, outbox, transport)
    reporter.record_many([3] * 30)
    results = await asyncio.gather(*(reporter.send_pending(batch_size=7) for _ in range(3)))
    assert sum(r.acknowledged for r in results) == 30
    assert len({r.ciphertext for r in transport.submitted}) == len(transport.submitted) == 30


class _Broken(InMemoryTransport):
    """Answers submits with a fixed error or a malformed response."""

    def __init__(self, campaign: pb.Campaign, error: TransportError | None) -> None:
        super().__init__([campaign])
        self.error = error

    async def submit(self, reports: Sequence[pb.EncryptedReport]) -> pb.SubmitReportsResponse:
        self.submit_calls += 1
        if self.error is not None:
            raise self.error
        return pb.SubmitReportsResponse(accepted=len(reports) - 1)


async def test_non_retryable_error_is_raised_and_keeps_reports(make_campaign: Any, outbox: Outbox) -> None:
    campaign = make_campaign()
    transport = _Broken(campaign, TransportError("PERMISSION_DENIED", retryable=False))
    reporter = Reporter(campaign, outbox, transport)
    reporter.record_many([1, 2])
    with pytest.raises(TransportError, match="PERMISSION_DENIED"):
        await reporter.send_pending()
    assert transport.submit_calls == 1 and outbox.count() == 2


async def test_inconsistent_response_is_refused(make_campaign: Any, outbox: Outbox) -> None:
    campaign = make_campaign()
    reporter = Reporter(campaign, outbox, _Broken(campaign, None))
    reporter.record_many([1, 2])
    with pytest.raises(TransportError, match="accounted"):
        await reporter.send_pending()
    assert outbox.count() == 2


async def test_estimate_recovers_the_truth(make_campaign: Any, outbox: Outbox, key_pair: KeyPair) -> None:
    """Through the whole client path, the aggregator's estimator still finds the true counts."""
    campaign = make_campaign()
    transport = InMemoryTransport([campaign])
    reporter = Reporter(campaign, outbox, transport)
    n = 1500
    reporter.record_many([3] * n)
    await reporter.send_pending()
    randomiser = randomiser_for(campaign)
    tally = randomiser.tally([opened(r, key_pair, campaign).payload for r in transport.submitted])
    assert tally.valid_count == n
    estimates = randomiser.estimate(tally.counts.tolist(), n)
    for value, estimate in enumerate(estimates):
        truth = n if value == 3 else 0
        assert math.isclose(estimate.estimate, truth, abs_tol=5 * estimate.std_error)


async def test_fetch_refuses_a_malformed_pinned_key_and_policy_errors_are_distinct(
    make_campaign: Any, outbox: Outbox, signing_key: SigningKey
) -> None:
    """A pinned key that is not 32 bytes (or not hex) is the app's bug: a signature error saying so.
    A genuine but weaker campaign is a CampaignPolicyError, never a CampaignSignatureError."""
    transport = InMemoryTransport([make_campaign()])
    for bad in (signing_key.public_raw[:31], "zz" * 32):
        with pytest.raises(CampaignSignatureError, match="pinned aggregator key is unusable"):
            await Reporter.fetch("c1", transport, outbox, aggregator_key=bad)
    strict = DevicePolicy(max_device_budget=0.5)
    with pytest.raises(CampaignPolicyError, match="budget") as refused:
        await Reporter.fetch("c1", transport, outbox, aggregator_key=signing_key.public_raw, policy=strict)
    assert not isinstance(refused.value, CampaignSignatureError)
