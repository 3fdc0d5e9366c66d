"""The shuffler's HTTPS face for devices that do not speak gRPC (browsers, phones, small apps).

Two device routes over the same handlers as the gRPC servicer, plus a cheap health route
(docs/https.md, ADR 0033):

- ``GET /v1/campaigns/{id}``: the signed ``Campaign`` as protobuf bytes (``application/x-protobuf``);
- ``POST /v1/campaigns/{id}/reports``: a ``SubmitReportsRequest`` body, a ``SubmitReportsResponse``
  answer (per-report rejections as over gRPC); every report must name the path's campaign;
- ``GET /healthz``: 200 while the shuffler is SERVING, 503 otherwise (no reasons: it is public).

Everything else the gRPC device path does holds here too: the source's quota (the same opaque key
of the remote address, so one device's gRPC and HTTPS reports count together), the durable spool
write before the answer, the metrics (``deniable_requests_total`` with the HTTP status as code),
load shedding over a bound of requests in progress, and logs that never name an address. A refusal
is a small JSON body ``{"code": "...", "message": "..."}`` whose ``code`` is one of ``ERROR_CODES``.
HTTP parsing, TLS and HTTP/1.1 keep-alive are aiohttp's; this module only routes and checks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from aiohttp import web
from google.protobuf.message import DecodeError
from google.protobuf.message import Message as ProtoMessage

from deniable.core.errors import ConfigurationError, RequestRefused
from deniable.core.ids import valid_campaign_id
from deniable.core.plumbing.tls import ServerTls, read_pem
from deniable.shuffler.handlers import ShufflerHandlers
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
    """How long a request body may take to arrive (a slow sender holds a slot meanwhile)."""
    tls: ServerTls | None = None
    """A certificate for this face only, instead of the shuffler's ``tls``: the load test serves
    HTTPS from an otherwise plaintext benchmark shuffler. None: the shuffler's (the normal case)."""

    def __post_init__(self) -> None:
        if self.max_body_bytes <= 0 or self.max_concurrent <= 0 or not self.body_timeout_s > 0:
            raise ConfigurationError("the HTTPS limits (body bytes, concurrency, body timeout) must be > 0")
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
    """TLS 1.2+ with the shuffler's certificate, as on the gRPC device port (no client certificate asked)."""
    read_pem(tls.cert, "TLS certificate")  # the same one-line errors as the gRPC port
    read_pem(tls.key, "TLS key")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(tls.cert, tls.key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigurationError(f"cannot use {tls.cert} with {tls.key} for HTTPS: {exc}") from None
    context.set_alpn_protocols(["http/1.1"])
    return context


def _error(code: str, message: str) -> web.Response:
    """The JSON error body every refusal has."""
    body = json.dumps({"code": code, "message": message})
    return web.Response(status=ERROR_CODES[code], text=body, content_type="application/json")


def _protobuf(message: ProtoMessage) -> web.Response:
    return web.Response(body=message.SerializeToString(), content_type=PROTOBUF)


def address_free(record: logging.LogRecord) -> bool:
    """Drop the arguments of aiohttp's protocol log lines: they name the peer's address."""
    if record.args:
        record.msg = "HTTP request could not be handled"
        record.args = ()
    return True


_protocol_log = logging.getLogger("deniable.shuffler.https.protocol")
_protocol_log.addFilter(address_free)


def _path_campaign(request: web.Request) -> str:
    campaign_id = request.match_info["campaign_id"]
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


class HttpsEndpoint:
    """The aiohttp application over ``ShufflerHandlers``; ``start`` binds it, ``stop`` ends it."""

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
        self._ssl = ssl_context
        self._in_progress = 0
        self._origins = frozenset(config.cors_origins)
        self._runner: web.AppRunner | None = None
        self.port: int | None = None
        for rpc in ("http_get_campaign", "http_submit_reports"):  # dashboards see the series at zero
            for status in ("200", *{str(code) for code in ERROR_CODES.values()}):
                metrics.requests.labels(service=metrics.service, rpc=rpc, code=status)

    def app(self) -> web.Application:
        """The routes, the middleware that counts, sheds, answers CORS and turns failures into JSON."""
        app = web.Application(client_max_size=self.config.max_body_bytes, middlewares=[self._middleware])
        app.router.add_get("/v1/campaigns/{campaign_id}", self._get_campaign, name="http_get_campaign")
        app.router.add_post("/v1/campaigns/{campaign_id}/reports", self._submit, name="http_submit_reports")
        app.router.add_get("/healthz", self._health, name="http_health")
        app.router.add_route("OPTIONS", "/{tail:.*}", self._preflight, name="http_preflight")
        return app

    async def start(self) -> int:
        """Bind ``config.listen`` (port 0: any free one) and serve; the port. ConfigurationError if taken."""
        host, _, port = self.config.listen.rpartition(":")
        runner = web.AppRunner(self.app(), access_log=None, logger=_protocol_log, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, host.strip("[]") or None, int(port), ssl_context=self._ssl)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise ConfigurationError(
                f"cannot serve HTTPS on {self.config.listen}: {exc.strerror or exc}"
            ) from None
        self._runner = runner
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1]) if sockets else int(port)
        return self.port

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting and let requests in progress finish within ``grace`` seconds."""
        runner, self._runner = self._runner, None
        if runner is not None:
            runner._shutdown_timeout = grace  # aiohttp takes it at construction; the grace comes now
            await runner.cleanup()

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Shed beyond the bound, answer refusals as JSON, add CORS headers, count and time."""
        started = time.perf_counter()
        rpc = _rpc_of(request)
        if self._in_progress >= self.config.max_concurrent:
            response: web.StreamResponse = _error("overloaded", "too many requests in progress; retry later")
            response.headers["Retry-After"] = "1"
        else:
            self._in_progress += 1
            try:
                response = await self._answer(request, handler, rpc)
            finally:
                self._in_progress -= 1
        self._allow_origin(request, response)
        self._record(rpc, response.status, time.perf_counter() - started)
        return response

    async def _answer(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        rpc: str,
    ) -> web.StreamResponse:
        """The handler's answer, or the JSON error for what it (or aiohttp) refused."""
        try:
            return await handler(request)
        except HttpRefusal as exc:
            return _error(exc.code, exc.message)
        except RequestRefused as exc:
            return _error(_REFUSALS.get(exc.status, "failed_precondition"), str(exc))
        except web.HTTPRequestEntityTooLarge:
            return _error("body_too_large", f"the body is larger than {self.config.max_body_bytes} bytes")
        except web.HTTPMethodNotAllowed as exc:
            if exc.allowed_methods <= {"OPTIONS"}:  # only the catch-all preflight route matched
                return _error("no_such_route", "no such route")
            return _error("method_not_allowed", "this route does not take that method")
        except web.HTTPNotFound:
            return _error("no_such_route", "no such route")
        except web.HTTPException as exc:
            return _error("invalid_request", exc.reason)
        except Exception:
            log.exception("unexpected failure", extra={"rpc": rpc})
            return _error("internal", "internal error")

    def _record(self, rpc: str, status: int, seconds: float) -> None:
        """``deniable_requests_total{rpc,code=<HTTP status>}``, its latency, failures by rpc and status."""
        self._metrics.observe_request(rpc, str(status), seconds)
        if status >= 400:
            self._metrics.requests_failed.labels(rpc=rpc, code=str(status)).inc()

    def _allowed(self, origin: str | None) -> bool:
        return origin is not None and (origin in self._origins or ANY_ORIGIN in self._origins)

    def _allow_origin(self, request: web.Request, response: web.StreamResponse) -> None:
        """CORS headers on an answer to an allowed origin (the browser hides the answer otherwise)."""
        origin = request.headers.get("Origin")
        if self._origins:
            response.headers["Vary"] = "Origin"
        if self._allowed(origin):
            assert origin is not None
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Expose-Headers"] = "Retry-After"

    async def _preflight(self, request: web.Request) -> web.StreamResponse:
        """A CORS preflight: 204 with the methods and header allowed, 403 for an origin not listed."""
        if not self._allowed(request.headers.get("Origin")):
            raise HttpRefusal("origin_not_allowed", "this origin may not call the endpoint")
        method = request.headers.get("Access-Control-Request-Method", "")
        if method not in ("GET", "POST"):
            raise HttpRefusal("method_not_allowed", "only GET and POST are allowed")
        response = web.Response(status=204)
        response.headers["Access-Control-Allow-Methods"] = "GET, POST"
        response.headers["Access-Control-Allow-Headers"] = "Content-Type"
        response.headers["Access-Control-Max-Age"] = str(PREFLIGHT_MAX_AGE_S)
        return response

    async def _get_campaign(self, request: web.Request) -> web.StreamResponse:
        """The signed campaign description, as GetCampaign relays it."""
        campaign = await self._handlers.get_campaign(_path_campaign(request))
        response = _protobuf(campaign)
        response.headers["Cache-Control"] = "no-cache"
        return response

    async def _submit(self, request: web.Request) -> web.StreamResponse:
        """Check type, size and campaign, then submit as over gRPC (quota, durable spool, rejections)."""
        campaign_id = _path_campaign(request)
        if request.content_type not in ACCEPTED_TYPES:
            raise HttpRefusal("bad_content_type", f"the body must be {PROTOBUF}")
        length = request.content_length
        if length is not None and length > self.config.max_body_bytes:
            raise HttpRefusal("body_too_large", f"the body is larger than {self.config.max_body_bytes} bytes")
        try:
            async with asyncio.timeout(self.config.body_timeout_s):
                body = await request.read()
        except TimeoutError:
            raise HttpRefusal("body_timeout", "the body did not arrive in time") from None
        submitted = matching_request(RawSubmit(body), campaign_id)
        response = await self._handlers.submit(submitted, self._source(request))
        return _protobuf(response)

    async def _health(self, request: web.Request) -> web.StreamResponse:
        """200 ``serving`` or 503 ``not_serving``; the reasons stay in the logs and metrics."""
        if self._serving():
            return web.json_response({"status": "serving"})
        return web.json_response({"status": "not_serving"}, status=503)

    def _source(self, request: web.Request) -> SourceKeys:
        """The caller's opaque quota key (its host, spelled as gRPC spells it); () without a quota."""
        quota = self._handlers.quota
        if quota is None or request.remote is None:
            return ()
        return quota.address_keys(request.remote)


def _rpc_of(request: web.Request) -> str:
    """The metric label of a request: its route's name, ``http_preflight``, or ``http_other``."""
    if request.method == "OPTIONS":
        return "http_preflight"
    route = request.match_info.route
    name = getattr(route, "name", None)
    return name if isinstance(name, str) and name.startswith("http_") else "http_other"
