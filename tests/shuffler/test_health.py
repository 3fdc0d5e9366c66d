"""Issue 16/10: the shuffler is NOT_SERVING while its spool cannot be written (disk full) or its
upstream has not answered as an aggregator (never, or for longer than the grace), and SERVING again
by itself once the cause is gone; each condition has a gauge."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.processes import free_port

from deniable.core.plumbing import service
from deniable.shuffler import ShufflerConfig, start_shuffler
from deniable.shuffler.health import PROBE_FILE, UpstreamCheck
from deniable.v1 import deniable_pb2 as pb

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
FAST: dict[str, Any] = {"health_interval_s": 0.05, "batch_interval_s": 0.05, "campaign_refresh_s": 0.5}


async def _status(address: str) -> int:
    async with service.insecure_channel(address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="deniable.v1.Shuffler"), timeout=5
        )
        return int(reply.status)


async def _until_status(address: str, status: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while await _status(address) != status:
        assert time.monotonic() < deadline, f"health never became {status}"
        await asyncio.sleep(0.05)


def _dead_address() -> str:
    return f"127.0.0.1:{free_port()}"


async def test_spool_that_cannot_be_written_is_not_serving_until_it_can(
    upstream: Any,
    start: Any,
    channel_to: Any,
    kit: SimpleNamespace,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """/dev/full answers every write with ENOSPC: a real full disk for the probe, and for the spool."""
    campaign = upstream.fake.add(kit.make_campaign("c1"))
    shuffler = await start(**FAST)
    await _until_status(shuffler.address, SERVING)
    data_dir = tmp_path / "shuffler"  # the ``start`` fixture's data directory
    (data_dir / PROBE_FILE).unlink()
    (data_dir / PROBE_FILE).symlink_to("/dev/full")

    def disk_full(columns: object) -> None:
        with open("/dev/full", "wb") as full:
            full.write(b"x" * 8192)
            full.flush()

    monkeypatch.setattr(shuffler.handlers.store, "append", disk_full)
    stub = channel_to(shuffler)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.SubmitReports(pb.SubmitReportsRequest(reports=kit.make_reports(campaign, 1)))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    await _until_status(shuffler.address, NOT_SERVING)
    assert shuffler.monitor.unhealthy.labels(condition="spool")._value.get() == 1
    assert shuffler.metrics.spool_write_failures._value.get() == 1
    monkeypatch.undo()
    (data_dir / PROBE_FILE).unlink()
    await _until_status(shuffler.address, SERVING)
    assert shuffler.monitor.unhealthy.labels(condition="spool")._value.get() == 0
    ok = await stub.SubmitReports(pb.SubmitReportsRequest(reports=kit.make_reports(campaign, 1)))
    assert ok.accepted == 1


async def test_missing_upstream_is_not_serving_until_an_aggregator_answers_there(
    tmp_path: Path, kit: SimpleNamespace
) -> None:
    address = _dead_address()
    shuffler = await start_shuffler(
        ShufflerConfig(insecure=True, data_dir=tmp_path / "s", upstream=address, listen="127.0.0.1:0", **FAST)
    )
    try:
        assert await _status(shuffler.address) == NOT_SERVING  # from the first answer on
        assert "unreachable" in shuffler.monitor.failing["upstream"]
        assert shuffler.monitor.unhealthy.labels(condition="upstream")._value.get() == 1
        fake = kit.FakeAggregator()
        server = service.new_server()
        from deniable.v1 import deniable_pb2_grpc

        deniable_pb2_grpc.add_AggregatorServicer_to_server(fake, server)
        await service.add_health(server, "deniable.v1.Aggregator")
        service.bind(server, address)
        await server.start()
        try:
            await _until_status(shuffler.address, SERVING)
        finally:
            await server.stop(0)
    finally:
        await shuffler.stop(grace=1)


@pytest.mark.parametrize("upstream_is", ["garbage", "not-an-aggregator"])
async def test_garbage_or_wrong_upstream_is_not_serving(tmp_path: Path, upstream_is: str) -> None:
    other = None
    if upstream_is == "garbage":
        target = "no such host:::"
    else:  # a shuffler listens there: it has a health service, but no aggregator in it
        other = await start_shuffler(
            ShufflerConfig(
                insecure=True, data_dir=tmp_path / "o", upstream=_dead_address(), listen="127.0.0.1:0", **FAST
            )
        )
        target = other.address
    shuffler = await start_shuffler(
        ShufflerConfig(insecure=True, data_dir=tmp_path / "s", upstream=target, listen="127.0.0.1:0", **FAST)
    )
    try:
        await asyncio.sleep(0.3)
        assert await _status(shuffler.address) == NOT_SERVING
        if other is not None:
            assert "is not an aggregator" in shuffler.monitor.failing["upstream"]
    finally:
        await shuffler.stop(grace=1)
        if other is not None:
            await other.stop(grace=1)


async def test_upstream_silent_for_longer_than_the_grace_is_not_serving() -> None:
    """Within the grace a lost upstream keeps SERVING (a restart is not an outage); after it, not."""
    now = [0.0]
    answers = [True]

    async def call(request: Any, timeout: float) -> Any:
        if not answers[0]:
            empty = grpc.aio.Metadata()
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, empty, empty)
        return health_pb2.HealthCheckResponse(status=SERVING)

    class Channel:
        """Only what HealthStub needs: every method is ``call``."""

        def __getattr__(self, name: str) -> Any:
            return lambda *args, **kwargs: call

    check = UpstreamCheck(Channel(), "agg:1", grace_s=30.0, clock=lambda: now[0])  # type: ignore[arg-type]
    assert await check() is None
    answers[0] = False
    now[0] = 29.0
    assert await check() is None
    now[0] = 31.0
    reason = await check()
    assert reason is not None and "grace 30 s" in reason and "unreachable" in reason
    answers[0] = True
    assert await check() is None
