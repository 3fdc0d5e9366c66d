"""One operator call: open a channel to a service, call one method of its stub, close."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

from deniable.core.errors import ConfigurationError
from deniable.core.plumbing.tls import ClientTls, Plaintext, Transport

log = logging.getLogger("deniable.admin")
T = TypeVar("T")
Service = Literal["aggregator", "shuffler"]


async def call(
    address: str,
    method: Callable[[Any], Awaitable[T]],
    service: Service = "aggregator",
    tls: Transport | None = None,
    *,
    insecure: bool = False,
) -> T:
    """Open a channel, make one call, close. TLS with a ``ClientTls``; plaintext only when chosen
    by name (``tls=INSECURE`` or ``insecure=True``): a missing ``tls`` is a ConfigurationError."""
    from deniable.core.plumbing.tls import open_channel
    from deniable.v1 import deniable_pb2_grpc as pb_grpc

    plaintext = insecure or isinstance(tls, Plaintext)
    if tls is None and not plaintext:
        raise ConfigurationError("no TLS configuration for the call: give --tls-ca (or --insecure by name)")
    if plaintext:
        log.warning("INSECURE: plaintext call to %s (asked for by name; tests only)", address)
    channel = open_channel(address, tls if isinstance(tls, ClientTls) else None, insecure=plaintext)
    try:
        stub: Any = (
            pb_grpc.AggregatorStub(channel) if service == "aggregator" else pb_grpc.ShufflerStub(channel)
        )
        return await method(stub)
    finally:
        await channel.close()
