"""gRPC server plumbing shared by the shuffler and the aggregator.

Explicit message-size limits, the standard health service, binding that fails loudly when the
port is taken, and graceful shutdown on SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Final

import grpc

from deniable.core.errors import ConfigurationError

if TYPE_CHECKING:  # grpcio-health-checking is a server dependency, not the device SDK's
    from grpc_health.v1 import health

MAX_MESSAGE_BYTES: Final = 64 * 1024 * 1024
DEFAULT_MAX_CONCURRENT_RPCS: Final = 256
CHANNEL_OPTIONS: Final = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]


def new_server(
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
) -> grpc.aio.Server:
    """A grpc.aio server with explicit size limits; larger requests get RESOURCE_EXHAUSTED."""
    return grpc.aio.server(
        interceptors=list(interceptors),
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.so_reuseport", 0),
        ],
        maximum_concurrent_rpcs=DEFAULT_MAX_CONCURRENT_RPCS,
    )


def add_health(server: grpc.aio.Server, *service_names: str) -> health.HealthServicer:
    """Register the gRPC health service reporting SERVING for the overall server and each name."""
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    for name in ("", *service_names):
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return servicer


def _probe(address: str) -> None:
    """Try the address with a plain socket first, so a taken port is one clear line, not a C-core log."""
    host, _, port_text = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"  # noqa: S104 - only a probe of what the operator asked for
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigurationError(f"cannot listen on {address}: expected host:port") from None
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, port))
    except OSError as exc:
        raise ConfigurationError(f"cannot listen on {address}: {exc.strerror or exc}") from None


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
