"""How the load test hands pre-encoded SubmitReports bodies to a shuffler: gRPC or its HTTPS face.

Each ``open_*`` is an async context manager yielding ``submit(raw, timeout) -> SubmitReportsResponse``
that raises ``SubmitFailed`` (with ``retryable``) for a refused or lost request, so the load test's
retry loop is the same for all. The HTTP ones are load generators, not devices: over HTTP/1.1
aiohttp's client (the ``[server]`` extra), keep-alive connections up to the concurrency; over HTTP/2
httpx's (``httpx[http2]``, in ``[dev]``), requests as streams of a few connections; the body sent
as it is.
"""

from __future__ import annotations

import contextlib
import itertools
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final
from urllib.parse import quote

from deniable.core.errors import ConfigurationError
from deniable.v1 import deniable_pb2 as pb

Submit = Callable[[bytes, float], Awaitable[pb.SubmitReportsResponse]]
RETRYABLE_HTTP: Final = frozenset({408, 429})
TRANSPORTS: Final = ("grpc", "https", "h2", "http")
"""``grpc``: the device port; ``https``: the HTTPS face with TLS (HTTP/1.1); ``h2``: the same over
HTTP/2 (ALPN); ``http``: the same face in plaintext (HTTP/1.1)."""


class SubmitFailed(Exception):
    """A request refused or lost; ``retryable`` says whether trying again may succeed."""

    def __init__(self, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


@asynccontextmanager
async def open_grpc(address: str) -> AsyncIterator[Submit]:
    """SubmitReports over a plaintext channel to a benchmark's shuffler (it runs ``insecure``)."""
    import grpc

    from deniable.client.transport import RETRYABLE_CODES
    from deniable.sim import benchkit

    channel = benchkit.plaintext_channel(address)
    call = benchkit.submit_callable(channel)

    async def submit(raw: bytes, timeout: float) -> pb.SubmitReportsResponse:
        try:
            response: pb.SubmitReportsResponse = await call(raw, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            raise SubmitFailed(exc.code().name, exc.code() in RETRYABLE_CODES) from exc
        return response

    try:
        yield submit
    finally:
        await channel.close()


@asynccontextmanager
async def open_http(
    url: str, campaign_id: str, concurrency: int, ca: Path | None = None
) -> AsyncIterator[Submit]:
    """POST /v1/campaigns/{id}/reports on ``url`` (``https://`` trusting ``ca``, or ``http://``)."""
    import aiohttp

    target = f"{url.rstrip('/')}/v1/campaigns/{quote(campaign_id, safe='')}/reports"
    context = ssl.create_default_context(cafile=str(ca)) if ca is not None else None
    headers = {"Content-Type": "application/x-protobuf"}
    connector = aiohttp.TCPConnector(limit=max(1, concurrency), ssl=context if context is not None else False)

    async with aiohttp.ClientSession(connector=connector) as session:

        async def submit(raw: bytes, timeout: float) -> pb.SubmitReportsResponse:
            try:
                async with session.post(
                    target, data=raw, headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)
                ) as answer:
                    body = await answer.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise SubmitFailed(f"{type(exc).__name__}: {exc}", retryable=True) from exc
            return _answered(answer.status, body)

        yield submit


def _answered(status: int, body: bytes) -> pb.SubmitReportsResponse:
    """The response of a 200, SubmitFailed (retryable or not, as the status says) otherwise."""
    if status != 200:
        raise SubmitFailed(f"HTTP {status}: {body[:200]!r}", status in RETRYABLE_HTTP or status >= 500)
    return pb.SubmitReportsResponse.FromString(body)


STREAMS_PER_H2_CONNECTION: Final = 4
"""Requests in flight per HTTP/2 connection of the generator: several streams per connection, as a
browser tab has, over several connections, as many devices have (and one httpx connection alone
cannot keep a server busy)."""


@asynccontextmanager
async def open_h2(url: str, campaign_id: str, concurrency: int, ca: Path) -> AsyncIterator[Submit]:
    """POST /v1/campaigns/{id}/reports over HTTP/2 (TLS, ALPN ``h2`` only): ``concurrency`` requests
    in flight as streams of ⌈concurrency / STREAMS_PER_H2_CONNECTION⌉ connections, taken in turn;
    needs ``httpx[http2]``."""
    try:
        import httpx
    except ImportError:
        raise ConfigurationError(
            "--transport h2 needs httpx with HTTP/2 (pip install 'httpx[http2]')"
        ) from None

    target = f"{url.rstrip('/')}/v1/campaigns/{quote(campaign_id, safe='')}/reports"
    headers = {"Content-Type": "application/x-protobuf"}
    context = ssl.create_default_context(cafile=str(ca))
    count = max(1, -(-concurrency // STREAMS_PER_H2_CONNECTION))
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(httpx.AsyncClient(http1=False, http2=True, verify=context))
            for _ in range(count)
        ]
        turn = itertools.count()

        async def submit(raw: bytes, timeout: float) -> pb.SubmitReportsResponse:
            client = clients[next(turn) % count]
            try:
                answer = await client.post(target, content=raw, headers=headers, timeout=timeout)
            except httpx.HTTPError as exc:
                raise SubmitFailed(f"{type(exc).__name__}: {exc}", retryable=True) from exc
            return _answered(answer.status_code, answer.content)

        yield submit
