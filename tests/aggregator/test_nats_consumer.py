"""The aggregator's NATS JetStream worker: bad messages are terminated and counted, never crash it
nor change a count; a good batch is counted once even when published twice (beyond the broker's
duplicate window, as after a shuffler restart)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import nats
import pytest

from deniable.aggregator import AggregatorConfig, RunningAggregator, start_aggregator
from deniable.core.plumbing.jetstream import CONSUMER, STREAM, SUBJECT
from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:  # the kit fixture's type only
    from support.aggregator_kit import Kit


@pytest.fixture
async def running(tmp_path: Path, nats_url: str) -> AsyncIterator[RunningAggregator]:
    aggregator = await start_aggregator(
        AggregatorConfig(
            insecure=True, data_dir=tmp_path / "agg", listen="127.0.0.1:0", nats=nats_url, nats_ack_wait_s=2
        )
    )
    yield aggregator
    await aggregator.stop(grace=1.0)


def outcome(running: RunningAggregator, name: str) -> float:
    value = running.metrics.registry.get_sample_value("deniable_aggregator_batches_total", {"outcome": name})
    return value or 0.0


async def settled(running: RunningAggregator, nats_url: str, refused: float, taken: float) -> None:
    """Until the worker refused ``refused`` and ingested or recognised ``taken`` batches, none pending."""
    client = await nats.connect(nats_url)
    try:
        deadline = time.monotonic() + 60
        while True:
            info = await client.jetstream().consumer_info(STREAM, CONSUMER)
            done = outcome(running, "ingested") + outcome(running, "duplicate")
            if outcome(running, "refused") == refused and done == taken and not info.num_ack_pending:
                assert not info.num_pending
                return
            assert time.monotonic() < deadline, (outcome(running, "refused"), done, info)
            await asyncio.sleep(0.1)
    finally:
        await client.close()


async def test_bad_messages_are_terminated_and_a_batch_counts_once(
    running: RunningAggregator, nats_url: str, kit: Kit
) -> None:
    campaign = await running.handlers.create_campaign(kit.binary_request("n", n_min=3))
    reports = [kit.seal(campaign, 1).report for _ in range(4)]
    good = kit.batch_of("n", reports)
    wrong_digest = kit.batch_of("n", reports[:3])
    wrong_digest.digest = bytes(32)
    client = await nats.connect(nats_url)
    js = client.jetstream()
    try:
        await js.publish(SUBJECT, b"\xff\x00 not a batch")
        await js.publish(SUBJECT, wrong_digest.SerializeToString())
        await js.publish(SUBJECT, good.SerializeToString())
        await js.publish(SUBJECT, good.SerializeToString())  # no Nats-Msg-Id: the broker keeps both
        await settled(running, nats_url, refused=2, taken=2)
    finally:
        await client.close()
    answer = await running.handlers.query(pb.QueryRequest(campaign_id="n"), binary=True)
    assert answer.n == 4
    assert outcome(running, "duplicate") == 1
