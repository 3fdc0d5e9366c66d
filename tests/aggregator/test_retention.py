"""Retention: report ids live for the campaign window plus a margin, then are forgotten; a replay
after that is rejected as CAMPAIGN_CLOSED and never counted."""

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

MARGIN = 100.0
CLOSED = int(pb.CAMPAIGN_CLOSED)
DUP = int(pb.DUPLICATE_REPORT)


@pytest.fixture
async def timed(tmp_path: Path, keyring: Keyring) -> AsyncIterator[tuple[AggregatorHandlers, Clock]]:
    store = SqliteAggregatorStore(tmp_path / "retention.sqlite3")
    clock = Clock()
    yield (
        AggregatorHandlers(store, keyring, AggregatorMetrics(), clock=clock, retention_margin_s=MARGIN),
        clock,
    )
    await store.close()


async def test_replay_after_gc_is_closed_and_not_counted(
    timed: tuple[AggregatorHandlers, Clock], kit: Any
) -> None:
    handlers, clock = timed
    campaign = await handlers.create_campaign(kit.binary_request("r", window_end_unix=int(clock.now) + 10))
    sealed = [kit.seal(campaign, v % 2).report for v in range(6)]
    assert (await handlers.ingest_batch(kit.batch_of("r", sealed))).counted == 6
    counts = (await handlers.store.snapshot("r", 2)).counts

    clock.now += 10 + MARGIN - 1  # still inside the margin: a replay is a duplicate, ids kept
    late = await handlers.ingest_batch(kit.batch_of("r", sealed))
    assert (late.counted, kit.rejected_map(late)) == (0, {DUP: 6})
    assert await handlers.collect_garbage() == {}
    assert await handlers.store.report_id_count("r") == 6

    clock.now += 1  # retention over: GC forgets the ids
    assert await handlers.collect_garbage() == {"r": 6}
    assert await handlers.store.report_id_count("r") == 0
    assert handlers.metrics.report_ids_forgotten._value.get() == 6
    replay = await handlers.ingest_batch(kit.batch_of("r", sealed))
    assert (replay.counted, kit.rejected_map(replay)) == (0, {CLOSED: 6})
    assert (await handlers.store.snapshot("r", 2)).counts == counts


async def test_expired_campaign_refuses_before_gc_ran(
    timed: tuple[AggregatorHandlers, Clock], kit: Any
) -> None:
    """A batch arriving past retention is closed even if the periodic GC has not run yet."""
    handlers, clock = timed
    campaign = await handlers.create_campaign(kit.binary_request("x", window_end_unix=int(clock.now) + 1))
    sealed = [kit.seal(campaign, 1).report for _ in range(3)]
    clock.now += 1 + MARGIN
    response = await handlers.ingest_batch(kit.batch_of("x", sealed))
    assert (response.counted, kit.rejected_map(response)) == (0, {CLOSED: 3})
    assert await handlers.store.retired() == {"x"}


async def test_closing_early_starts_the_margin(timed: tuple[AggregatorHandlers, Clock], kit: Any) -> None:
    """A campaign keeps its ids until its window end (given or the default) plus the margin;
    ``campaign close`` ends the window now, so the margin starts then."""
    handlers, clock = timed
    created = await handlers.create_campaign(kit.binary_request("open"))
    assert created.window_end_unix > clock.now + MARGIN
    await handlers.ingest_batch(kit.batch_of("open", [kit.seal(created, 1).report]))
    clock.now += MARGIN
    assert await handlers.collect_garbage() == {}
    await handlers.close_campaign(pb.KeyCloseCampaignRequest(campaign_id="open"))
    clock.now += MARGIN
    assert await handlers.collect_garbage() == {"open": 1}
