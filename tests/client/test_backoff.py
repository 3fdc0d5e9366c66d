"""The client retries with core.backoff: equal-jitter exponential backoff from the CSPRNG, capped."""

from __future__ import annotations

from typing import Any

from deniable.client.outbox import Outbox
from deniable.client.reporter import Reporter
from deniable.client.transport import InMemoryTransport
from deniable.core.backoff import backoff_delay


def test_delay_bounds() -> None:
    for attempt in range(12):
        cap = min(1.0, 0.05 * 2**attempt)
        samples = [backoff_delay(attempt, 0.05, 1.0) for _ in range(200)]
        assert all(0.0 <= s <= cap for s in samples)
        assert max(samples) > cap / 2  # spread over the interval, not stuck at 0
    assert backoff_delay(10_000, 0.05, 2.0) <= 2.0
    assert backoff_delay(3, 0.0, 1.0) == 0.0


async def test_sleeps_stay_under_the_cap(make_campaign: Any, outbox: Outbox, sleeps: Any) -> None:
    campaign = make_campaign()
    transport = InMemoryTransport([campaign])
    reporter = Reporter(campaign, outbox, transport, sleep=sleeps)
    reporter.record(4)
    transport.fail_next(9)
    result = await reporter.send_pending(max_attempts=10, base_delay_s=0.05, max_delay_s=0.3)
    assert result.acknowledged == 1
    assert len(sleeps.delays) == 9
    for attempt, delay in enumerate(sleeps.delays):
        assert 0.0 <= delay <= min(0.3, 0.05 * 2**attempt)
