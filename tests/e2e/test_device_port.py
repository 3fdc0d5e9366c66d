"""The device port cannot be starved (issue 20, item 3; ADR 0032).

Strangers (TLS, no client certificate) hold open health Watch streams, SubmitReports calls whose
request never finishes arriving, and idle TLS connections; a device's GetCampaign and
SubmitReports must still succeed and its report be counted at the aggregator. With the old
configuration (gRPC's own ``maximum_concurrent_rpcs`` counting every stream, Watch open to
anyone) the same device gets RESOURCE_EXHAUSTED.

Bounded and loopback only: STREAMS streams over CHANNELS channels plus IDLE connections, all
closed in ``finally``. 1,000 streams take about 4 s here, so the default run holds them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from deniable.aggregator import AggregatorConfig, RunningAggregator, start_aggregator
from deniable.core.campaigns import randomiser_for
from deniable.core.crypto import PublicKey, seal_report
from deniable.core.plumbing.certs import DevCerts
from deniable.core.plumbing.service import CHANNEL_OPTIONS
from deniable.core.plumbing.tls import open_channel
from deniable.core.wire import Plaintext, encode, new_report_id
from deniable.shuffler import RunningShuffler, ShufflerConfig, start_shuffler
from deniable.shuffler import server as shuffler_server
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc

LIMIT = 32
"""The shuffler's ``max_concurrent_rpcs``: far below what strangers hold."""
STREAMS = 1000
CHANNELS = 10
IDLE = 50


@dataclass
class Strangers:
    """What the strangers hold open, and the event that lets their slow calls end."""

    channels: list[grpc.aio.Channel]
    calls: list[Any]
    sockets: list[asyncio.StreamWriter]
    stop: asyncio.Event

    async def close(self) -> None:
        self.stop.set()
        for call in self.calls:
            call.cancel()
        for channel in self.channels:
            await channel.close()
        for writer in self.sockets:
            writer.close()


async def _hold(address: str, certs: DevCerts, streams: int) -> Strangers:
    """Open ``streams`` stranger streams (half Watch, half never-finished SubmitReports) and IDLE
    idle TLS connections, none with a client certificate; wait until every stream is open."""
    stop = asyncio.Event()
    channels, calls = [], []
    for i in range(CHANNELS):
        options = [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1), ("grpc.channel_id", i)]
        channel = grpc.aio.secure_channel(
            address, certs.client_tls("shuffler").credentials(), options=options
        )
        channels.append(channel)
    slow = "/deniable.v1.Shuffler/SubmitReports"

    async def never() -> AsyncIterator[bytes]:
        await stop.wait()
        yield b""

    for i in range(streams):
        channel = channels[i % CHANNELS]
        if i % 2:
            calls.append(health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest()))
        else:
            calls.append(channel.stream_stream(slow)(never()))  # type: ignore[arg-type]
    for call in calls:
        with contextlib.suppress(grpc.aio.AioRpcError):  # Watch is refused at once; slow calls stay
            await asyncio.wait_for(call.wait_for_connection(), 20)
    context = ssl.create_default_context(cafile=str(certs.ca("shuffler")))
    host, port = address.rsplit(":", 1)
    sockets = []
    for _ in range(IDLE):
        _, writer = await asyncio.open_connection(host, int(port), ssl=context, server_hostname="localhost")
        sockets.append(writer)
    return Strangers(channels, calls, sockets, stop)


def _report(campaign: pb.Campaign) -> pb.EncryptedReport:
    width = randomiser_for(campaign).payload_length
    plaintext = encode(
        Plaintext(new_report_id(), campaign.id, campaign.key_id, (1).to_bytes(width, "big")),
        campaign.plaintext_length,
    )
    key = PublicKey(campaign.key_id, campaign.public_key)
    ciphertext = seal_report(plaintext, key, campaign.id, campaign.incarnation)
    return pb.EncryptedReport(campaign_id=campaign.id, key_id=campaign.key_id, ciphertext=ciphertext)


async def _pair(tmp_path: Path, certs: DevCerts) -> tuple[RunningAggregator, RunningShuffler]:
    aggregator = await start_aggregator(
        AggregatorConfig(data_dir=tmp_path / "agg", listen="127.0.0.1:0", tls=certs.server_tls("aggregator"))
    )
    shuffler = await start_shuffler(
        ShufflerConfig(
            data_dir=tmp_path / "shuf",
            upstream=aggregator.address,
            listen="127.0.0.1:0",
            operator_listen="127.0.0.1:0",
            tls=certs.server_tls("shuffler"),
            upstream_ca=certs.ca("aggregator"),
            max_concurrent_rpcs=LIMIT,
            batch_interval_s=3600.0,
        )
    )
    return aggregator, shuffler


async def _device_under_siege(tmp_path: Path, certs: DevCerts, streams: int) -> tuple[list[str], int]:
    """(status of the device's GetCampaign, SubmitReports, operator Check; reports counted)."""
    aggregator, shuffler = await _pair(tmp_path, certs)
    operator = certs.client_tls("aggregator", "aggregator-operator")
    strangers = None
    codes: list[str] = []
    try:
        async with open_channel(aggregator.address, operator) as admin:
            created = pb.CreateCampaignRequest(
                id="siege", question="q", kind=pb.BINARY, epsilon0=1.0, n_min=1
            )
            campaign = await pb_grpc.AggregatorStub(admin).CreateCampaign(created, timeout=30)
        strangers = await _hold(shuffler.address, certs, streams)
        async with open_channel(shuffler.address, certs.client_tls("shuffler")) as device:
            stub = pb_grpc.ShufflerStub(device)
            for call in (
                stub.GetCampaign(pb.GetCampaignRequest(campaign_id="siege"), timeout=20),
                stub.SubmitReports(pb.SubmitReportsRequest(reports=[_report(campaign)]), timeout=20),
            ):
                codes.append(await _code(call))
        assert shuffler.operator_address is not None
        probe_tls = certs.client_tls("shuffler", "shuffler")  # readiness: the shuffler's own certificate
        async with open_channel(shuffler.operator_address, probe_tls) as probe:
            check = health_pb2_grpc.HealthStub(probe).Check(health_pb2.HealthCheckRequest(), timeout=20)
            codes.append(await _code(check))
        await shuffler.flush()
        counted = (await aggregator.store.snapshot("siege", 2)).n
    finally:
        if strangers is not None:
            await strangers.close()
        await shuffler.stop(grace=1.0)
        await aggregator.stop(grace=1.0)
    return codes, counted


async def _code(call: Any) -> str:
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return str(exc.code().name)
    return "OK"


async def test_strangers_streams_do_not_shed_a_devices_reports(tmp_path: Path, dev_certs: DevCerts) -> None:
    codes, counted = await _device_under_siege(tmp_path, dev_certs, STREAMS)
    assert codes == ["OK", "OK", "OK"]
    assert counted == 1


async def test_the_old_configuration_shed_the_device(
    tmp_path: Path, dev_certs: DevCerts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gRPC's cap over every stream, Watch for anyone: the device gets RESOURCE_EXHAUSTED."""
    monkeypatch.setattr(
        shuffler_server, "admission", lambda config, _metrics: ([], config.max_concurrent_rpcs)
    )
    codes, counted = await _device_under_siege(tmp_path, dev_certs, 200)
    assert codes[:2] == ["RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED"]
    assert counted == 0


async def test_watch_needs_the_operator_port(tmp_path: Path, dev_certs: DevCerts) -> None:
    """On the device port health is Check only; Watch answers UNIMPLEMENTED naming Check."""
    aggregator, shuffler = await _pair(tmp_path, dev_certs)
    try:
        async with open_channel(shuffler.address, dev_certs.client_tls("shuffler")) as device:
            health = health_pb2_grpc.HealthStub(device)
            check = await health.Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert check.status == health_pb2.HealthCheckResponse.SERVING
            watch = health.Watch(health_pb2.HealthCheckRequest(), timeout=10)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await watch.read()
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
            assert "Check" in (refused.value.details() or "")
    finally:
        await shuffler.stop(grace=1.0)
        await aggregator.stop(grace=1.0)
