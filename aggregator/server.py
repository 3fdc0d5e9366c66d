"""Starting and stopping the aggregator service: keys, store, decrypt pool, gRPC server, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio as health_aio

from deniable.aggregator.consume_nats import NatsConsumer
from deniable.aggregator.context import DEFAULT_RETENTION_MARGIN_S
from deniable.aggregator.handlers import AggregatorHandlers
from deniable.aggregator.keys import Keyring
from deniable.aggregator.metrics import AggregatorMetrics
from deniable.aggregator.pool import DecryptPool
from deniable.aggregator.servicer import AggregatorServicer
from deniable.aggregator.store import AggregatorStore, SqliteAggregatorStore
from deniable.core.errors import ConfigurationError
from deniable.core.plumbing import jetstream, tracing
from deniable.core.plumbing.auth import (
    AGGREGATOR_OPERATOR,
    ANYONE,
    HEALTH_METHODS,
    AccessPolicy,
    AuthInterceptor,
    warn_open,
)
from deniable.core.plumbing.health import HealthMonitor
from deniable.core.plumbing.jetstream import DEFAULT_ACK_WAIT_S
from deniable.core.plumbing.service import (
    DEFAULT_MAX_CONCURRENT_RPCS,
    MAX_MESSAGE_BYTES,
    DataDirLock,
    Leftovers,
    add_health,
    bind,
    host_of,
    new_server,
    run_until_signalled,
)
from deniable.core.plumbing.tls import ServerTls, check_transport
from deniable.v1 import deniable_pb2_grpc as pb_grpc

SERVICE_NAME: Final = "deniable.v1.Aggregator"
DATABASE_FILE: Final = "aggregator.sqlite3"
log = logging.getLogger("deniable.aggregator")
_READERS: Final = frozenset({"shuffler", "aggregator-operator"})
ACCESS_POLICY: Final = AccessPolicy(
    service="aggregator",
    allowed={
        f"/{SERVICE_NAME}/IngestBatch": frozenset({"shuffler"}),
        f"/{SERVICE_NAME}/GetCampaign": _READERS,
        f"/{SERVICE_NAME}/ListCampaigns": _READERS,
        **{method: ANYONE for method in HEALTH_METHODS},
    },
    default=AGGREGATOR_OPERATOR,
)
"""Ingest from shufflers, campaign reads for shufflers and the aggregator's operators; any other
RPC (release below n_min, campaigns, keys, queries): the aggregator's operator only (ADR 0030)."""


@dataclass
class AggregatorConfig:
    """Where the aggregator keeps its state and how it serves."""

    data_dir: Path
    listen: str = "127.0.0.1:7700"
    decrypt_workers: int = 0
    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_concurrent_rpcs: int = DEFAULT_MAX_CONCURRENT_RPCS
    """RPCs served at once; more are shed with RESOURCE_EXHAUSTED (health calls included)."""
    metrics_port: int | None = None
    tracer_provider: Any = None
    """An opentelemetry TracerProvider (core/plumbing/tracing.py): a root span per RPC; None: no tracing."""
    store: str | None = None
    """None: SQLite in ``data_dir``; ``postgresql://...``: that PostgreSQL database (``open_store``)."""
    tls: ServerTls | None = None
    """Serve mutual TLS: every caller needs a certificate from the ``tls.ca`` bundle naming its
    role, issued by the CA of that role's party (the shuffler's CA for ``shuffler``, the
    aggregator's for ``aggregator-operator``)."""
    insecure: bool = False
    """Plaintext and no credential checks at all (tests only); needed by name when ``tls`` is None."""
    health_interval_s: float = 1.0
    """How often health re-checks the store and the decrypt workers."""
    key_drain_s: float = 86_400.0
    """A retired HPKE key is destroyed this long after the last campaign sealed to it closed."""
    key_sweep_interval_s: float = 3_600.0
    """How often drained keys are destroyed and expired report ids garbage-collected."""
    retention_margin_s: float = DEFAULT_RETENTION_MARGIN_S
    """Report ids are kept this long after a campaign's window ends, then forgotten."""
    nats: str | None = None
    """Also take batches from this NATS JetStream URL (core/plumbing/jetstream.py), as one more worker."""
    nats_ack_wait_s: float = DEFAULT_ACK_WAIT_S
    """How long a taken batch stays unacknowledged before JetStream gives it to another worker."""
    key_group: int | None = None
    """Accept key files shared with this group (the pod's fsGroup, ADR 0020); None: owner-only."""
    config_source: str = "library call"
    """Where these settings came from (file, environment, flags), for the start-up log line."""


@dataclass
class RunningAggregator:
    """A started aggregator; ``stop`` shuts it down gracefully (idempotent)."""

    port: int
    address: str
    handlers: AggregatorHandlers
    metrics: AggregatorMetrics
    server: grpc.aio.Server
    health: health_aio.HealthServicer
    store: AggregatorStore
    executor: DecryptPool | None
    monitor: HealthMonitor
    lock: DataDirLock
    metrics_port: int | None = None
    sweeper: asyncio.Task[None] | None = None
    nats: tuple[Any, NatsConsumer] | None = None
    _stopped: bool = field(default=False, repr=False)

    async def stop(self, grace: float = 5.0) -> None:
        """NOT_SERVING, finish in-flight RPCs (up to ``grace`` s), close the store, stop the pool."""
        if self._stopped:
            return
        self._stopped = True
        await self.monitor.stop()
        await self.health.enter_graceful_shutdown()
        if self.sweeper is not None:
            self.sweeper.cancel()
            await asyncio.gather(self.sweeper, return_exceptions=True)
        if self.nats is not None:
            await self.nats[1].stop()
            await self.nats[0].close()
        await self.server.stop(grace)
        await self.store.close()
        if self.executor is not None:
            await asyncio.to_thread(self.executor.shutdown)
        await asyncio.to_thread(self.metrics.stop_http)
        self.lock.release()
        log.info("aggregator stopped", extra={"address": self.address})


def _prepare_data_dir(data_dir: Path) -> None:
    """Create the data directory and prove it is writable; ConfigurationError otherwise."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        probe = data_dir / ".write-probe"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigurationError(f"data directory {data_dir} is not writable: {exc}") from exc


async def open_store(spec: str | None, data_dir: Path) -> AggregatorStore:
    """The store ``spec`` names: None or "" for SQLite in ``data_dir``, a postgresql:// DSN for PostgreSQL.

    ConfigurationError (one line, no password) for anything else, a bad DSN or an unreachable server.
    """
    if not spec:
        return SqliteAggregatorStore(data_dir / DATABASE_FILE)
    from deniable.aggregator.store_postgres import PostgresAggregatorStore
    from deniable.core.plumbing.dsn import is_postgres_dsn

    if not is_postgres_dsn(spec):
        got = f"a {spec.split('://', 1)[0][:20]}:// URL" if "://" in spec else "no URL"
        raise ConfigurationError(
            f"the store must be a postgresql:// DSN (omit it for SQLite in the data directory), got {got}"
        )
    return await PostgresAggregatorStore.connect(spec)


def default_decrypt_workers() -> int:
    """One decryption process per core this process may use: what a service should run.

    HPKE decryption holds the interpreter lock, so only processes add throughput; the library
    default (``AggregatorConfig.decrypt_workers = 0``, a thread) keeps tests and embedded use free
    of the pool's start-up cost.
    """
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _decrypt_pool(workers: int, metrics: AggregatorMetrics) -> DecryptPool | None:
    """A healing process pool (spawned, dying with us) or None for a thread."""
    if workers < 0:
        raise ConfigurationError(f"decrypt_workers must be >= 0, got {workers}")
    return DecryptPool(workers, metrics.pool_rebuilds) if workers else None


def _store_check(store: AggregatorStore) -> Callable[[], Awaitable[str | None]]:
    async def check() -> str | None:
        try:
            await store.ping()
        except Exception as exc:  # any failure to answer is "unreachable"
            return f"the store does not answer: {type(exc).__name__}: {str(exc)[:200]}"
        return None

    return check


async def _serve(
    config: AggregatorConfig,
    store: AggregatorStore,
    handlers: AggregatorHandlers,
    metrics: AggregatorMetrics,
    credentials: grpc.ServerCredentials | None,
) -> tuple[grpc.aio.Server, health_aio.HealthServicer, HealthMonitor, int]:
    """Build, bind and start the gRPC server (mutual TLS and per-method roles unless insecure)
    with truthful health (NOT_SERVING until checked)."""
    issuers = None if config.tls is None else config.tls.issuers()
    guard = AuthInterceptor(ACCESS_POLICY, metrics.auth_refusals, issuers, open_all=config.insecure)
    server = new_server(
        config.max_message_bytes,
        interceptors=[guard],
        on_malformed=lambda rpc: metrics.malformed.labels(rpc).inc(),
        record_request=metrics.observe_request,
        tracer_provider=config.tracer_provider,
        max_concurrent_rpcs=config.max_concurrent_rpcs,
    )
    pb_grpc.add_AggregatorServicer_to_server(AggregatorServicer(handlers), server)
    health_servicer = await add_health(
        server, SERVICE_NAME, status=health_pb2.HealthCheckResponse.NOT_SERVING
    )
    checks = {"store": _store_check(store)}
    if handlers.pool is not None:
        checks["decrypt_workers"] = handlers.pool.check
    monitor = HealthMonitor(
        health_servicer,
        [SERVICE_NAME],
        checks,
        metrics.registry,
        "deniable_aggregator",
        config.health_interval_s,
    )
    port = bind(server, config.listen, credentials)
    await monitor.check_now()
    await server.start()
    monitor.start()
    return server, health_servicer, monitor, port


async def start_aggregator(config: AggregatorConfig) -> RunningAggregator:
    """Start serving; ConfigurationError (one line) for a bad data dir, keys, TLS files or address.

    The data directory is locked (one service each); a failed start removes what it created.
    """
    _check_intervals(config)
    check_transport(config.tls, config.insecure, "aggregator")
    credentials = None if config.tls is None else config.tls.credentials(require_client_cert=True)
    metrics = AggregatorMetrics()
    metrics.tracer_provider = config.tracer_provider
    undo = contextlib.AsyncExitStack()  # what a failed start must close, newest first
    leftovers = Leftovers(config.data_dir)
    try:
        lock, store, executor, handlers = await _open_state(config, metrics, undo)
        server, health_servicer, monitor, port = await _serve(config, store, handlers, metrics, credentials)
        undo.push_async_callback(server.stop, 0)
        undo.push_async_callback(monitor.stop)
        metrics_port = _serve_metrics(config, metrics)
    except BaseException:
        await undo.aclose()
        leftovers.remove()
        raise
    try:
        nats = None if config.nats is None else await _nats_consumer(config, handlers)
    except BaseException:
        await undo.aclose()
        raise
    undo.pop_all()
    address = f"{host_of(config.listen)}:{port}"
    _log_started(config, address)
    return RunningAggregator(
        port=port,
        address=address,
        handlers=handlers,
        metrics=metrics,
        server=server,
        health=health_servicer,
        store=store,
        executor=executor,
        monitor=monitor,
        lock=lock,
        metrics_port=metrics_port,
        sweeper=asyncio.create_task(_sweep_keys(handlers, config.key_sweep_interval_s), name="key-sweep"),
        nats=nats,
    )


def _check_intervals(config: AggregatorConfig) -> None:
    """The key drain, sweep and retention settings are usable numbers of seconds."""
    if not (config.key_drain_s >= 0 and config.key_sweep_interval_s > 0):
        raise ConfigurationError("key_drain_s must be >= 0 and key_sweep_interval_s > 0 (seconds)")
    if not config.retention_margin_s >= 0:
        raise ConfigurationError("retention_margin_s must be >= 0 (seconds)")


async def _open_state(
    config: AggregatorConfig, metrics: AggregatorMetrics, undo: contextlib.AsyncExitStack
) -> tuple[DataDirLock, AggregatorStore, DecryptPool | None, AggregatorHandlers]:
    """Lock the data directory, load the keys, open the store and the decrypt pool; each opened
    resource is registered on ``undo``."""
    _prepare_data_dir(config.data_dir)
    lock = DataDirLock(config.data_dir)
    undo.callback(lock.release)
    keyring = Keyring.load_or_create(config.data_dir, key_group=config.key_group)
    store = await open_store(config.store, config.data_dir)
    undo.push_async_callback(store.close)
    executor = _decrypt_pool(config.decrypt_workers, metrics)
    if executor is not None:
        undo.callback(executor.executor.shutdown, wait=False, cancel_futures=True)
        await executor.warm_up()
    handlers = AggregatorHandlers(
        store,
        keyring,
        metrics,
        executor,
        config.decrypt_workers,
        key_drain_s=config.key_drain_s,
        retention_margin_s=config.retention_margin_s,
    )
    return lock, store, executor, handlers


def _serve_metrics(config: AggregatorConfig, metrics: AggregatorMetrics) -> int | None:
    """Serve Prometheus metrics on the configured port (None: not configured)."""
    if config.metrics_port is None:
        return None
    try:
        return metrics.serve_http(config.metrics_port, host_of(config.listen).strip("[]"))
    except OSError as exc:
        raise ConfigurationError(f"cannot serve metrics on port {config.metrics_port}: {exc}") from exc


def _log_started(config: AggregatorConfig, address: str) -> None:
    """Warn if the transport is open; log where and how the aggregator listens."""
    if config.insecure:
        warn_open("the aggregator")
    tls = "mutual TLS" if config.tls else "plaintext (insecure)"
    log.info(
        "aggregator listening on %s (%s; config: %s)",
        address,
        tls,
        config.config_source,
        extra={"address": address, "pid": os.getpid(), "tls": "mutual" if config.tls else "none"},
    )


async def _nats_consumer(config: AggregatorConfig, handlers: AggregatorHandlers) -> tuple[Any, NatsConsumer]:
    """Connect to JetStream, bind the shared durable consumer and start pulling batches."""
    assert config.nats is not None
    own = config.tls
    tls = None if own is None else jetstream.tls_context(own.cert, own.key, own.ca)
    client, js = await jetstream.connect(config.nats, tls, config.insecure)
    consumer = NatsConsumer(js, handlers, ack_wait_s=config.nats_ack_wait_s)
    try:
        subscription = await consumer.subscribe()
    except Exception as exc:
        await client.close()
        raise ConfigurationError(f"cannot consume from NATS at {config.nats}: {exc}") from exc
    consumer.start(subscription)
    return client, consumer


async def _sweep_keys(handlers: AggregatorHandlers, interval_s: float) -> None:
    """Every ``interval_s`` seconds destroy drained retired keys and forget expired report ids
    (errors are logged, never fatal)."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            destroyed = await handlers.sweep_keys()
            forgotten = await handlers.collect_garbage()
        except Exception:
            log.exception("key sweep or garbage collection failed")
            continue
        if destroyed:
            log.info("retired keys destroyed", extra={"key_ids": destroyed})
        if forgotten:
            log.info("report ids of expired campaigns forgotten", extra={"campaigns": forgotten})


async def serve_aggregator(
    config: AggregatorConfig, on_started: Callable[[RunningAggregator], None] | None = None
) -> None:
    """Run until SIGTERM or SIGINT, then stop gracefully."""
    running = await start_aggregator(config)
    if on_started is not None:
        on_started(running)
    try:
        await run_until_signalled(running.stop)
    finally:
        await running.stop()
        tracing.shutdown(config.tracer_provider)  # flush the last spans
