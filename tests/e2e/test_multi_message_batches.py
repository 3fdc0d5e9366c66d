"""A multi-message campaign released in several batches, through the real services: every device
whole in one batch, every batch at least the target, every query answerable while batches arrive."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.stack import start_insecure_pair

from deniable.aggregator import RunningAggregator
from deniable.client import GrpcTransport, Outbox, Reporter
from deniable.core.plumbing.service import insecure_channel
from deniable.shuffler import RunningShuffler
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc

DEVICES = 120
TARGET = 25


@dataclass
class Pipeline:
    """Both services, the operator's stub and one simulated source's transport and outbox."""

    aggregator: RunningAggregator
    shuffler: RunningShuffler
    operator: pb_grpc.AggregatorAsyncStub
    transport: GrpcTransport
    outbox: Outbox


@asynccontextmanager
async def insecure_pipeline(tmp_path: Path, **shuffler_options: Any) -> AsyncIterator[Pipeline]:
    """Aggregator and shuffler without TLS (these tests are about batches, not TLS); all closed on exit."""
    # quota_per_source=0: one simulated source sends for every device
    aggregator, shuffler = await start_insecure_pair(tmp_path, quota_per_source=0, **shuffler_options)
    channel = insecure_channel(aggregator.address)
    transport = GrpcTransport(shuffler.address, insecure=True)
    outbox = Outbox(tmp_path / "outbox.db")
    try:
        yield Pipeline(aggregator, shuffler, pb_grpc.AggregatorStub(channel), transport, outbox)
    finally:
        outbox.close()
        await transport.close()
        await channel.close()
        await shuffler.stop()
        await aggregator.stop()


def sum_campaign(batch_target: int) -> pb.CreateCampaignRequest:
    """The multi-message binary sum campaign "sum", planned for batches of ``batch_target`` devices."""
    return pb.CreateCampaignRequest(
        id="sum",
        question="Did it?",
        kind=pb.BINARY,
        mechanism=pb.MULTI_MESSAGE_SUM,
        epsilon0=2.0,
        n_min=10,
        batch_target=batch_target,
        params={"expected_n": float(batch_target)},
    )


async def test_split_and_mix_sum_in_many_batches_counts_every_device(tmp_path: Path) -> None:
    """120 devices, 9 messages each, sent 7 messages a request (not a multiple of 9): requests are
    completed to whole devices, the shuffler cuts only between requests at ≥ 25 devices (the rest,
    ≥ n_min, at the window's close), and the
    aggregator (which refuses a batch splitting a device) counts all of them. Queries between the
    releases never fail. Before: batches were cut anywhere and the query hit INTERNAL."""
    async with insecure_pipeline(tmp_path, batch_interval_s=0.05) as pipeline:
        aggregator, shuffler, operator = pipeline.aggregator, pipeline.shuffler, pipeline.operator
        campaign = await operator.CreateCampaign(sum_campaign(TARGET), timeout=60)
        reporter = await Reporter.fetch(
            "sum", pipeline.transport, pipeline.outbox, insecure_skip_verify=True
        )  # about batches, not signatures
        answers = []
        for first in range(0, DEVICES, 20):  # devices arrive 20 at a time; a query after each wave
            reporter.record_many([i % 2 for i in range(first, first + 20)])
            sent = await reporter.send_pending(batch_size=7)
            assert sent.pending == 0 and sent.rejected == 0, sent
            answers.append(await operator.BinarySum(pb.QueryRequest(campaign_id="sum"), timeout=30))
        await operator.CloseCampaign(pb.KeyCloseCampaignRequest(campaign_id="sum"), timeout=30)
        flushed = await shuffler.flush("sum")
        messages = reporter.randomiser.messages_per_device
        assert messages is not None and campaign.batch_target == TARGET * messages
        held = sum(h.pending for h in flushed.window_held)  # fewer than n_min left at the close: held
        if held:
            counted = await operator.BinarySum(pb.QueryRequest(campaign_id="sum"), timeout=30)
            assert counted.messages + held == DEVICES * messages and held < 10 * messages
            await operator.ReleaseBelowNMin(pb.ReleaseBelowNMinRequest(campaign_id="sum"), timeout=30)
            await shuffler.flush("sum", below_n_min=True)
        final = await operator.BinarySum(pb.QueryRequest(campaign_id="sum"), timeout=30)
        assert final.n == DEVICES and final.messages == DEVICES * messages
        assert final.privacy.below_n_min_authorised == bool(held)
        # Batches at the target while devices arrive, then the rest (≥ n_min) when the window closes.
        releases = shuffler.metrics.releases
        assert releases.labels(cause="target")._value.get() >= 2
        assert releases.labels(cause="window")._value.get() <= 1
        assert final.privacy.batches >= 3 and (held or final.privacy.smallest_batch >= 10)
        if final.privacy.smallest_batch < TARGET:
            assert "below the campaign's batch target" in final.privacy.note
        assert len(answers) == DEVICES // 20  # every query between releases answered (no INTERNAL)
        assert [a.n for a in answers] == sorted(a.n for a in answers)
        assert 'outcome="incomplete"' not in aggregator.handlers.metrics.exposition().decode()


async def test_a_release_larger_than_a_batch_is_one_shuffle_stated_at_its_total(tmp_path: Path) -> None:
    """The short version of the defaults demo of multi_message_histogram (ADR 0023): a release
    several times one batch's byte limit travels as chunks of one permutation, and the aggregator
    states it at its total (every device), as one batch; before, each chunk was its own shuffle
    and the statement was at the smallest chunk."""
    async with insecure_pipeline(
        tmp_path,
        batch_interval_s=3600.0,  # released by the flush below
        max_batch_bytes=40_000,  # about 200 messages of 144 + 32 bytes per chunk
    ) as pipeline:
        shuffler, operator = pipeline.shuffler, pipeline.operator
        await operator.CreateCampaign(sum_campaign(DEVICES), timeout=60)
        reporter = await Reporter.fetch("sum", pipeline.transport, pipeline.outbox, insecure_skip_verify=True)
        reporter.record_many([i % 2 for i in range(DEVICES)])
        sent = await reporter.send_pending()
        assert sent.pending == 0 and sent.rejected == 0, sent
        await operator.CloseCampaign(pb.KeyCloseCampaignRequest(campaign_id="sum"), timeout=30)
        flushed = await shuffler.flush("sum")
        messages = reporter.randomiser.messages_per_device
        assert messages is not None and flushed.reports_forwarded == DEVICES * messages
        assert shuffler.metrics.batches_forwarded._value.get() >= 4  # several chunks
        final = await operator.BinarySum(pb.QueryRequest(campaign_id="sum"), timeout=30)
        assert (final.n, final.messages) == (DEVICES, DEVICES * messages)
        assert (final.privacy.smallest_batch, final.privacy.batches, final.privacy.releases) == (
            DEVICES,
            1,
            1,
        )
        assert final.privacy.incomplete_releases == 0
        assert "below the campaign's batch target" not in final.privacy.note
