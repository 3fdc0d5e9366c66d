"""Prometheus plumbing shared by the services: a private registry and an optional /metrics endpoint.

A registry per service lets an aggregator and a shuffler share one process (tests, the demo)
without clashing metric names. Labels carry reasons, RPC names and codes, never a client identifier.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final
from wsgiref.simple_server import WSGIServer

import grpc
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
    start_http_server,
)
from prometheus_client.gc_collector import GCCollector

from deniable.core.errors import ConfigurationError
from deniable.core.plumbing.build import version
from deniable.core.plumbing.calls import code_name, stream_items, wrap_behaviour
from deniable.core.plumbing.tracing import internal_span

LATENCY_BUCKETS: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
"""Seconds; from a sub-millisecond unary call to a 30 s forward deadline."""
KNOWN_CODES: Final = (
    "OK",
    "INVALID_ARGUMENT",
    "NOT_FOUND",
    "FAILED_PRECONDITION",
    "RESOURCE_EXHAUSTED",
    "UNAUTHENTICATED",
    "PERMISSION_DENIED",
    "UNAVAILABLE",
    "DEADLINE_EXCEEDED",
    "INTERNAL",
)
"""Status codes whose ``requests_total`` series exist from the start (zero until they happen)."""


def reason_label(reason: int) -> str:
    """Lower-case RejectReason name (``duplicate_report``), the one spelling in both services."""
    from deniable.v1 import deniable_pb2 as pb

    try:
        return pb.RejectReason.Name(reason).lower()  # type: ignore[arg-type]
    except ValueError:
        return str(reason)


def reject_reasons() -> list[str]:
    """Every RejectReason label but UNSPECIFIED (to pre-initialise the rejected counters)."""
    from deniable.v1 import deniable_pb2 as pb

    return [name.lower() for name, value in pb.RejectReason.items() if value]


def snake_case(name: str) -> str:
    """``SubmitReports`` → ``submit_reports``: the one spelling of RPC label values."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class ServiceMetrics:
    """A fresh ``CollectorRegistry`` with exposition and an HTTP endpoint; services add their metrics."""

    def __init__(self, service: str = "deniable") -> None:
        """Create the registry with process, platform, GC and build-info series for ``service``."""
        self.service = service
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        Gauge(
            "deniable_build_info",
            "Always 1; the labels say which build runs.",
            ["service", "version"],
            registry=self.registry,
        ).labels(service=service, version=version()).set(1)
        self.requests = Counter(
            "deniable_requests",
            "Finished RPCs by service, RPC (snake_case) and status code name (OK, UNAVAILABLE, ...).",
            ["service", "rpc", "code"],
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "deniable_request_duration_seconds",
            "Time from the call reaching the server to its status, by service and RPC.",
            ["service", "rpc"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.auth_refusals = Counter(
            "deniable_auth_refusals",
            "Calls refused for a missing or wrong credential (UNAUTHENTICATED / PERMISSION_DENIED).",
            ["service", "rpc", "reason"],
            registry=self.registry,
        )
        self._http: WSGIServer | None = None
        self._http_thread: threading.Thread | None = None
        self.tracer_provider: Any = None
        """An opentelemetry TracerProvider when tracing is on (core/plumbing/tracing.py), for ``span``."""

    def span(self, name: str, root: bool = False) -> contextlib.AbstractContextManager[Any]:
        """An INTERNAL span ``name`` around a step (child of the current RPC span, or a new root);
        nothing when tracing is off."""
        if self.tracer_provider is None:
            return contextlib.nullcontext()
        return internal_span(self.tracer_provider, name, root)

    def preinitialise(self, rpcs: Iterable[str]) -> None:
        """Create the request series of every RPC and known code at zero (dashboards see them)."""
        for rpc in rpcs:
            name = snake_case(rpc)
            self.request_seconds.labels(service=self.service, rpc=name)
            for code in KNOWN_CODES:
                self.requests.labels(service=self.service, rpc=name, code=code)

    def observe_request(self, rpc: str, code: str, seconds: float) -> None:
        """Count one finished RPC and its latency."""
        self.requests.labels(service=self.service, rpc=rpc, code=code).inc()
        self.request_seconds.labels(service=self.service, rpc=rpc).observe(seconds)

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        return bytes(generate_latest(self.registry))

    def serve_http(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve /metrics on ``addr:port`` (0 picks a free port) in a thread; return the port."""
        try:
            server, thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise ConfigurationError(f"cannot serve metrics on {addr}:{port}: {exc}") from exc
        self._http, self._http_thread = server, thread
        return int(server.server_port)

    def stop_http(self) -> None:
        """Stop the metrics endpoint if it runs."""
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self._http_thread is not None:
            self._http_thread.join(timeout=5)
            self._http_thread = None


def service_rpcs(service: Any) -> list[str]:
    """The method names of a generated gRPC service descriptor (``pb.DESCRIPTOR.services_by_name[...]``)."""
    return [method.name for method in service.methods]


Record = Callable[[str, str, float], None]


class RequestMetricsInterceptor(grpc.aio.ServerInterceptor):
    """Times every RPC and counts it by status code; outermost, so refusals by other interceptors count."""

    def __init__(self, record: Record) -> None:
        """``record(rpc, code, seconds)`` is called once per finished call."""
        self._record = record

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(details)
        rpc = snake_case(details.method.rsplit("/", 1)[-1])
        return wrap_behaviour(  # type: ignore[no-any-return]
            handler,
            lambda behaviour: self._unary(behaviour, rpc),
            lambda behaviour: self._streaming(behaviour, rpc),
        )

    def _finish(self, rpc: str, context: Any, started: float, error: BaseException | None) -> None:
        self._record(rpc, code_name(context, error), time.perf_counter() - started)

    def _unary(self, behaviour: Any, rpc: str) -> Any:
        async def timed(request: Any, context: Any) -> Any:
            started = time.perf_counter()
            error: BaseException | None = None
            try:
                result = behaviour(request, context)
                return (await result) if hasattr(result, "__await__") else result
            except BaseException as exc:
                error = exc
                raise
            finally:
                self._finish(rpc, context, started, error)

        return timed

    def _streaming(self, behaviour: Any, rpc: str) -> Any:
        async def timed(request: Any, context: Any) -> Any:
            started = time.perf_counter()
            error: BaseException | None = None
            try:
                async for item in stream_items(behaviour(request, context)):
                    yield item
            except BaseException as exc:
                error = exc
                raise
            finally:
                self._finish(rpc, context, started, error)

        return timed
