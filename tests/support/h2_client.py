"""HTTP/2 clients for tests of the shuffler's HTTPS face: ``httpx`` with ``http2=True`` for whole
requests (an ``Answer`` like ``support.https_services``'s), a ``Transport`` for the device SDK's
``Reporter`` over it, and a raw ``h2`` connection for what a polite client never does (more streams
than the server allows, bodies held back)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import h2.config
import h2.connection
import h2.events
import httpx

from deniable.client import TransportError
from deniable.shuffler.https import PROTOBUF
from deniable.v1 import deniable_pb2 as pb
from support.https_services import Answer


@dataclass
class H2Client:
    """Requests over one HTTP/2 connection (httpx; ``http_version`` of each answer is checked)."""

    base: str
    client: httpx.AsyncClient
    versions: list[str] = field(default_factory=list)

    async def request(
        self, method: str, path: str, body: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> Answer:
        answer = await self.client.request(
            method, self.base + path, content=body, headers=dict(headers or {})
        )
        self.versions.append(answer.http_version)
        return Answer(answer.status_code, answer.headers, answer.content)

    async def submit(
        self, campaign_id: str, body: bytes, content_type: str = PROTOBUF, **headers: str
    ) -> Answer:
        """POST ``body`` to the campaign's reports route."""
        return await self.request(
            "POST", f"/v1/campaigns/{campaign_id}/reports", body, {"Content-Type": content_type, **headers}
        )


def h2_client(base: str, context: ssl.SSLContext) -> httpx.AsyncClient:
    """An httpx client that offers only ``h2`` by ALPN (it fails rather than fall back)."""
    return httpx.AsyncClient(http1=False, http2=True, verify=context, timeout=60)


class H2Transport:
    """The device SDK's ``Transport`` over HTTP/2 (test only): the same routes ``HttpTransport``
    uses over HTTP/1.1, so a ``Reporter`` can fetch and send through it."""

    def __init__(self, base: str, context: ssl.SSLContext) -> None:
        self._base = base
        self._client = h2_client(base, context)
        self.versions: set[str] = set()

    async def _call(self, method: str, path: str, body: bytes | None = None) -> bytes:
        headers = {"Content-Type": PROTOBUF} if body is not None else {}
        answer = await self._client.request(method, self._base + path, content=body, headers=headers)
        self.versions.add(answer.http_version)
        if answer.status_code != 200:
            raise TransportError(f"HTTP {answer.status_code}", answer.status_code in (408, 429, 503))
        return answer.content

    async def get_campaign(self, campaign_id: str) -> pb.Campaign:
        return pb.Campaign.FromString(await self._call("GET", f"/v1/campaigns/{quote(campaign_id)}"))

    async def submit(self, reports: Sequence[pb.EncryptedReport]) -> pb.SubmitReportsResponse:
        body = pb.SubmitReportsRequest(reports=reports).SerializeToString()
        path = f"/v1/campaigns/{quote(reports[0].campaign_id)}/reports"
        return pb.SubmitReportsResponse.FromString(await self._call("POST", path, body))

    async def close(self) -> None:
        await self._client.aclose()


class _Unbounded(h2.connection.H2Connection):
    """An h2 client that ignores the server's stream limit (to show the server enforces it)."""

    @property
    def open_outbound_streams(self) -> int:
        return 0


@dataclass
class RawH2:
    """One TLS connection speaking HTTP/2 frame by frame (the ``h2`` package, no HTTP client)."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    connection: h2.connection.H2Connection
    alpn: str | None
    events: list[Any] = field(default_factory=list)

    @classmethod
    async def open(cls, address: str, context: ssl.SSLContext, *, obey_limits: bool = True) -> RawH2:
        """Connect, negotiate ALPN (offering h2 only), send the preface; read the server's settings."""
        host, port = address.rsplit(":", 1)
        context.set_alpn_protocols(["h2"])
        reader, writer = await asyncio.open_connection(host, int(port), ssl=context, server_hostname=host)
        ssl_object = writer.get_extra_info("ssl_object")
        kind = h2.connection.H2Connection if obey_limits else _Unbounded
        connection = kind(config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        raw = cls(reader, writer, connection, ssl_object.selected_alpn_protocol() if ssl_object else None)
        connection.initiate_connection()
        await raw.flush()
        await raw.read_until(lambda: any(isinstance(e, h2.events.RemoteSettingsChanged) for e in raw.events))
        return raw

    async def flush(self) -> None:
        self.writer.write(self.connection.data_to_send())
        await self.writer.drain()

    async def read_until(self, done: Any, timeout: float = 30) -> None:
        """Read frames until ``done()`` or the connection closes."""
        async with asyncio.timeout(timeout):
            while not done():
                data = await self.reader.read(65536)
                if not data:
                    return
                self.events.extend(self.connection.receive_data(data))
                await self.flush()

    async def start_post(self, path: str, length: int) -> int:
        """Open a POST stream with its headers and no body yet; the stream id."""
        stream = self.connection.get_next_available_stream_id()
        headers = [
            (":method", "POST"),
            (":scheme", "https"),
            (":authority", "localhost"),
            (":path", path),
            ("content-type", PROTOBUF),
            ("content-length", str(length)),
        ]
        self.connection.send_headers(stream, headers)
        await self.flush()
        return stream

    def status(self, stream: int) -> int | None:
        """The answer's status on ``stream``, once its headers came."""
        for event in self.events:
            if isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream:
                headers = {str(name): str(value) for name, value in event.headers or []}
                return int(headers[":status"])  # str: the connection decodes headers as UTF-8
        return None

    def reset(self, stream: int) -> bool:
        """Whether the server reset ``stream``."""
        return any(isinstance(e, h2.events.StreamReset) and e.stream_id == stream for e in self.events)

    def closed(self) -> bool:
        return any(isinstance(e, h2.events.ConnectionTerminated) for e in self.events)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await self.writer.wait_closed()
