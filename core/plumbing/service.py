"""gRPC server plumbing shared by the shuffler and the aggregator.

Explicit message-size limits, the standard health service, binding that fails loudly when the
port is taken, and graceful shutdown on SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import inspect
import os
import shutil
import signal
import socket
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import grpc

from deniable.core.errors import ConfigurationError, RequestRefused

if TYPE_CHECKING:  # grpcio-health-checking is a server dependency, not the device SDK's
    from grpc_health.v1 import health_pb2
    from grpc_health.v1.health import aio as health_aio

MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024
DEFAULT_MAX_CONCURRENT_RPCS: Final = 256
MAX_PORT: Final = 65535
CHANNEL_OPTIONS: Final = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]


def status_code(error: RequestRefused) -> grpc.StatusCode:
    """The gRPC status a handler's refusal ends a call with (the gRPC and the MQTT face alike)."""
    return grpc.StatusCode[error.status]


def new_server(
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
    on_malformed: Callable[[str], None] | None = None,
    record_request: Callable[[str, str, float], None] | None = None,
    tracer_provider: Any = None,
    max_concurrent_rpcs: int | None = DEFAULT_MAX_CONCURRENT_RPCS,
) -> grpc.aio.Server:
    """A grpc.aio server with explicit size limits (larger requests get RESOURCE_EXHAUSTED), one
    port per server (SO_REUSEPORT off), bounded concurrency, malformed requests INVALID_ARGUMENT;
    ``record_request(rpc, code, seconds)`` sees every call, refused ones included; so does a
    root span per call if ``tracer_provider`` is given (core/plumbing/tracing.py). gRPC's
    ``max_concurrent_rpcs`` counts every open stream, a stranger's too: None leaves admission to
    an interceptor with budgets of its own (the shuffler's device port, shuffler/admission.py)."""
    outer: list[grpc.aio.ServerInterceptor] = []
    if tracer_provider is not None:
        from deniable.core.plumbing.tracing import TracingInterceptor

        outer.append(TracingInterceptor(tracer_provider))
    if record_request is not None:
        from deniable.core.plumbing.metrics import RequestMetricsInterceptor

        outer.append(RequestMetricsInterceptor(record_request))
    return grpc.aio.server(
        interceptors=[*outer, MalformedRequestInterceptor(on_malformed), *interceptors],
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.so_reuseport", 0),
        ],
        maximum_concurrent_rpcs=max_concurrent_rpcs,  # beyond it: RESOURCE_EXHAUSTED at once
    )


async def add_health(
    server: grpc.aio.Server,
    *service_names: str,
    status: health_pb2.HealthCheckResponse.ServingStatus | None = None,
) -> health_aio.HealthServicer:
    """Register the asyncio health service (the sync one freezes an aio server under Watch streams);
    every name starts at ``status`` (default SERVING)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_health.v1.health import aio as health_aio

    if status is None:
        status = health_pb2.HealthCheckResponse.SERVING
    servicer = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    for name in ("", *service_names):
        await servicer.set(name, status)
    return servicer


def _probe(address: str) -> None:
    """Try the address with a plain socket first, so a taken port is one clear line, not a C-core log."""
    host, _, port_text = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"  # noqa: S104 - only a probe of what the operator asked for
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigurationError(f"cannot listen on {address}: expected host:port") from None
    if not 0 <= port <= MAX_PORT:
        raise ConfigurationError(f"cannot listen on {address}: the port must lie in 0..{MAX_PORT}")
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            # TIME_WAIT connections of a killed predecessor must not block a restart; a live
            # listener still does (Linux refuses SO_REUSEADDR binds onto a listening port).
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except (OSError, OverflowError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise ConfigurationError(f"cannot listen on {address}: {reason}") from None


def bind(server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None = None) -> int:
    """Bind a TLS port (plaintext when ``credentials`` is None); ConfigurationError if it cannot be had."""
    _probe(address)
    try:
        port = (
            server.add_insecure_port(address)
            if credentials is None
            else server.add_secure_port(address, credentials)
        )
    except RuntimeError as exc:
        raise ConfigurationError(f"cannot listen on {address}: {exc}") from exc
    if port == 0:
        raise ConfigurationError(f"cannot listen on {address}: address in use or not available")
    return port


def host_of(address: str) -> str:
    """The host part of host:port (IPv6 brackets kept)."""
    return address.rsplit(":", 1)[0]


def insecure_channel(address: str) -> grpc.aio.Channel:
    """A client channel with the same message-size limits as the servers."""
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)


async def run_until_signalled(stop: Callable[[], Awaitable[None]]) -> None:
    """Block until SIGTERM or SIGINT, then call ``stop`` (graceful shutdown)."""
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stopped.set)
    await stopped.wait()
    await stop()


class _Malformed:
    """Stands for request bytes that did not parse, so the handler answers instead of gRPC."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def _safe_deserializer(parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def deserialize(raw: bytes) -> Any:
        try:
            return parse(raw)
        except Exception as exc:  # protobuf's DecodeError and anything a parser raises on garbage
            return _Malformed(exc)

    return deserialize


class MalformedRequestInterceptor(grpc.aio.ServerInterceptor):
    """Malformed protobuf on any unary-request method → INVALID_ARGUMENT (gRPC alone says UNKNOWN).

    ``on_malformed(method)`` is called once per such request (a metric).
    """

    def __init__(self, on_malformed: Callable[[str], None] | None = None) -> None:
        """Count refusals through ``on_malformed`` if given."""
        self._on_malformed = on_malformed

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(details)
        replace = getattr(handler, "_replace", None)  # grpc's RpcMethodHandler is a namedtuple
        if handler is None or replace is None or handler.request_streaming:
            return handler
        parse = handler.request_deserializer or (lambda raw: raw)
        method = details.method.rsplit("/", 1)[-1]
        if handler.unary_unary is not None:
            return replace(  # type: ignore[no-any-return]
                request_deserializer=_safe_deserializer(parse),
                unary_unary=self._guard_unary(handler.unary_unary, method),
            )
        if handler.unary_stream is not None:
            return replace(  # type: ignore[no-any-return]
                request_deserializer=_safe_deserializer(parse),
                unary_stream=self._guard_stream(handler.unary_stream, method),
            )
        return handler

    async def _refuse(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        if self._on_malformed is not None:
            self._on_malformed(method)
        await context.abort(
            grpc.StatusCode.INVALID_ARGUMENT, f"malformed {method} request: not valid protobuf"
        )

    def _guard_unary(self, behaviour: Any, method: str) -> Any:
        async def guarded(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            if isinstance(request, _Malformed):
                await self._refuse(method, context)
            return await behaviour(request, context)

        return guarded

    def _guard_stream(self, behaviour: Any, method: str) -> Any:
        if inspect.isasyncgenfunction(behaviour):

            async def guarded_generator(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                if isinstance(request, _Malformed):
                    await self._refuse(method, context)
                async for item in behaviour(request, context):
                    yield item

            return guarded_generator
        return self._guard_unary(behaviour, method)  # a coroutine that writes with context.write


LOCK_FILE: Final = ".lock"


class DataDirLock:
    """An exclusive ``flock`` on ``<data dir>/.lock``: two services never share one data directory.

    The kernel drops the lock when the holder dies (even by SIGKILL), so a restart is never blocked.
    """

    def __init__(self, data_dir: Path) -> None:
        """Take the lock; ConfigurationError (one line) if another process holds it."""
        self.path = data_dir / LOCK_FILE
        try:
            self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ConfigurationError(f"cannot use data directory {data_dir}: {exc.strerror or exc}") from exc
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(self._fd, 32, 0).decode("ascii", "replace").strip() or "?"
            os.close(self._fd)
            self._fd = None
            raise ConfigurationError(
                f"data directory {data_dir} is in use by another service (pid {holder})"
            ) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode("ascii"), 0)

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Leftovers:
    """Remembers what a data directory held before a start, so a failed start leaves nothing behind."""

    def __init__(self, data_dir: Path) -> None:
        """Note the entries of ``data_dir`` (and whether it exists) now."""
        self._dir = data_dir
        self._dir_new = not data_dir.exists()
        self._before = set() if self._dir_new else {p.name for p in data_dir.iterdir()}

    def remove(self) -> None:
        """Delete every entry the failed start created, and the directory if it created it."""
        with contextlib.suppress(OSError):
            for path in self._dir.iterdir():
                if path.name not in self._before:
                    with contextlib.suppress(OSError):
                        shutil.rmtree(path) if path.is_dir() else path.unlink()
        if self._dir_new:
            with contextlib.suppress(OSError):
                self._dir.rmdir()
