"""Closed means closed: a batch arriving after the window end (or a close) plus the grace is not
counted, whatever the shuffler does (issue 20, item 6). Before, such a batch was counted until the
retention margin (7 days) ran out, while docs/security.md said it was not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from support.clock import Clock

from deniable.aggregator.handlers import AggregatorHandlers
from deniable.aggregator.keys import Keyring
from deniable.aggregator.metrics import AggregatorMetrics
from deniable.aggregator.store import SqliteAggregatorStore
from deniable.v1 import deniable_pb2 as pb

GRACE = 60.0
CLOSED = int(pb.CAMPAIGN_CLOSED)


@pytest.fixture
async def timed(tmp_path: Path, keyring: Keyring) -> AsyncIterator[tuple[AggregatorHandlers, Clock]]:
    store = SqliteAggregatorStore(tmp_path / "closed.sqlite3")
    clock = Clock()
    yield AggregatorHandlers(store, keyring, AggregatorMetrics(), clock=clock, close_grace_s=GRACE), clock
    await store.close()


async def test_a_batch_within_the_grace_counts_and_one_after_it_does_not(
    timed: tuple[AggregatorHandlers, Clock], kit: Any
) -> None:
    handlers, clock = timed
    campaign = await handlers.create_campaign(kit.binary_request("w", window_end_unix=int(clock.now) + 10))
    clock.now += 10 + GRACE - 1  # closed, but inside the grace: the shuffler's release at close
    inside = await handlers.ingest_batch(kit.batch_of("w", [kit.seal(campaign, 1).report for _ in range(3)]))
    assert inside.counted == 3
    clock.now += 1  # the grace is over
    late = await handlers.ingest_batch(kit.batch_of("w", [kit.seal(campaign, 1).report for _ in range(4)]))
    assert (late.counted, kit.rejected_map(late)) == (0, {CLOSED: 4})
    answer = await handlers.query(pb.QueryRequest(campaign_id="w"), binary=True)
    assert (answer.n, answer.rejected) == (3, 4)
    exposition = handlers.metrics.exposition().decode()
    assert 'deniable_aggregator_reports_rejected_total{reason="campaign_closed"} 4.0' in exposition
    assert 'deniable_aggregator_batches_total{outcome="after_close"} 1.0' in exposition


async def test_an_operator_close_starts_the_grace_at_once(
    timed: tuple[AggregatorHandlers, Clock], kit: Any
) -> None:
    handlers, clock = timed
    campaign = await handlers.create_campaign(kit.binary_request("c"))
    await handlers.close_campaign(pb.KeyCloseCampaignRequest(campaign_id="c"))
    clock.now += GRACE
    late = await handlers.ingest_batch(kit.batch_of("c", [kit.seal(campaign, 0).report for _ in range(2)]))
    assert (late.counted, kit.rejected_map(late)) == (0, {CLOSED: 2})


async def test_without_the_grace_rule_the_late_batch_would_count(
    tmp_path: Path, keyring: Keyring, kit: Any
) -> None:
    """The protection removed (a grace as long as retention): the same late batch counts."""
    store = SqliteAggregatorStore(tmp_path / "open.sqlite3")
    clock = Clock()
    handlers = AggregatorHandlers(
        store, keyring, AggregatorMetrics(), clock=clock, close_grace_s=7 * 86_400.0
    )
    campaign = await handlers.create_campaign(kit.binary_request("w", window_end_unix=int(clock.now) + 10))
    clock.now += 10 + GRACE
    late = await handlers.ingest_batch(kit.batch_of("w", [kit.seal(campaign, 1).report for _ in range(4)]))
    assert late.counted == 4
    await store.close()
