"""One operator call: open a channel to a service, call one method of its stub, close."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

from deniable.core.plumbing.tls import ClientTls

T = TypeVar("T")
Service = Literal["aggregator", "shuffler"]


async def call(
    address: str,
    method: Callable[[Any], Awaitable[T]],
    service: Service = "aggregator",
    tls: ClientTls | None = None,
) -> T:
    """Open a channel (TLS unless ``tls`` is None: the caller chose plaintext), make one call, close."""
    from deniable.core.plumbing.tls import open_channel
    from deniable.v1 import deniable_pb2_grpc as pb_grpc

    channel = open_channel(address, tls, insecure=tls is None)
    try:
        stub: Any = (
            pb_grpc.AggregatorStub(channel) if service == "aggregator" else pb_grpc.ShufflerStub(channel)
        )
        return await method(stub)
    finally:
        await channel.close()
