"""Starting and stopping a shuffler: spool, campaign directory, batcher, forwarder, gRPC server,
and the MQTT ingress when a broker is configured."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio

from deniable.core.errors import ConfigurationError
from deniable.core.plumbing import jetstream, service, tracing
from deniable.core.plumbing.auth import (
    ANYONE,
    HEALTH_METHODS,
    SHUFFLER_OPERATOR,
    AccessPolicy,
    AuthInterceptor,
    warn_open,
)
from deniable.core.plumbing.health import Check, HealthMonitor
from deniable.core.plumbing.tls import ClientTls, ServerTls, check_transport, open_channel
from deniable.shuffler.batcher import MAX_BATCH_BYTES, Batcher
from deniable.shuffler.campaigns import CampaignDirectory
from deniable.shuffler.forwarder import BatchForwarder, Forwarder, Pipeline, raw_ingest_callable
from deniable.shuffler.handlers import ShufflerHandlers
from deniable.shuffler.health import DEFAULT_UPSTREAM_GRACE_S, UpstreamCheck, spool_check
from deniable.shuffler.metrics import ShufflerMetrics
from deniable.shuffler.mqtt import MqttIngress, MqttIngressConfig
from deniable.shuffler.quota import DEFAULT_QUOTA_PER_SOURCE, DEFAULT_WINDOW_S, SourceQuota
from deniable.shuffler.rawsubmit import RawSubmitInterceptor
from deniable.shuffler.segments import SegmentSpool
from deniable.shuffler.servicer import ShufflerServicer
from deniable.shuffler.spool import SpoolStore
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc

if TYPE_CHECKING:
    from deniable.v1.deniable_pb2_grpc import AggregatorAsyncStub

log = logging.getLogger("deniable.shuffler")

SERVICE_NAME: Final = "deniable.v1.Shuffler"
SPOOL_FILE: Final = "spool.sqlite3"
SPOOLS: Final = ("segments",)
REMOVED_SPOOLS: Final = {"rows": "the per-report spool 'rows' was removed (ADR 0026)"}
ACCESS_POLICY: Final = AccessPolicy(
    service="shuffler",
    allowed={
        f"/{SERVICE_NAME}/GetCampaign": ANYONE,
        f"/{SERVICE_NAME}/SubmitReports": ANYONE,
        **{method: ANYONE for method in HEALTH_METHODS},
    },
    default=SHUFFLER_OPERATOR,
)
"""Devices reach GetCampaign, SubmitReports and health; any other RPC (Flush, Stats) needs the
shuffler's own operator role, issued by the shuffler's CA (ADR 0030)."""


def open_spool(kind: str, path: Path, store: str | None = None) -> SpoolStore:
    """The spool: PostgreSQL at DSN ``store`` if given, else the SQLite segment spool at ``path``.

    ``kind`` must be "segments"; an old per-report file at ``path`` is migrated on open.
    """
    check_spool_kind(kind)
    if store is not None:
        from deniable.shuffler.spool_postgres import PostgresSpool  # asyncpg: the [postgres] extra

        return PostgresSpool(store)
    return SegmentSpool(path)


def check_spool_kind(kind: str) -> None:
    """ConfigurationError (one line) unless ``kind`` names the spool this shuffler has."""
    if kind in REMOVED_SPOOLS:
        raise ConfigurationError(
            f'{REMOVED_SPOOLS[kind]}: use spool = "segments" (the default), which migrates'
            " an old per-report spool file on open"
        )
    if kind not in SPOOLS:
        raise ConfigurationError(f"spool must be one of {', '.join(SPOOLS)}, got {kind!r}")


@dataclass
class ShufflerConfig:
    """Everything a shuffler needs; the defaults suit one machine."""

    data_dir: Path
    upstream: str
    listen: str = "127.0.0.1:7701"
    batch_interval_s: float = 0.5
    max_batch_reports: int = 50_000
    max_batch_bytes: int = MAX_BATCH_BYTES  # one chunk of a release (ADR 0023); smaller only for tests
    max_reports_per_request: int = 10_000
    max_message_bytes: int = service.MAX_MESSAGE_BYTES
    max_concurrent_rpcs: int = service.DEFAULT_MAX_CONCURRENT_RPCS
    """RPCs served at once; more are shed with RESOURCE_EXHAUSTED (health calls included)."""
    metrics_port: int | None = None
    tracer_provider: Any = None
    """An opentelemetry TracerProvider (core/plumbing/tracing.py): a root span per RPC; None: no tracing."""
    upstream_deadline_s: float = 2.0
    forward_deadline_s: float = 30.0
    retry_base_s: float = 0.5
    retry_max_s: float = 30.0
    campaign_refresh_s: float = 5.0
    campaign_ttl_s: float = 60.0
    forward_window: int = 2
    """Batches in flight to the aggregator at once (pipelining its parsing and decryption)."""
    spool: str = "segments"
    """``segments``, the only spool (one row per request and per batch); ``rows`` was removed (ADR 0026)."""
    forward_nats: str | None = None
    """Forward batches to this NATS JetStream URL instead of gRPC (core/plumbing/jetstream.py); campaigns
    still come from ``upstream``. TLS with the shuffler's certificate unless ``insecure``."""
    spool_store: str | None = None
    """A PostgreSQL DSN: spool there instead (several shufflers may share it); the CLI reads it
    from a flag, a file or the environment, the password may come from ``PGPASSWORD``/``PGPASSFILE``."""
    mqtt: MqttIngressConfig | None = None
    """Also take reports and announce campaigns on this MQTT broker (docs/mqtt.md)."""
    tls: ServerTls | None = None
    """TLS on the device port, mutual TLS on ``operator_listen``; the certificate is also the
    shuffler's client certificate towards the aggregator."""
    insecure: bool = False
    """Plaintext everywhere and no credential checks (tests only); needed by name when ``tls`` is None."""
    operator_listen: str | None = None
    """The mutual-TLS port for operators (Flush, Stats) and devices with credentials (TLS only)."""
    upstream_ca: Path | None = None
    """The aggregator party's CA (required with TLS): the only CA the upstream channel trusts, so
    that only the ``aggregator`` certificate (the one role it issues with server auth) is accepted."""
    quota_per_source: int = DEFAULT_QUOTA_PER_SOURCE
    """Reports one source address (or device credential) may spool per campaign per window; 0: no limit.
    A campaign's ``quota_per_source`` overrides it."""
    quota_window_s: float = DEFAULT_WINDOW_S
    upstream_grace_s: float = DEFAULT_UPSTREAM_GRACE_S
    """NOT_SERVING while the upstream has not answered as an aggregator for this long (or ever)."""
    health_interval_s: float = 1.0
    """How often health re-checks the spool directory and the upstream."""
    config_source: str = "library call"
    """Where these settings came from (file, environment, flags), for the start-up log line."""


@dataclass
class RunningShuffler:
    """A started shuffler: where it listens, its handlers and metrics, flush and stop."""

    port: int
    address: str
    handlers: ShufflerHandlers
    metrics: ShufflerMetrics
    metrics_port: int | None
    _server: grpc.aio.Server = field(repr=False)
    _health: health_aio.HealthServicer = field(repr=False)
    monitor: HealthMonitor = field(repr=False)
    _lock: service.DataDirLock = field(repr=False)
    operator_port: int | None = field(default=None, kw_only=True)
    operator_address: str | None = field(default=None, kw_only=True)
    _pipeline: Pipeline = field(repr=False)
    _directory: CampaignDirectory = field(repr=False)
    _channel: grpc.aio.Channel = field(repr=False)
    _store: SpoolStore = field(repr=False)
    mqtt: MqttIngress | None = None
    _nats: Any = field(default=None, repr=False)
    _stopped: bool = field(default=False, repr=False)

    async def flush(self, campaign_id: str = "", below_n_min: bool = False) -> pb.FlushResponse:
        """Batch and forward now (as the Flush RPC does)."""
        return await self.handlers.flush(campaign_id, below_n_min)

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting, let in-flight RPCs finish within ``grace``, stop the loop, close the spool."""
        if self._stopped:
            return
        self._stopped = True
        await self.monitor.stop()
        await self._health.enter_graceful_shutdown()
        if self.mqtt is not None:
            await self.mqtt.stop()
        await self._server.stop(grace)
        await self._pipeline.stop()
        if self._nats is not None:
            await self._nats.close()
        await self._directory.close()
        await self._channel.close()
        self.metrics.stop_http()
        await asyncio.to_thread(self._store.close)
        self._lock.release()
        log.info("shuffler stopped")


async def _nats_forwarder(
    config: ShufflerConfig, store: SpoolStore, metrics: ShufflerMetrics
) -> tuple[Any, BatchForwarder]:
    """Connect to JetStream (ConfigurationError if it cannot) and a forwarder publishing there."""
    from deniable.shuffler.forward_nats import NatsForwarder

    assert config.forward_nats is not None
    own = config.tls
    tls = None if own is None else jetstream.tls_context(own.cert, own.key, config.upstream_ca or own.ca)
    client, js = await jetstream.connect(config.forward_nats, tls, config.insecure)
    return client, NatsForwarder(store, js, metrics, timeout_s=config.forward_deadline_s)


def _connect_address(listen: str, port: int) -> str:
    host = service.host_of(listen)
    if host in ("", "0.0.0.0", "[::]"):  # noqa: S104 - mapping a wildcard to loopback, not binding
        host = "127.0.0.1"
    return f"{host}:{port}"


def _credentials(
    config: ShufflerConfig,
) -> tuple[grpc.ServerCredentials | None, grpc.ServerCredentials | None, ClientTls | None]:
    """(device port, operator port, towards the aggregator); all None when insecure."""
    if config.tls is None:
        if config.operator_listen is not None:
            raise ConfigurationError("--operator-listen needs TLS (insecure, every RPC is on --listen)")
        return None, None, None
    return (
        config.tls.credentials(require_client_cert=False),
        config.tls.credentials(require_client_cert=True),
        config.tls.as_client(config.upstream_ca),
    )


@dataclass
class _Parts:
    """What a start-up has created so far: handed to ``RunningShuffler``, or undone on failure."""

    lock: service.DataDirLock
    leftovers: service.Leftovers
    store: SpoolStore
    metrics: ShufflerMetrics
    channel: grpc.aio.Channel
    server: grpc.aio.Server
    nats_client: Any = None
    monitor: HealthMonitor | None = None

    async def undo(self) -> None:
        """Stop and close everything created, release the data directory, remove what was made."""
        if self.monitor is not None:
            await self.monitor.stop()
        await self.server.stop(None)
        await self.channel.close()
        if self.nats_client is not None:
            await self.nats_client.close()
        self.metrics.stop_http()
        await asyncio.to_thread(self.store.close)
        self.lock.release()
        self.leftovers.remove()


@dataclass(frozen=True)
class _Serving:
    """The wired-up service: handlers, background pipeline, campaign directory, health."""

    handlers: ShufflerHandlers
    pipeline: Pipeline
    directory: CampaignDirectory
    health: health_aio.HealthServicer
    monitor: HealthMonitor


async def start_shuffler(config: ShufflerConfig) -> RunningShuffler:
    """Open the spool, bind, start serving and the background loop.

    ConfigurationError (one line) if the port is taken or the data directory is unusable or in
    use (a failed start removes what it created); an unreachable upstream is not an error (batches
    wait, campaign look-ups retry) but keeps health NOT_SERVING until it answers.
    """
    check_config(config)
    device_credentials, operator_credentials, upstream_tls = _credentials(config)
    parts = await _open_parts(config, upstream_tls)
    try:
        serving = await _wire_service(config, parts)
        port = service.bind(parts.server, config.listen, device_credentials)
        operator_port = None
        if config.operator_listen is not None and operator_credentials is not None:
            operator_port = service.bind(parts.server, config.operator_listen, operator_credentials)
        metrics_port = _serve_metrics(config, parts.metrics)
        await serving.monitor.check_now()  # the first answer is already the truth
        await parts.server.start()
        serving.monitor.start()
    except BaseException:
        await parts.undo()
        raise
    serving.pipeline.start()
    ingress = _start_mqtt(config, serving.handlers, parts.metrics)
    address = _connect_address(config.listen, port)
    operator_address = (
        None if operator_port is None else _connect_address(config.operator_listen or "", operator_port)
    )
    _log_listening(config, address, operator_address)
    return RunningShuffler(
        port=port,
        address=address,
        handlers=serving.handlers,
        metrics=parts.metrics,
        metrics_port=metrics_port,
        _server=parts.server,
        _health=serving.health,
        monitor=serving.monitor,
        _lock=parts.lock,
        _pipeline=serving.pipeline,
        _directory=serving.directory,
        _channel=parts.channel,
        _store=parts.store,
        mqtt=ingress,
        _nats=parts.nats_client,
        operator_port=operator_port,
        operator_address=operator_address,
    )


def check_config(config: ShufflerConfig) -> None:
    """ConfigurationError (one line) for settings no shuffler can start with."""
    check_spool_kind(config.spool)
    check_transport(config.tls, config.insecure, "shuffler")
    if config.quota_per_source < 0 or not config.quota_window_s > 0:
        raise ConfigurationError("the quota must be >= 0 reports (0: no limit) over a window > 0 s")


async def _open_parts(config: ShufflerConfig, upstream_tls: ClientTls | None) -> _Parts:
    """Claim the data directory, open the spool, metrics, the upstream channel and the server."""
    leftovers = service.Leftovers(config.data_dir)
    try:
        config.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(f"cannot use data directory {config.data_dir}: {exc}") from exc
    try:
        lock = service.DataDirLock(config.data_dir)
    except ConfigurationError:
        leftovers.remove()
        raise
    try:
        store = await asyncio.to_thread(
            open_spool, config.spool, config.data_dir / SPOOL_FILE, config.spool_store
        )
    except BaseException:
        lock.release()
        leftovers.remove()
        raise
    metrics = ShufflerMetrics()
    metrics.tracer_provider = config.tracer_provider
    channel = open_channel(config.upstream, upstream_tls, insecure=config.insecure)
    return _Parts(lock, leftovers, store, metrics, channel, _new_server(config, metrics))


def _new_server(config: ShufflerConfig, metrics: ShufflerMetrics) -> grpc.aio.Server:
    """The gRPC server with the access policy, raw SubmitReports, limits and tracing."""
    issuers = None if config.tls is None else config.tls.issuers()
    guard = AuthInterceptor(ACCESS_POLICY, metrics.auth_refusals, issuers, open_all=config.insecure)
    return service.new_server(
        config.max_message_bytes,
        interceptors=[guard, RawSubmitInterceptor()],
        on_malformed=lambda rpc: metrics.requests_failed.labels(rpc=rpc, code="INVALID_ARGUMENT").inc(),
        record_request=metrics.observe_request,
        tracer_provider=config.tracer_provider,
        max_concurrent_rpcs=config.max_concurrent_rpcs,
    )


async def _wire_service(config: ShufflerConfig, parts: _Parts) -> _Serving:
    """Directory, batcher, forwarder, pipeline and handlers on the spool; the servicer and health."""
    upstream = deniable_pb2_grpc.AggregatorStub(parts.channel)
    directory = CampaignDirectory(
        parts.store,
        upstream,
        deadline_s=config.upstream_deadline_s,
        refresh_interval_s=config.campaign_refresh_s,
        ttl_s=config.campaign_ttl_s,
    )
    batcher = Batcher(
        parts.store,
        directory,
        max_batch_reports=config.max_batch_reports,
        max_batch_bytes=config.max_batch_bytes,
        metrics=parts.metrics,
    )
    forwarder = await _forwarder(config, parts, upstream)
    pipeline = Pipeline(parts.store, batcher, forwarder, parts.metrics, config.batch_interval_s)
    handlers = ShufflerHandlers(
        parts.store,
        directory,
        batcher,
        pipeline,
        parts.metrics,
        max_reports_per_request=config.max_reports_per_request,
        quota=SourceQuota(config.quota_per_source, config.quota_window_s),
    )
    deniable_pb2_grpc.add_ShufflerServicer_to_server(ShufflerServicer(handlers, parts.metrics), parts.server)
    health, monitor = await _health(config, parts, handlers)
    return _Serving(handlers, pipeline, directory, health, monitor)


async def _forwarder(config: ShufflerConfig, parts: _Parts, upstream: AggregatorAsyncStub) -> BatchForwarder:
    """gRPC IngestBatch to the aggregator, or a JetStream publisher when ``forward_nats`` is set."""
    if config.forward_nats is not None:
        parts.nats_client, nats = await _nats_forwarder(config, parts.store, parts.metrics)
        return nats
    return Forwarder(
        parts.store,
        upstream,
        parts.metrics,
        deadline_s=config.forward_deadline_s,
        retry_base_s=config.retry_base_s,
        retry_max_s=config.retry_max_s,
        raw_ingest=raw_ingest_callable(parts.channel),
        window=config.forward_window,
    )


async def _health(
    config: ShufflerConfig, parts: _Parts, handlers: ShufflerHandlers
) -> tuple[health_aio.HealthServicer, HealthMonitor]:
    """The health service (NOT_SERVING until checked) and the monitor of spool and upstream."""
    health_servicer = await service.add_health(
        parts.server, SERVICE_NAME, status=health_pb2.HealthCheckResponse.NOT_SERVING
    )
    checks: dict[str, Check] = {
        "spool": spool_check(config.data_dir, handlers, parts.store),
        "upstream": UpstreamCheck(
            parts.channel, config.upstream, config.upstream_grace_s, config.upstream_deadline_s
        ),
    }
    parts.monitor = HealthMonitor(
        health_servicer,
        [SERVICE_NAME],
        checks,
        parts.metrics.registry,
        "deniable_shuffler",
        config.health_interval_s,
    )
    return health_servicer, parts.monitor


def _serve_metrics(config: ShufflerConfig, metrics: ShufflerMetrics) -> int | None:
    """The Prometheus port, on the device listener's host so a scraper on the pod network reaches it."""
    if config.metrics_port is None:
        return None
    return metrics.serve_http(config.metrics_port, service.host_of(config.listen).strip("[]"))


def _start_mqtt(
    config: ShufflerConfig, handlers: ShufflerHandlers, metrics: ShufflerMetrics
) -> MqttIngress | None:
    """The MQTT ingress, connecting (and reconnecting) in the background: a broker down is not fatal."""
    if config.mqtt is None:
        return None
    ingress = MqttIngress(handlers, metrics, config.mqtt)
    ingress.start()
    return ingress


def _log_listening(config: ShufflerConfig, address: str, operator_address: str | None) -> None:
    """The start-up log line: where, with what transport security, from which configuration."""
    if config.insecure:
        warn_open("the shuffler")
        log.warning("INSECURE: plaintext channel to the aggregator at %s (--insecure)", config.upstream)
    tls = "TLS, operators mutual TLS" if config.tls else "plaintext (insecure)"
    log.info(
        "shuffler listening on %s (%s; operator port %s; config: %s)",
        address,
        tls,
        operator_address or "none",
        config.config_source,
        extra={
            "address": address,
            "operator_address": operator_address,
            "upstream": config.upstream,
            "tls": "on" if config.tls else "none",
        },
    )


async def serve_shuffler(config: ShufflerConfig) -> None:
    """Run a shuffler until SIGTERM or SIGINT, then stop it gracefully."""
    running = await start_shuffler(config)
    try:
        await service.run_until_signalled(running.stop)
    finally:
        tracing.shutdown(config.tracer_provider)  # flush the last spans
