"""The shuffler's HTTPS face for devices that do not speak gRPC (browsers, phones, small apps).

Two device routes over the same handlers as the gRPC servicer, plus a cheap health route
(docs/https.md, ADR 0033, ADR 0038):

- ``GET /v1/campaigns/{id}``: the signed ``Campaign`` as protobuf bytes (``application/x-protobuf``);
- ``POST /v1/campaigns/{id}/reports``: a ``SubmitReportsRequest`` body, a ``SubmitReportsResponse``
  answer (per-report rejections as over gRPC); every report must name the path's campaign;
- ``GET /healthz``: 200 while the shuffler is SERVING, 503 otherwise (no reasons: it is public).

Everything else the gRPC device path does holds here too: the source's quota (the same opaque key
of the remote address, so one device's gRPC and HTTPS reports count together), the durable spool
write before the answer, the metrics (``deniable_requests_total`` with the HTTP status as code),
load shedding over a bound of requests in progress, and logs that never name an address. A refusal
is a small JSON body ``{"code": "...", "message": "..."}`` whose ``code`` is one of ``ERROR_CODES``.

The routes are a small ASGI application (this module); HTTP parsing, TLS, ALPN, HTTP/1.1 keep-alive
and HTTP/2 (streams, flow control) are hypercorn's (h11 and h2), served on the shuffler's own event
loop from ``shuffler/https_server.py``. This module only routes and checks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage

from deniable.core.errors import ConfigurationError, RequestRefused
from deniable.core.ids import valid_campaign_id
from deniable.core.plumbing.tls import ServerTls, read_pem
from deniable.shuffler.handlers import ShufflerHandlers
from deniable.shuffler.https_server import HypercornServer
from deniable.shuffler.metrics import ShufflerMetrics
from deniable.shuffler.quota import SourceKeys
from deniable.shuffler.rawsubmit import RawSubmit
from deniable.v1 import deniable_pb2 as pb

log = logging.getLogger("deniable.shuffler.https")

PROTOBUF: Final = "application/x-protobuf"
ACCEPTED_TYPES: Final = frozenset({PROTOBUF, "application/protobuf"})
DEFAULT_MAX_BODY_BYTES: Final = 16 * 1024 * 1024
DEFAULT_MAX_CONCURRENT: Final = 256
DEFAULT_BODY_TIMEOUT_S: Final = 30.0
DEFAULT_IDLE_TIMEOUT_S: Final = 30.0
DEFAULT_MAX_STREAMS: Final = 32
DRAIN_BYTES: Final = 1024 * 1024
"""At least this much of a refused body is read and dropped before the answer (``_drain``)."""
ALPN: Final = ("h2", "http/1.1")
"""What the TLS handshake offers, best first: HTTP/2, then HTTP/1.1 (ADR 0038)."""
PREFLIGHT_MAX_AGE_S: Final = 600
ANY_ORIGIN: Final = "*"

ERROR_CODES: Final = {
    "bad_content_type": 415,
    "body_too_large": 413,
    "body_timeout": 408,
    "malformed_body": 400,
    "campaign_mismatch": 400,
    "invalid_campaign_id": 400,
    "invalid_request": 400,
    "not_found": 404,
    "no_such_route": 404,
    "method_not_allowed": 405,
    "origin_not_allowed": 403,
    "quota_exceeded": 429,
    "unavailable": 503,
    "overloaded": 503,
    "failed_precondition": 409,
    "already_exists": 409,
    "internal": 500,
}
"""Every JSON error ``code`` and its HTTP status: a stable contract (docs/https.md)."""

_REFUSALS: Final = {
    "INVALID_ARGUMENT": "invalid_request",
    "NOT_FOUND": "not_found",
    "RESOURCE_EXHAUSTED": "quota_exceeded",
    "UNAVAILABLE": "unavailable",
    "FAILED_PRECONDITION": "failed_precondition",
    "ALREADY_EXISTS": "already_exists",
}
"""A handler's refusal (its gRPC status name) → the JSON error code."""


@dataclass(frozen=True)
class HttpsConfig:
    """Where the HTTPS face listens, which browser origins may call it, and its limits."""

    listen: str = "127.0.0.1:7703"
    cors_origins: tuple[str, ...] = ()
    """Origins (``https://app.example``) whose pages may call the endpoint; ``*``: any; empty: none."""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_concurrent: int = DEFAULT_MAX_CONCURRENT
    """Requests handled at once; more are shed with 503 ``overloaded`` (health included, as over gRPC)."""
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    """How long a request body may take to arrive (a slow sender holds a slot meanwhile), and how
    long an answer may take to leave (a reader that never reads does not hold a slot for ever)."""
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    """A connection without a request in progress is closed after this long: idle keep-alive, and a
    request head (HTTP/1.1 line and headers, HTTP/2 HEADERS) that has not arrived in full by then."""
    max_streams_per_connection: int = DEFAULT_MAX_STREAMS
    """HTTP/2 ``SETTINGS_MAX_CONCURRENT_STREAMS``: requests one connection may have open at once."""
    tls: ServerTls | None = None
    """A certificate for this face only, instead of the shuffler's ``tls``: the load test serves
    HTTPS from an otherwise plaintext benchmark shuffler. None: the shuffler's (the normal case)."""

    def __post_init__(self) -> None:
        counts = (self.max_body_bytes, self.max_concurrent, self.max_streams_per_connection)
        if min(counts) <= 0 or not (self.body_timeout_s > 0 and self.idle_timeout_s > 0):
            raise ConfigurationError(
                "the HTTPS limits (body bytes, concurrency, streams, body and idle timeouts) must be > 0"
            )
        for origin in self.cors_origins:
            if origin != ANY_ORIGIN and not origin.startswith(("https://", "http://")):
                raise ConfigurationError(
                    f"a CORS origin is ANY ('*') or a scheme://host[:port], got {origin!r}"
                )


class HttpRefusal(Exception):
    """A request refused before or instead of the handlers: its JSON ``code`` and a safe message."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.status = ERROR_CODES[code]
        self.message = message


def server_ssl_context(tls: ServerTls) -> ssl.SSLContext:
    """TLS 1.2+ with the shuffler's certificate, as on the gRPC device port (no client certificate
    asked), offering HTTP/2 and HTTP/1.1 by ALPN. Python's default ciphers and no TLS compression,
    as before HTTP/2 was served; clients that negotiate h2 use TLS 1.3 or an AEAD suite anyway."""
    read_pem(tls.cert, "TLS certificate")  # the same one-line errors as the gRPC port
    read_pem(tls.key, "TLS key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(tls.cert, tls.key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigurationError(f"cannot use {tls.cert} with {tls.key} for HTTPS: {exc}") from None
    context.set_alpn_protocols(list(ALPN))
    return context


@dataclass
class Answer:
    """One HTTP answer before it is sent: status, headers (lower-case names) and the whole body."""

    status: int
    body: bytes = b""
    content_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def header_list(self) -> list[tuple[bytes, bytes]]:
        """The ASGI header pairs, with ``content-type`` and ``content-length`` (a HEAD answer too
        announces the length of the body it leaves out)."""
        pairs = dict(self.headers)
        if self.content_type is not None:
            pairs["content-type"] = self.content_type
        pairs["content-length"] = str(len(self.body))
        return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in pairs.items()]


def _error(code: str, message: str) -> Answer:
    """The JSON error body every refusal has."""
    body = json.dumps({"code": code, "message": message}).encode()
    return Answer(ERROR_CODES[code], body, "application/json")


def _json(status: int, value: object) -> Answer:
    """A JSON answer (health)."""
    return Answer(status, json.dumps(value).encode(), "application/json")


def _protobuf(message: ProtoMessage) -> Answer:
    """A 200 with ``message``'s protobuf bytes."""
    return Answer(200, message.SerializeToString(), PROTOBUF)


def _valid_path_campaign(campaign_id: str) -> str:
    """The path's campaign id if it has the valid shape; HttpRefusal (never echoing it) if not."""
    if not valid_campaign_id(campaign_id):
        raise HttpRefusal("invalid_campaign_id", "the path does not name a campaign id of the valid shape")
    return campaign_id


def matching_request(raw: RawSubmit, campaign_id: str) -> RawSubmit | pb.SubmitReportsRequest:
    """The request to hand the handlers, once every report names ``campaign_id``; HttpRefusal if not."""
    shape = raw.uniform()
    if shape is not None:
        if shape[0] != campaign_id:
            raise HttpRefusal("campaign_mismatch", "the reports name another campaign than the path")
        return raw
    try:
        parsed = raw.parsed
    except DecodeError:
        raise HttpRefusal("malformed_body", "the body is not a SubmitReportsRequest") from None
    for index, report in enumerate(parsed.reports):
        if report.campaign_id != campaign_id:
            raise HttpRefusal("campaign_mismatch", f"report {index} names another campaign than the path")
    return parsed


Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_GET: Final = frozenset({"GET", "HEAD"})
_POST: Final = frozenset({"POST"})


class _Gone(Exception):
    """The client went away before its request was whole: nothing to answer."""


@dataclass(frozen=True)
class Route:
    """What a path names: its metric label, the campaign in it, and the methods it takes."""

    rpc: str
    campaign_id: str | None = None
    methods: frozenset[str] = frozenset()


def route_of(path: str) -> Route:
    """The route of a (percent-decoded) path; ``http_other`` with no methods for anything else."""
    if path == "/healthz":
        return Route("http_health", None, _GET)
    parts = path.split("/")
    if len(parts) in (4, 5) and parts[:3] == ["", "v1", "campaigns"] and parts[3]:
        if len(parts) == 4:
            return Route("http_get_campaign", parts[3], _GET)
        if parts[4] == "reports":
            return Route("http_submit_reports", parts[3], _POST)
    return Route("http_other")


@dataclass
class Request:
    """The parts of an ASGI HTTP scope the routes read, and the body as it arrives."""

    method: str
    path: str
    headers: dict[str, str]
    """Lower-case names (HTTP/2 sends them so, hypercorn lowers HTTP/1.1's); the last one wins."""
    client: str | None
    receive: Receive
    body_done: bool = False
    """The body's last chunk (or the client's leaving) has been received."""

    async def chunk(self) -> bytes:
        """The next piece of the body (``body_done`` after the last); _Gone if the client left."""
        message = await self.receive()
        if message["type"] == "http.disconnect":
            self.body_done = True
            raise _Gone
        self.body_done = not message.get("more_body", False)
        return bytes(message.get("body", b""))

    @classmethod
    def of(cls, scope: Scope, receive: Receive) -> Request:
        """Read ``scope`` (hypercorn's: ``path`` percent-decoded, ``client`` a (host, port) pair)."""
        headers = {
            bytes(k).decode("latin-1").lower(): bytes(v).decode("latin-1") for k, v in scope["headers"]
        }
        client = scope.get("client")
        host = str(client[0]) if client else None
        return cls(str(scope["method"]).upper(), str(scope["path"]), headers, host, receive)

    @property
    def content_type(self) -> str:
        """The media type without parameters, lower case (``application/x-protobuf``)."""
        return self.headers.get("content-type", "").split(";", 1)[0].strip().lower()

    @property
    def content_length(self) -> int | None:
        """The announced body length, None when absent (HTTP/2 may leave it out) or not a number."""
        text = self.headers.get("content-length", "")
        return int(text) if text.isdigit() else None


async def _lifespan(receive: Receive, send: Send, started: asyncio.Event) -> None:
    """ASGI lifespan: nothing to set up (the endpoint is built ready); say so, and when stopping."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
            started.set()
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class HttpsEndpoint:
    """The ASGI application over ``ShufflerHandlers``, served by hypercorn; ``start`` binds it,
    ``stop`` ends it."""

    def __init__(
        self,
        handlers: ShufflerHandlers,
        metrics: ShufflerMetrics,
        config: HttpsConfig,
        *,
        serving: Callable[[], bool],
        ssl_context: ssl.SSLContext | None,
    ) -> None:
        """``serving()`` is the health monitor's verdict; ``ssl_context`` None serves plaintext (tests)."""
        self._handlers = handlers
        self._metrics = metrics
        self.config = config
        self._serving = serving
        self._in_progress = 0
        self._origins = frozenset(config.cors_origins)
        self._server = HypercornServer(self, config, ssl_context)
        self._started = asyncio.Event()
        self.port: int | None = None
        for rpc in ("http_get_campaign", "http_submit_reports"):  # dashboards see the series at zero
            for status in ("200", *{str(code) for code in ERROR_CODES.values()}):
                metrics.requests.labels(service=metrics.service, rpc=rpc, code=status)

    async def start(self) -> int:
        """Bind ``config.listen`` (port 0: any free one) and serve; the port. ConfigurationError if taken."""
        self.port = await self._server.start(self._started)
        return self.port

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting and let requests in progress finish within ``grace`` seconds."""
        await self._server.stop(grace)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """ASGI: lifespan events, HTTP requests; anything else (a WebSocket upgrade) is refused."""
        if scope["type"] == "lifespan":
            await _lifespan(receive, send, self._started)
        elif scope["type"] == "http":
            await self._http(Request.of(scope, receive), send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})

    async def _http(self, request: Request, send: Send) -> None:
        """Shed beyond the bound, answer refusals as JSON, add CORS headers, count, time and send."""
        started = time.perf_counter()
        route = route_of(request.path)
        rpc = _rpc_of(request, route)
        if self._in_progress >= self.config.max_concurrent:
            shed = _error("overloaded", "too many requests in progress; retry later")
            shed.headers["retry-after"] = "1"
            answer: Answer | None = shed
        else:
            self._in_progress += 1
            try:
                answer = await self._answer(request, route, rpc)
            finally:
                self._in_progress -= 1
        if answer is None:
            return  # the client left; there is no one to answer or to count
        self._allow_origin(request, answer)
        self._record(rpc, answer.status, time.perf_counter() - started)
        try:
            if answer.status != ERROR_CODES["body_timeout"]:  # a body that does not come is not awaited
                await self._drain(request)
            async with asyncio.timeout(self.config.body_timeout_s):
                await send(
                    {"type": "http.response.start", "status": answer.status, "headers": answer.header_list()}
                )
                await send(
                    {"type": "http.response.body", "body": b"" if request.method == "HEAD" else answer.body}
                )
        except (TimeoutError, _Gone):
            pass  # a client that left or does not read: hypercorn closes the stream when we return

    async def _answer(self, request: Request, route: Route, rpc: str) -> Answer | None:
        """The route's answer, or the JSON error for what it refused; None if the client left."""
        try:
            return await self._dispatch(request, route)
        except HttpRefusal as exc:
            return _error(exc.code, exc.message)
        except RequestRefused as exc:
            return _error(_REFUSALS.get(exc.status, "failed_precondition"), str(exc))
        except _Gone:
            return None
        except Exception:
            log.exception("unexpected failure", extra={"rpc": rpc})
            return _error("internal", "internal error")

    async def _dispatch(self, request: Request, route: Route) -> Answer:
        """The route for the method: preflight, health, campaign, reports; 404 and 405 otherwise."""
        if request.method == "OPTIONS":
            return self._preflight(request)
        if not route.methods:
            raise HttpRefusal("no_such_route", "no such route")
        if request.method not in route.methods:
            raise HttpRefusal("method_not_allowed", "this route does not take that method")
        if route.rpc == "http_health":
            return self._health()
        campaign_id = _valid_path_campaign(route.campaign_id or "")
        if route.rpc == "http_get_campaign":
            answer = _protobuf(await self._handlers.get_campaign(campaign_id))
            answer.headers["cache-control"] = "no-cache"
            return answer
        return await self._submit(request, campaign_id)

    def _record(self, rpc: str, status: int, seconds: float) -> None:
        """``deniable_requests_total{rpc,code=<HTTP status>}``, its latency, failures by rpc and status."""
        self._metrics.observe_request(rpc, str(status), seconds)
        if status >= 400:
            self._metrics.requests_failed.labels(rpc=rpc, code=str(status)).inc()

    def _allowed(self, origin: str | None) -> bool:
        return origin is not None and (origin in self._origins or ANY_ORIGIN in self._origins)

    def _allow_origin(self, request: Request, answer: Answer) -> None:
        """CORS headers on an answer to an allowed origin (the browser hides the answer otherwise)."""
        origin = request.headers.get("origin")
        if self._origins:
            answer.headers["vary"] = "Origin"
        if self._allowed(origin):
            assert origin is not None
            answer.headers["access-control-allow-origin"] = origin
            answer.headers["access-control-expose-headers"] = "Retry-After"

    def _preflight(self, request: Request) -> Answer:
        """A CORS preflight: 204 with the methods and header allowed, 403 for an origin not listed."""
        if not self._allowed(request.headers.get("origin")):
            raise HttpRefusal("origin_not_allowed", "this origin may not call the endpoint")
        method = request.headers.get("access-control-request-method", "")
        if method not in ("GET", "POST"):
            raise HttpRefusal("method_not_allowed", "only GET and POST are allowed")
        answer = Answer(204)
        answer.headers["access-control-allow-methods"] = "GET, POST"
        answer.headers["access-control-allow-headers"] = "Content-Type"
        answer.headers["access-control-max-age"] = str(PREFLIGHT_MAX_AGE_S)
        return answer

    async def _submit(self, request: Request, campaign_id: str) -> Answer:
        """Check type, size and campaign, then submit as over gRPC (quota, durable spool, rejections)."""
        if request.content_type not in ACCEPTED_TYPES:
            raise HttpRefusal("bad_content_type", f"the body must be {PROTOBUF}")
        length = request.content_length
        if length is not None and length > self.config.max_body_bytes:
            raise HttpRefusal("body_too_large", f"the body is larger than {self.config.max_body_bytes} bytes")
        body = await self._body(request)
        submitted = matching_request(RawSubmit(body), campaign_id)
        response = await self._handlers.submit(submitted, self._source(request))
        return _protobuf(response)

    async def _body(self, request: Request) -> bytes:
        """The whole body, refused once it passes ``max_body_bytes`` or ``body_timeout_s``."""
        limit = self.config.max_body_bytes
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.config.body_timeout_s):
                while not request.body_done:
                    chunks.append(await request.chunk())
                    size += len(chunks[-1])
                    if size > limit:
                        raise HttpRefusal("body_too_large", f"the body is larger than {limit} bytes")
        except TimeoutError:
            raise HttpRefusal("body_timeout", "the body did not arrive in time") from None
        return b"".join(chunks)

    async def _drain(self, request: Request) -> None:
        """Read and drop what is left of a refused request's body (up to ``drain_bytes`` and
        ``body_timeout_s``) before answering.

        Why: hypercorn 0.18 forgets an HTTP/2 stream once its answer is sent, and DATA that then
        arrives for it ends the whole connection with a KeyError (hypercorn issue #329, unmerged
        fixes #312, #334), taking the connection's other requests with it. Answering only after the
        body ended keeps a polite client's connection; one that sends more than the bound loses it.
        Over HTTP/1.1 it lets the connection be kept alive instead of closed."""
        left = max(self.config.max_body_bytes, DRAIN_BYTES)
        try:
            async with asyncio.timeout(self.config.body_timeout_s):
                while not request.body_done and left > 0:
                    left -= len(await request.chunk())
        except TimeoutError:
            pass

    def _health(self) -> Answer:
        """200 ``serving`` or 503 ``not_serving``; the reasons stay in the logs and metrics."""
        if self._serving():
            return _json(200, {"status": "serving"})
        return _json(503, {"status": "not_serving"})

    def _source(self, request: Request) -> SourceKeys:
        """The caller's opaque quota key (its host, spelled as gRPC spells it); () without a quota."""
        quota = self._handlers.quota
        if quota is None or request.client is None:
            return ()
        return quota.address_keys(request.client)


def _rpc_of(request: Request, route: Route) -> str:
    """The metric label of a request: its route's, ``http_preflight``, or ``http_other`` (also for a
    method the route does not take)."""
    if request.method == "OPTIONS":
        return "http_preflight"
    return route.rpc if request.method in route.methods else "http_other"
