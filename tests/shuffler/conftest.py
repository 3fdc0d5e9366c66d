"""Fixtures for shuffler tests: a fake aggregator on a real gRPC server, campaigns, running shufflers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from deniable.core.plumbing import service
from deniable.core.rng import default_rng
from deniable.shuffler.server import RunningShuffler, ShufflerConfig, start_shuffler
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc

CIPHERTEXT_LENGTH = 64


def make_campaign(
    campaign_id: str = "c1", *, n_min: int = 5, key_id: int = 7, batch_target: int = 1_000_000, **fields: Any
) -> pb.Campaign:
    """A campaign as the aggregator would describe it (only envelope-relevant fields matter here).

    The default batch target is never reached in these tests: batches form on flush unless a test
    sets a reachable target or closes the window.
    """
    return pb.Campaign(
        batch_target=batch_target,
        id=campaign_id,
        question="q?",
        kind=pb.BINARY,
        labels=["no", "yes"],
        mechanism=pb.BINARY_RR,
        epsilon0=1.0,
        delta=1e-6,
        n_min=n_min,
        key_id=key_id,
        public_key=bytes(32),
        ciphertext_length=CIPHERTEXT_LENGTH,
        **fields,
    )


def make_reports(campaign: pb.Campaign, count: int, *, start: int = 0) -> list[pb.EncryptedReport]:
    """Distinct well-formed envelopes: the first 8 bytes number them, the rest is random."""
    length = campaign.ciphertext_length
    return [
        pb.EncryptedReport(
            campaign_id=campaign.id,
            key_id=campaign.key_id,
            ciphertext=(start + i).to_bytes(8, "big") + default_rng().bytes(length - 8),
        )
        for i in range(count)
    ]


@dataclass
class IngestCall:
    """One IngestBatch call the fake saw, and whether it answered OK."""

    batch: pb.ShuffledBatch
    ok: bool


@dataclass
class FakeAggregator(deniable_pb2_grpc.AggregatorServicer):
    """Upstream stand-in: serves campaigns from a dict, records IngestBatch, fails on request."""

    campaigns: dict[str, pb.Campaign] = field(default_factory=dict)
    calls: list[IngestCall] = field(default_factory=list)
    get_campaign_calls: list[str] = field(default_factory=list)
    fail_next: int = 0
    fail_campaign_calls: bool = False
    seen: set[str] = field(default_factory=set)
    ingest_delay_s: float = 0.0
    get_campaign_delay_s: float = 0.0
    lose_next_responses: int = 0  # process the batch, then answer UNAVAILABLE (a lost acknowledgement)

    def add(self, campaign: pb.Campaign) -> pb.Campaign:
        self.campaigns[campaign.id] = campaign
        return campaign

    duplicates: int = 0

    @property
    def acked(self) -> list[pb.ShuffledBatch]:
        """Batches acknowledged (first acknowledgement of each id)."""
        out: dict[str, pb.ShuffledBatch] = {}
        for call in self.calls:
            if call.ok:
                out.setdefault(call.batch.batch_id, call.batch)
        return list(out.values())

    def forwarded_ciphertexts(self) -> list[bytes]:
        return [r.ciphertext for b in self.acked for r in b.reports]

    async def GetCampaign(self, request: pb.GetCampaignRequest, context: Any) -> pb.Campaign:
        self.get_campaign_calls.append(request.campaign_id)
        if self.get_campaign_delay_s:
            await asyncio.sleep(self.get_campaign_delay_s)
        if self.fail_campaign_calls:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "told to fail")
        campaign = self.campaigns.get(request.campaign_id)
        if campaign is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such campaign")
        assert campaign is not None  # abort raised otherwise
        return campaign

    async def ListCampaigns(self, request: pb.ListCampaignsRequest, context: Any) -> pb.ListCampaignsResponse:
        if self.fail_campaign_calls:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "told to fail")
        return pb.ListCampaignsResponse(campaigns=[self.campaigns[k] for k in sorted(self.campaigns)])

    async def IngestBatch(self, request: pb.ShuffledBatch, context: Any) -> pb.IngestBatchResponse:
        if self.ingest_delay_s:
            await asyncio.sleep(self.ingest_delay_s)
        if self.fail_next > 0:
            self.fail_next -= 1
            self.calls.append(IngestCall(request, ok=False))
            await context.abort(grpc.StatusCode.UNAVAILABLE, "told to fail")
        duplicate = request.batch_id in self.seen
        self.seen.add(request.batch_id)
        if self.lose_next_responses > 0:
            self.lose_next_responses -= 1
            self.calls.append(IngestCall(request, ok=False))
            await context.abort(grpc.StatusCode.UNAVAILABLE, "acknowledgement lost")
        self.calls.append(IngestCall(request, ok=True))
        self.duplicates += duplicate
        return pb.IngestBatchResponse(
            batch_id=request.batch_id,
            duplicate_batch=duplicate,
            counted=0 if duplicate else len(request.reports),
        )


@dataclass
class Upstream:
    """A fake aggregator served on 127.0.0.1."""

    fake: FakeAggregator
    server: grpc.aio.Server
    address: str

    async def stop(self) -> None:
        await self.server.stop(None)


async def start_upstream(fake: FakeAggregator | None = None) -> Upstream:
    fake = fake or FakeAggregator()  # type: ignore[abstract]  # the base answers UNIMPLEMENTED for the rest
    server = service.new_server()
    deniable_pb2_grpc.add_AggregatorServicer_to_server(fake, server)
    await service.add_health(server, "deniable.v1.Aggregator")  # the shuffler's health asks it
    port = service.bind(server, "127.0.0.1:0")
    await server.start()
    return Upstream(fake, server, f"127.0.0.1:{port}")


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    running = await start_upstream()
    yield running
    await running.stop()


ShufflerFactory = Callable[..., Awaitable[RunningShuffler]]


@pytest.fixture
async def start(tmp_path: Path, upstream: Upstream) -> AsyncIterator[ShufflerFactory]:
    """Start shufflers on 127.0.0.1:0 (fast ticks, short waits by default); all stopped afterwards."""
    running: list[RunningShuffler] = []

    async def factory(**overrides: Any) -> RunningShuffler:
        settings: dict[str, Any] = {
            "data_dir": tmp_path / "shuffler",
            "upstream": upstream.address,
            "listen": "127.0.0.1:0",
            "batch_interval_s": 0.05,
            "retry_base_s": 0.05,
            "retry_max_s": 0.2,
            "campaign_refresh_s": 0.5,
            "insecure": True,  # tests of spool and batching; TLS: tests/e2e/test_trust_boundaries.py
            "quota_per_source": 0,  # many reports from 127.0.0.1; quotas: tests/shuffler/test_quota.py
        }
        settings.update(overrides)
        shuffler = await start_shuffler(ShufflerConfig(**settings))
        running.append(shuffler)
        return shuffler

    yield factory
    for shuffler in running:
        await shuffler.stop(grace=1.0)


@pytest.fixture
async def channel_to() -> AsyncIterator[Callable[[RunningShuffler], deniable_pb2_grpc.ShufflerAsyncStub]]:
    """Open a client stub to a shuffler; channels closed afterwards."""
    channels: list[grpc.aio.Channel] = []

    def open_stub(shuffler: RunningShuffler) -> deniable_pb2_grpc.ShufflerAsyncStub:
        channel = service.insecure_channel(shuffler.address)
        channels.append(channel)
        return deniable_pb2_grpc.ShufflerStub(channel)

    yield open_stub
    for channel in channels:
        await channel.close()


async def eventually(check: Callable[[], bool], timeout: float = 5.0, interval: float = 0.02) -> None:
    """Wait until ``check()`` holds; AssertionError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(interval)


@pytest.fixture
def kit() -> SimpleNamespace:
    """The helpers above, for test modules (importlib import mode cannot import conftest)."""
    return SimpleNamespace(
        make_campaign=make_campaign,
        make_reports=make_reports,
        eventually=eventually,
        start_upstream=start_upstream,
        FakeAggregator=FakeAggregator,
        CIPHERTEXT_LENGTH=CIPHERTEXT_LENGTH,
    )
