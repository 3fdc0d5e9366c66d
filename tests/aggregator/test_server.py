"""The aggregator as a real grpc.aio server on 127.0.0.1: statuses, limits, startup errors, shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import urllib.request
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.processes import free_port

from deniable.aggregator import AggregatorConfig, RunningAggregator, serve_aggregator, start_aggregator
from deniable.aggregator.server import DATABASE_FILE
from deniable.aggregator.store import SqliteAggregatorStore
from deniable.core.errors import ConfigurationError
from deniable.core.plumbing.service import insecure_channel
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc

if TYPE_CHECKING:  # the kit fixture's type only
    from support.aggregator_kit import Kit


LIMIT = 64 * 1024


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[RunningAggregator]:
    """An aggregator on a free loopback port with a 64 KiB receive limit."""
    aggregator = await start_aggregator(
        AggregatorConfig(
            insecure=True, data_dir=tmp_path / "agg", listen="127.0.0.1:0", max_message_bytes=LIMIT
        )
    )
    yield aggregator
    await aggregator.stop(grace=1.0)


@pytest.fixture
async def channel(running: RunningAggregator) -> AsyncIterator[grpc.aio.Channel]:
    """A client channel to the running aggregator."""
    async with insecure_channel(running.address) as chan:
        yield chan


@pytest.fixture
def stub(channel: grpc.aio.Channel) -> pb_grpc.AggregatorAsyncStub:
    return pb_grpc.AggregatorStub(channel)


async def code_of(call: Awaitable[object]) -> grpc.StatusCode:
    """Await a call that must fail and return its status code."""
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value.code()


async def test_full_round_trip_over_grpc(
    running: RunningAggregator, stub: pb_grpc.AggregatorAsyncStub, kit: Kit
) -> None:
    assert running.address == f"127.0.0.1:{running.port}"
    campaign = await stub.CreateCampaign(kit.binary_request(), timeout=10)
    assert await stub.GetCampaign(pb.GetCampaignRequest(campaign_id=campaign.id), timeout=10) == campaign
    listed = await stub.ListCampaigns(pb.ListCampaignsRequest(), timeout=10)
    assert [c.id for c in listed.campaigns] == [campaign.id]
    sealed = [kit.seal(campaign, i % 2) for i in range(40)]
    batch = kit.batch_of(campaign.id, [s.report for s in sealed], "b1")
    first = await stub.IngestBatch(batch, timeout=10)
    again = await stub.IngestBatch(batch, timeout=10)
    assert (first.counted, first.duplicate_batch, again.duplicate_batch) == (40, False, True)
    answer = await stub.BinarySum(pb.QueryRequest(campaign_id=campaign.id), timeout=10)
    assert answer.n == 40 and [b.label for b in answer.buckets] == ["no", "yes"]
    assert [b.raw_count for b in answer.buckets] == [
        sum(s.payload == bytes([v]) for s in sealed) for v in (0, 1)
    ]
    keys = await stub.ListKeys(pb.ListKeysRequest(), timeout=10)
    assert [(k.key_id, k.active, k.public_key) for k in keys.keys] == [(1, True, campaign.public_key)]


async def test_error_statuses(stub: pb_grpc.AggregatorAsyncStub, kit: Kit) -> None:
    assert await code_of(stub.CreateCampaign(kit.binary_request(epsilon0=-1.0), timeout=10)) == (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    assert await code_of(stub.CreateCampaign(kit.categorical_request(labels=["a"]), timeout=10)) == (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    await stub.CreateCampaign(kit.categorical_request(), timeout=10)
    assert await code_of(stub.CreateCampaign(kit.categorical_request(), timeout=10)) == (
        grpc.StatusCode.ALREADY_EXISTS
    )
    assert await code_of(stub.GetCampaign(pb.GetCampaignRequest(campaign_id="nope"), timeout=10)) == (
        grpc.StatusCode.NOT_FOUND
    )
    assert await code_of(stub.Histogram(pb.QueryRequest(campaign_id="nope"), timeout=10)) == (
        grpc.StatusCode.NOT_FOUND
    )
    assert await code_of(stub.IngestBatch(kit.batch_of("nope", []), timeout=10)) == grpc.StatusCode.NOT_FOUND
    assert await code_of(stub.BinarySum(pb.QueryRequest(campaign_id="colour"), timeout=10)) == (
        grpc.StatusCode.FAILED_PRECONDITION
    )
    bad_digest = kit.batch_of("colour", [])
    bad_digest.digest = b"\x00" * 32
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.IngestBatch(bad_digest, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "digest" in (err.value.details() or "")


async def test_failures_are_counted_in_metrics(
    running: RunningAggregator, stub: pb_grpc.AggregatorAsyncStub
) -> None:
    await code_of(stub.GetCampaign(pb.GetCampaignRequest(campaign_id="nope"), timeout=10))
    exposition = running.metrics.exposition().decode()
    assert 'deniable_aggregator_requests_failed_total{code="NOT_FOUND",rpc="GetCampaign"} 1.0' in exposition


async def test_oversize_message_is_refused_and_server_survives(
    stub: pb_grpc.AggregatorAsyncStub, kit: Kit
) -> None:
    campaign = await stub.CreateCampaign(kit.binary_request(), timeout=10)
    reports = [kit.seal(campaign, 1).report for _ in range(LIMIT // 140 + 20)]
    big = kit.batch_of(campaign.id, reports)
    assert big.ByteSize() > LIMIT
    assert await code_of(stub.IngestBatch(big, timeout=10)) == grpc.StatusCode.RESOURCE_EXHAUSTED
    small = kit.batch_of(campaign.id, reports[:100])
    assert (await stub.IngestBatch(small, timeout=10)).counted == 100


async def test_malformed_protobuf_is_refused_and_server_survives(
    channel: grpc.aio.Channel, stub: pb_grpc.AggregatorAsyncStub
) -> None:
    raw: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
        "/deniable.v1.Aggregator/IngestBatch", request_serializer=None, response_deserializer=None
    )
    for garbage in (b"\xff\xff\xff\xff\xff", b"\x0a\xff\xff\xff\xff\x0f", os.urandom(2048)):
        code = await code_of(raw(garbage, timeout=10))
        assert code != grpc.StatusCode.OK
    keys = await stub.ListKeys(pb.ListKeysRequest(), timeout=10)
    assert len(keys.keys) == 1


async def test_unexpected_error_is_internal_and_server_survives(
    running: RunningAggregator, stub: pb_grpc.AggregatorAsyncStub
) -> None:
    await running.store.close()  # every store call now fails in a way the handlers do not expect
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ListCampaigns(pb.ListCampaignsRequest(), timeout=10)
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert "closed" not in (err.value.details() or "")
    assert len((await stub.ListKeys(pb.ListKeysRequest(), timeout=10)).keys) == 1
    exposition = running.metrics.exposition().decode()
    assert 'code="INTERNAL",rpc="ListCampaigns"' in exposition


async def test_health_reports_serving(channel: grpc.aio.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "deniable.v1.Aggregator"):
        reply = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_port_already_taken(running: RunningAggregator, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as err:
        await start_aggregator(
            AggregatorConfig(insecure=True, data_dir=tmp_path / "second", listen=running.address)
        )
    assert "\n" not in str(err.value)


async def test_port_taken_by_another_socket(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(ConfigurationError):
            await start_aggregator(
                AggregatorConfig(insecure=True, data_dir=tmp_path / "agg", listen=f"127.0.0.1:{port}")
            )


async def test_unusable_data_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigurationError, match="not writable"):
        await start_aggregator(
            AggregatorConfig(insecure=True, data_dir=blocker / "agg", listen="127.0.0.1:0")
        )


async def test_unsafe_key_stops_startup(tmp_path: Path) -> None:
    config = AggregatorConfig(insecure=True, data_dir=tmp_path / "agg", listen="127.0.0.1:0")
    await (await start_aggregator(config)).stop()
    (config.data_dir / "keys" / "1.key").chmod(0o640)
    with pytest.raises(ConfigurationError, match="chmod 600"):
        await start_aggregator(config)


async def test_metrics_endpoint(tmp_path: Path) -> None:
    free = free_port()
    aggregator = await start_aggregator(
        AggregatorConfig(insecure=True, data_dir=tmp_path / "agg", listen="127.0.0.1:0", metrics_port=free)
    )
    try:
        assert aggregator.metrics_port == free
        url = f"http://127.0.0.1:{free}/metrics"
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read().decode())
        assert "deniable_aggregator_reports_counted_total" in body
    finally:
        await aggregator.stop()


async def test_sigterm_stops_gracefully_and_store_is_consistent(tmp_path: Path, kit: Kit) -> None:
    config = AggregatorConfig(insecure=True, data_dir=tmp_path / "agg", listen="127.0.0.1:0")
    started: asyncio.Future[RunningAggregator] = asyncio.get_running_loop().create_future()
    serving = asyncio.create_task(serve_aggregator(config, on_started=started.set_result))
    aggregator = await asyncio.wait_for(started, 10)
    acknowledged = 0
    async with insecure_channel(aggregator.address) as chan:
        stub = pb_grpc.AggregatorStub(chan)
        campaign = await stub.CreateCampaign(kit.binary_request(), timeout=10)
        reports = [kit.seal(campaign, 1).report for _ in range(1200)]
        batches = [kit.batch_of(campaign.id, reports[i : i + 200]) for i in range(0, 1200, 200)]
        calls = [asyncio.ensure_future(stub.IngestBatch(b, timeout=20)) for b in batches]
        await asyncio.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(serving, 20)
        for call in calls:
            with contextlib.suppress(grpc.aio.AioRpcError):
                acknowledged += (await call).counted
    with pytest.raises(grpc.aio.AioRpcError):
        async with insecure_channel(aggregator.address) as chan:
            await pb_grpc.AggregatorStub(chan).ListKeys(pb.ListKeysRequest(), timeout=2)

    store = SqliteAggregatorStore(config.data_dir / DATABASE_FILE)
    try:
        snapshot = await store.snapshot(campaign.id, 2)
        recorded = [await store.find_batch(b.batch_id) for b in batches]
    finally:
        await store.close()
    # Every batch is either wholly counted (and recorded) or not at all; every ack is durable.
    assert snapshot.n == sum(r.counted for r in recorded if r is not None) == 200 * snapshot.batches
    assert sum(snapshot.counts) == snapshot.n
    assert snapshot.n >= acknowledged
    # After a restart the shuffler's retries of all six batches complete the count exactly once.
    restarted = await start_aggregator(config)
    try:
        async with insecure_channel(restarted.address) as chan:
            stub = pb_grpc.AggregatorStub(chan)
            for batch in batches:
                await stub.IngestBatch(batch, timeout=20)
            answer = await stub.BinarySum(pb.QueryRequest(campaign_id=campaign.id), timeout=10)
            assert answer.n == 1200 and answer.rejected == 0
    finally:
        await restarted.stop()


async def test_abrupt_stop_mid_ingest_leaves_whole_batches(tmp_path: Path, kit: Kit) -> None:
    config = AggregatorConfig(
        insecure=True, data_dir=tmp_path / "agg", listen="127.0.0.1:0", decrypt_workers=2
    )
    aggregator = await start_aggregator(config)
    async with insecure_channel(aggregator.address) as chan:
        stub = pb_grpc.AggregatorStub(chan)
        campaign = await stub.CreateCampaign(kit.binary_request(), timeout=10)
        reports = [kit.seal(campaign, 0).report for _ in range(4000)]
        batches = [kit.batch_of(campaign.id, reports[i : i + 500]) for i in range(0, 4000, 500)]
        calls = [asyncio.ensure_future(stub.IngestBatch(b, timeout=20)) for b in batches]
        await asyncio.sleep(0.1)
        await aggregator.stop(grace=0)  # cancel whatever is in flight
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
    acknowledged = sum(o.counted for o in outcomes if isinstance(o, pb.IngestBatchResponse))
    store = SqliteAggregatorStore(config.data_dir / DATABASE_FILE)
    try:
        snapshot = await store.snapshot(campaign.id, 2)
        recorded = [await store.find_batch(b.batch_id) for b in batches]
    finally:
        await store.close()
    assert snapshot.n == 500 * snapshot.batches == sum(r.counted for r in recorded if r is not None)
    assert sum(snapshot.counts) == snapshot.n
    assert snapshot.n >= acknowledged
