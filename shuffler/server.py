"""Starting and stopping a shuffler: spool, campaign directory, batcher, forwarder, gRPC server,
and the MQTT ingress when a broker is configured."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import grpc
from grpc_health.v1 import health

from deniable.core import service
from deniable.core.errors import ConfigurationError
from deniable.shuffler.batcher import Batcher
from deniable.shuffler.campaigns import CampaignDirectory
from deniable.shuffler.forwarder import Forwarder, Pipeline, raw_ingest_callable
from deniable.shuffler.handlers import ShufflerHandlers
from deniable.shuffler.metrics import ShufflerMetrics
from deniable.shuffler.mqtt import MqttIngress, MqttIngressConfig
from deniable.shuffler.rawsubmit import RawSubmitInterceptor
from deniable.shuffler.segments import SegmentSpool
from deniable.shuffler.servicer import ShufflerServicer
from deniable.shuffler.spool import SqliteSpool
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc

log = logging.getLogger("deniable.shuffler")

SERVICE_NAME: Final = "deniable.v1.Shuffler"
SPOOL_FILE: Final = "spool.sqlite3"
SPOOLS: Final = ("segments", "rows")


def open_spool(kind: str, path: Path) -> SqliteSpool | SegmentSpool:
    """The spool implementation ``kind`` at ``path``."""
    return SegmentSpool(path) if kind == "segments" else SqliteSpool(path)


@dataclass
class ShufflerConfig:
    """Everything a shuffler needs; the defaults suit one machine."""

    data_dir: Path
    upstream: str
    listen: str = "127.0.0.1:7701"
    batch_interval_s: float = 0.5
    max_batch_reports: int = 50_000
    max_reports_per_request: int = 10_000
    max_message_bytes: int = service.MAX_MESSAGE_BYTES
    metrics_port: int | None = None
    upstream_deadline_s: float = 2.0
    forward_deadline_s: float = 30.0
    retry_base_s: float = 0.5
    retry_max_s: float = 30.0
    campaign_refresh_s: float = 5.0
    campaign_ttl_s: float = 60.0
    forward_window: int = 2
    """Batches in flight to the aggregator at once (pipelining its parsing and decryption)."""
    spool: str = "segments"
    """``segments`` (default: one row per request and per batch) or ``rows`` (one per report)."""
    mqtt: MqttIngressConfig | None = None
    """Also take reports and announce campaigns on this MQTT broker (docs/mqtt.md)."""


@dataclass
class RunningShuffler:
    """A started shuffler: where it listens, its handlers and metrics, flush and stop."""

    port: int
    address: str
    handlers: ShufflerHandlers
    metrics: ShufflerMetrics
    metrics_port: int | None
    _server: grpc.aio.Server = field(repr=False)
    _health: health.HealthServicer = field(repr=False)
    _pipeline: Pipeline = field(repr=False)
    _directory: CampaignDirectory = field(repr=False)
    _channel: grpc.aio.Channel = field(repr=False)
    _store: SqliteSpool | SegmentSpool = field(repr=False)
    mqtt: MqttIngress | None = None
    _stopped: bool = field(default=False, repr=False)

    async def flush(self, campaign_id: str = "", below_n_min: bool = False) -> pb.FlushResponse:
        """Batch and forward now (as the Flush RPC does)."""
        return await self.handlers.flush(campaign_id, below_n_min)

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting, let in-flight RPCs finish within ``grace``, stop the loop, close the spool."""
        if self._stopped:
            return
        self._stopped = True
        self._health.enter_graceful_shutdown()
        if self.mqtt is not None:
            await self.mqtt.stop()
        await self._server.stop(grace)
        await self._pipeline.stop()
        await self._directory.close()
        await self._channel.close()
        self.metrics.stop_http()
        await asyncio.to_thread(self._store.close)
        log.info("shuffler stopped")


def _connect_address(listen: str, port: int) -> str:
    host = service.host_of(listen)
    if host in ("", "0.0.0.0", "[::]"):  # noqa: S104 - mapping a wildcard to loopback, not binding
        host = "127.0.0.1"
    return f"{host}:{port}"


async def start_shuffler(config: ShufflerConfig) -> RunningShuffler:
    """Open the spool, bind, start serving and the background loop.

    ConfigurationError (one line) if the port is taken or the data directory is unusable; an
    unreachable upstream is not an error (batches wait, campaign look-ups retry).
    """
    try:
        config.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(f"cannot use data directory {config.data_dir}: {exc}") from exc
    if config.spool not in SPOOLS:
        raise ConfigurationError(f"spool must be one of {', '.join(SPOOLS)}, got {config.spool!r}")
    store = await asyncio.to_thread(open_spool, config.spool, config.data_dir / SPOOL_FILE)
    metrics = ShufflerMetrics()
    channel = service.insecure_channel(config.upstream)
    server = service.new_server(config.max_message_bytes, interceptors=[RawSubmitInterceptor()])
    try:
        upstream = deniable_pb2_grpc.AggregatorStub(channel)
        directory = CampaignDirectory(
            store,
            upstream,
            deadline_s=config.upstream_deadline_s,
            refresh_interval_s=config.campaign_refresh_s,
            ttl_s=config.campaign_ttl_s,
        )
        batcher = Batcher(store, directory, max_batch_reports=config.max_batch_reports, metrics=metrics)
        forwarder = Forwarder(
            store,
            upstream,
            metrics,
            deadline_s=config.forward_deadline_s,
            retry_base_s=config.retry_base_s,
            retry_max_s=config.retry_max_s,
            raw_ingest=raw_ingest_callable(channel),
            window=config.forward_window,
        )
        pipeline = Pipeline(store, batcher, forwarder, metrics, config.batch_interval_s)
        handlers = ShufflerHandlers(
            store,
            directory,
            batcher,
            pipeline,
            metrics,
            max_reports_per_request=config.max_reports_per_request,
        )
        deniable_pb2_grpc.add_ShufflerServicer_to_server(ShufflerServicer(handlers, metrics), server)
        health_servicer = service.add_health(server, SERVICE_NAME)
        port = service.bind(server, config.listen)
        metrics_port = metrics.serve_http(config.metrics_port) if config.metrics_port is not None else None
        await server.start()
    except BaseException:
        await server.stop(None)
        await channel.close()
        metrics.stop_http()
        await asyncio.to_thread(store.close)
        raise
    pipeline.start()
    ingress = None
    if config.mqtt is not None:
        ingress = MqttIngress(handlers, metrics, config.mqtt)
        ingress.start()  # connects (and reconnects) in the background; a broker down is not fatal
    address = _connect_address(config.listen, port)
    log.info("shuffler listening", extra={"address": address, "upstream": config.upstream})
    return RunningShuffler(
        port=port,
        address=address,
        handlers=handlers,
        metrics=metrics,
        metrics_port=metrics_port,
        _server=server,
        _health=health_servicer,
        _pipeline=pipeline,
        _directory=directory,
        _channel=channel,
        _store=store,
        mqtt=ingress,
    )


async def serve_shuffler(config: ShufflerConfig) -> None:
    """Run a shuffler until SIGTERM or SIGINT, then stop it gracefully."""
    running = await start_shuffler(config)
    await service.run_until_signalled(running.stop)
