"""SyncReporter (blocking facade) and Reporter.fetch's retries: same behaviour as the async SDK."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from deniable.client import (
    BudgetExceeded,
    BudgetLedger,
    CampaignUnavailable,
    InMemoryTransport,
    Outbox,
    Reporter,
    SyncReporter,
    TransportError,
)
from deniable.v1 import deniable_pb2 as pb

CampaignFactory = Callable[..., pb.Campaign]


class FlakyCampaigns(InMemoryTransport):
    """An in-memory shuffler whose next ``failures`` GetCampaign calls fail (retryable or not)."""

    def __init__(self, campaigns: Sequence[pb.Campaign], failures: int, retryable: bool = True) -> None:
        super().__init__(campaigns)
        self.failures = failures
        self.retryable = retryable
        self.get_calls = 0

    async def get_campaign(self, campaign_id: str) -> pb.Campaign:
        self.get_calls += 1
        if self.failures > 0:
            self.failures -= 1
            raise TransportError("GetCampaign failed: UNAVAILABLE: injected", self.retryable)
        return await super().get_campaign(campaign_id)


class FakeTime:
    """A clock that only moves when the injected sleep is awaited."""

    def __init__(self) -> None:
        self.now = 1_000.0
        self.delays: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.delays.append(delay)
        self.now += delay


async def test_fetch_retries_unavailable_with_jittered_backoff(
    make_campaign: CampaignFactory, outbox: Outbox
) -> None:
    """Three UNAVAILABLE answers, then the campaign: fetch succeeds after three backoff sleeps,
    each within the full-jitter cap base * 2**attempt (0.05, 0.1, 0.2)."""
    transport = FlakyCampaigns([make_campaign()], failures=3)
    fake = FakeTime()
    reporter = await Reporter.fetch(
        "c1", transport, outbox, clock=fake.clock, sleep=fake.sleep, insecure_skip_verify=True
    )
    assert reporter.campaign.id == "c1"
    assert transport.get_calls == 4
    assert len(fake.delays) == 3
    for attempt, delay in enumerate(fake.delays):
        assert 0 <= delay <= 0.05 * 2**attempt


async def test_fetch_gives_up_with_a_clear_error_after_the_configured_time(
    make_campaign: CampaignFactory, outbox: Outbox
) -> None:
    """A shuffler that never answers: CampaignUnavailable (a retryable TransportError) once the
    configured 2 s have passed on the clock, never sleeping past the deadline."""
    transport = FlakyCampaigns([make_campaign()], failures=10**9)
    fake = FakeTime()
    with pytest.raises(CampaignUnavailable, match=r"campaign 'c1' unavailable after 2 s and \d+ attempts"):
        await Reporter.fetch(
            "c1",
            transport,
            outbox,
            clock=fake.clock,
            sleep=fake.sleep,
            give_up_after_s=2.0,
            max_delay_s=0.5,
            insecure_skip_verify=True,
        )
    assert fake.now == pytest.approx(1_002.0)
    assert transport.get_calls == len(fake.delays) + 1 > 4


async def test_fetch_does_not_retry_a_permanent_error(make_campaign: CampaignFactory, outbox: Outbox) -> None:
    """NOT_FOUND-like (non-retryable) failures are raised at once, not retried."""
    transport = FlakyCampaigns([make_campaign()], failures=1, retryable=False)
    fake = FakeTime()
    with pytest.raises(TransportError) as raised:
        await Reporter.fetch(
            "c1", transport, outbox, clock=fake.clock, sleep=fake.sleep, insecure_skip_verify=True
        )
    assert not isinstance(raised.value, CampaignUnavailable)
    assert transport.get_calls == 1 and fake.delays == []


def test_sync_reporter_records_and_sends_with_retries(make_campaign: CampaignFactory, outbox: Outbox) -> None:
    """Without any event loop: fetch (after a retried failure), record, send (after two retried
    submit failures): the report reaches the shuffler once and leaves the outbox."""
    transport = FlakyCampaigns([make_campaign()], failures=1)
    with SyncReporter.fetch(
        "c1", transport, outbox, give_up_after_s=30, insecure_skip_verify=True
    ) as reporter:
        reporter.record(3)
        assert outbox.count("c1") == 1
        transport.fail_next(2)
        result = reporter.send_pending(base_delay_s=0.001)
    assert (result.acknowledged, result.rejected, result.pending) == (1, 0, 0)
    assert len(transport.submitted) == 1 and transport.submit_calls == 3
    assert transport.closed


def test_sync_reporter_keeps_reports_queued_when_the_shuffler_stays_down(
    make_campaign: CampaignFactory, outbox: Outbox
) -> None:
    """Same give-up rule as send_pending: after max_attempts failures the report stays queued."""
    transport = InMemoryTransport([make_campaign()])
    with SyncReporter.fetch("c1", transport, outbox, insecure_skip_verify=True) as reporter:
        reporter.record(1)
        transport.fail_next(100)
        result = reporter.send_pending(max_attempts=3, base_delay_s=0.001)
    assert (result.acknowledged, result.pending) == (0, 1)
    assert transport.submit_calls == 3


def test_sync_reporter_uses_the_budget_ledger(make_campaign: CampaignFactory, tmp_path: Path) -> None:
    """The default budget (device_budget_epsilon = epsilon0) allows one report per campaign."""
    outbox = Outbox(tmp_path / "outbox.db")
    ledger = BudgetLedger(tmp_path / "budget.db")
    try:
        with SyncReporter.fetch(
            "c1", InMemoryTransport([make_campaign()]), outbox, ledger, insecure_skip_verify=True
        ) as reporter:
            reporter.record(0)
            with pytest.raises(BudgetExceeded):
                reporter.record(1)
        assert outbox.count("c1") == 1
    finally:
        ledger.close()
        outbox.close()


async def test_sync_reporter_refuses_a_running_event_loop(
    make_campaign: CampaignFactory, outbox: Outbox
) -> None:
    """Inside a loop the blocking facade would deadlock: it says to use Reporter instead."""
    with pytest.raises(RuntimeError, match="use Reporter there"):
        SyncReporter.fetch("c1", InMemoryTransport([make_campaign()]), outbox, insecure_skip_verify=True)
    await asyncio.sleep(0)


def test_closed_sync_reporter_refuses_calls(make_campaign: CampaignFactory, outbox: Outbox) -> None:
    reporter = SyncReporter.fetch(
        "c1", InMemoryTransport([make_campaign()]), outbox, insecure_skip_verify=True
    )
    reporter.close()
    reporter.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        reporter.send_pending()
