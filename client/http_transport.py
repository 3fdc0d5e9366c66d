"""``HttpTransport``: the shuffler's HTTPS device endpoint with the standard library only.

``GET /v1/campaigns/{id}`` and ``POST /v1/campaigns/{id}/reports`` (docs/https.md) over one kept-
alive ``http.client`` connection with TLS (``ssl``), each blocking call run in a worker thread so
the Reporter's loop keeps going. A bare ``pip install deniable`` has everything it needs: no grpcio,
no HTTP library. Failures are ``TransportError``: retryable for network errors, timeouts, 408, 429
and 5xx (and a 200 that is not protobuf: a proxy's page), permanent for the other answers.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import ssl
import threading
from collections.abc import Sequence
from typing import Final
from urllib.parse import quote, urlsplit

from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage

from deniable.client.transport import TransportError
from deniable.core.plumbing.tls import ClientTls
from deniable.v1 import deniable_pb2 as pb

PROTOBUF: Final = "application/x-protobuf"
RETRYABLE_HTTP: Final = frozenset({408, 429, 500, 502, 503, 504})
"""Statuses after which the same request may succeed later (every other 5xx too)."""
_NETWORK_ERRORS: Final = (OSError, http.client.HTTPException)


def ssl_context(tls: ClientTls | None) -> ssl.SSLContext:
    """Verify the server against ``tls.ca`` (else the system's roots); a device certificate if given."""
    context = ssl.create_default_context(cafile=None if tls is None or tls.ca is None else str(tls.ca))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if tls is not None and tls.cert is not None and tls.key is not None:
        context.load_cert_chain(str(tls.cert), str(tls.key))
    return context


def _refusal(status: int, body: bytes) -> str:
    """``code: message`` from the endpoint's JSON error body, or the bare status."""
    try:
        error = json.loads(body)
        return f"{error['code']}: {error['message']}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status}"


class HttpTransport:
    """The shuffler over HTTPS (``https://host:port``), verifying its certificate like ``GrpcTransport``."""

    def __init__(
        self,
        url: str,
        timeout_s: float = 10.0,
        *,
        tls: ClientTls | None = None,
        insecure: bool = False,
    ) -> None:
        """``url``: the shuffler's HTTPS base URL; ``tls``: the CA to trust (default: the system's
        roots); ``insecure=True``: plain ``http://``, for tests against an insecure shuffler only."""
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        if insecure and tls is not None:
            raise ValueError("choose tls or insecure, not both")
        parts = urlsplit(url)
        if parts.scheme != ("http" if insecure else "https") or not parts.hostname:
            want = "http://HOST:PORT (insecure)" if insecure else "https://HOST:PORT"
            raise ValueError(f"the shuffler's URL must be {want}, got {url!r}")
        self.url = url
        self.timeout_s = timeout_s
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._ssl = None if insecure else ssl_context(tls)
        self._connection: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

    async def submit(self, reports: Sequence[pb.EncryptedReport]) -> pb.SubmitReportsResponse:
        """POST the reports, one request per campaign they name; the answers merged in report order."""
        by_campaign: dict[str, list[int]] = {}
        for index, report in enumerate(reports):
            by_campaign.setdefault(report.campaign_id, []).append(index)
        merged = pb.SubmitReportsResponse()
        for campaign_id, indices in by_campaign.items():
            request = pb.SubmitReportsRequest(reports=[reports[i] for i in indices])
            path = f"/v1/campaigns/{quote(campaign_id, safe='')}/reports"
            response = pb.SubmitReportsResponse()
            await self._call("POST", path, request, response, "SubmitReports")
            merged.accepted += response.accepted
            for refused in response.rejected:
                merged.rejected.add(
                    index=indices[refused.index], reason=refused.reason, detail=refused.detail
                )
        return merged

    async def get_campaign(self, campaign_id: str) -> pb.Campaign:
        """GET the campaign description as the shuffler relays it (signature checked by the caller)."""
        campaign = pb.Campaign()
        await self._call("GET", f"/v1/campaigns/{quote(campaign_id, safe='')}", None, campaign, "GetCampaign")
        return campaign

    async def close(self) -> None:
        """Close the kept-alive connection; a later call opens a new one."""
        await asyncio.to_thread(self._drop)

    async def _call(
        self, method: str, path: str, body: ProtoMessage | None, into: ProtoMessage, what: str
    ) -> None:
        """One request in a worker thread; ``into`` parsed from a 200 answer, else TransportError."""
        payload = None if body is None else body.SerializeToString()
        status, content_type, answer = await asyncio.to_thread(self._exchange, method, path, payload, what)
        if status != 200:
            retryable = status in RETRYABLE_HTTP or status >= 500
            raise TransportError(f"{what} failed: HTTP {status} {_refusal(status, answer)}", retryable)
        try:
            if content_type != PROTOBUF:
                raise DecodeError(content_type)
            into.ParseFromString(answer)
        except DecodeError:
            raise TransportError(f"{what} failed: the answer is not protobuf", retryable=True) from None

    def _exchange(self, method: str, path: str, payload: bytes | None, what: str) -> tuple[int, str, bytes]:
        """Send and read one request on the kept-alive connection (one at a time); reconnect once if
        the server had closed an idle connection, else a retryable TransportError."""
        headers = {"Accept": PROTOBUF}
        if payload is not None:
            headers["Content-Type"] = PROTOBUF
        with self._lock:
            for attempt in (1, 2):
                fresh = self._connection is None
                connection = self._open()
                try:
                    connection.request(method, self._prefix + path, body=payload, headers=headers)
                    answer = connection.getresponse()
                    data = answer.read()
                except _NETWORK_ERRORS as exc:
                    self._drop_locked()
                    if fresh or attempt == 2 or isinstance(exc, TimeoutError):
                        raise TransportError(f"{what} failed: {type(exc).__name__}: {exc}", True) from exc
                    continue  # a kept-alive connection the server closed meanwhile: once more, fresh
                if answer.will_close:
                    self._drop_locked()
                return answer.status, answer.headers.get_content_type(), data
        raise AssertionError("unreachable")  # pragma: no cover

    def _open(self) -> http.client.HTTPConnection:
        if self._connection is None:
            if self._ssl is None:
                self._connection = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout_s)
            else:
                self._connection = http.client.HTTPSConnection(
                    self._host, self._port, timeout=self.timeout_s, context=self._ssl
                )
        return self._connection

    def _drop(self) -> None:
        with self._lock:
            self._drop_locked()

    def _drop_locked(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()
