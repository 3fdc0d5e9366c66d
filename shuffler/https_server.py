"""Serving the HTTPS face's ASGI application with hypercorn on the shuffler's own event loop.

hypercorn speaks HTTP/1.1 (h11) and HTTP/2 (h2) and picks by ALPN on TLS connections; we keep the
parts that matter to the shuffler in our hands (ADR 0038):

- **TLS**: our ``SSLContext`` (``server_ssl_context``: the device port's certificate, TLS 1.2+,
  ALPN ``h2``, ``http/1.1``) instead of hypercorn's file-path settings, by a small ``Config``
  subclass;
- **the socket**: bound here, so a taken port is a one-line ``ConfigurationError`` before anything
  starts, and port 0 gives the chosen port at once;
- **every limit explicitly**, not hypercorn's defaults: see ``hypercorn_config``.

No signal handlers are installed (a shutdown trigger is passed) and the loop's exception handler
is left alone (``hypercorn.asyncio.serve``, unlike hypercorn's own runner, touches neither).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from typing import TYPE_CHECKING, Any, Final, cast

from hypercorn.asyncio import serve
from hypercorn.config import Config, Sockets

from deniable.core.errors import ConfigurationError

if TYPE_CHECKING:
    from deniable.shuffler.https import HttpsConfig

BACKLOG: Final = 1024
TLS_HANDSHAKE_TIMEOUT_S: Final = 10.0
MAX_HEAD_BYTES: Final = 16 * 1024
"""HTTP/1.1 request line plus headers, and HTTP/2 header list: as aiohttp's 8 KiB line + 8 KiB fields."""
MAX_REQUESTS_PER_CONNECTION: Final = 1_000_000
"""Then the connection is closed (``Connection: close``, HTTP/2 GOAWAY) and the client reconnects.
High on purpose: hypercorn's GOAWAY at this count ends an HTTP/2 connection with its streams in
flight (measured with curl at hypercorn's default of 1000: the requests in flight failed and the
TLS close stalled); nothing per connection grows with its request count, and the idle timeout and
the stream limit bound a connection."""
APP_QUEUE_CHUNKS: Final = 10
"""Body chunks hypercorn buffers per request before it stops reading the connection (HTTP/1.1) or
withholds HTTP/2 flow-control credit: the app's pace is the sender's pace."""


def address_free(record: logging.LogRecord) -> bool:
    """Drop the arguments of the HTTP server's log lines: formatted, they could name the peer."""
    if record.args:
        record.msg = "HTTP request could not be handled"
        record.args = ()
    return True


protocol_log = logging.getLogger("deniable.shuffler.https.protocol")
"""hypercorn's error log (its access log is off); a filter drops any line's arguments (ADR 0038)."""
protocol_log.addFilter(address_free)


class _OurConfig(Config):
    """hypercorn's settings with an ``SSLContext`` and a bound socket that are ours, not file paths."""

    def __init__(self, listener: socket.socket, context: ssl.SSLContext | None) -> None:
        super().__init__()
        self._listener = listener
        self._context = context

    @property
    def ssl_enabled(self) -> bool:
        """TLS exactly when the shuffler gave a context (None: plaintext, for tests)."""
        return self._context is not None

    def create_ssl_context(self) -> ssl.SSLContext | None:
        """Ours, unchanged (certificate, versions, ciphers, ALPN all from ``server_ssl_context``)."""
        return self._context

    def create_sockets(self) -> Sockets:
        """The socket ``bind_listener`` bound, as the one secure or insecure listener."""
        if self._context is None:
            return Sockets([], [self._listener], [])
        return Sockets([self._listener], [], [])


def hypercorn_config(config: HttpsConfig, listener: socket.socket, context: ssl.SSLContext | None) -> Config:
    """hypercorn's settings, every one that bounds a client set explicitly (docs/https.md):

    - body size and arrival are the application's (``max_body_bytes``, ``body_timeout_s``);
    - idle keep-alive connections, and heads that have not arrived, end after ``idle_timeout_s``
      (hypercorn's keep-alive timer runs whenever no request is in progress);
    - no read timeout on the socket: it would also cut a client waiting for a slow answer;
    - HTTP/2: ``max_streams_per_connection`` concurrent streams, 16 KiB frames and header lists,
      flow-control credit returned only as the application consumes the body.
    """
    hyper = _OurConfig(listener, context)
    hyper.alpn_protocols = ["h2", "http/1.1"]
    hyper.accesslog = None  # an access log would name every peer
    hyper.errorlog = protocol_log
    hyper.include_server_header = False
    hyper.backlog = BACKLOG
    hyper.ssl_handshake_timeout = TLS_HANDSHAKE_TIMEOUT_S
    hyper.keep_alive_timeout = config.idle_timeout_s
    hyper.keep_alive_max_requests = MAX_REQUESTS_PER_CONNECTION
    hyper.read_timeout = None
    hyper.h11_max_incomplete_size = MAX_HEAD_BYTES
    hyper.h2_max_concurrent_streams = config.max_streams_per_connection
    hyper.h2_max_header_list_size = MAX_HEAD_BYTES
    hyper.h2_max_inbound_frame_size = 2**14
    hyper.max_app_queue_size = APP_QUEUE_CHUNKS
    hyper.graceful_timeout = 5.0
    return hyper


def bind_listener(listen: str) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``[v6]:port``; empty host: every interface; port 0:
    any free one); ConfigurationError when it cannot be had."""
    host, _, port_text = listen.rpartition(":")
    host = host.strip("[]")
    dual = host in ("", "::") and socket.has_dualstack_ipv6()
    family = socket.AF_INET6 if ":" in host or dual else socket.AF_INET
    try:
        listener = socket.create_server(
            (host, int(port_text)), family=family, backlog=BACKLOG, dualstack_ipv6=dual
        )
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ConfigurationError(f"cannot serve HTTPS on {listen}: {reason}") from None
    listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    listener.setblocking(False)
    return listener


class HypercornServer:
    """One hypercorn server task over an ASGI application; ``start`` binds, ``stop`` drains."""

    def __init__(self, app: object, config: HttpsConfig, context: ssl.SSLContext | None) -> None:
        self._app = app
        self._config = config
        self._context = context
        self._task: asyncio.Task[None] | None = None
        self._shutdown = asyncio.Event()
        self._hyper: Config | None = None
        self.port: int | None = None

    async def start(self, started: asyncio.Event) -> int:
        """Bind and serve; the port. ``started`` is set by the application's lifespan startup."""
        listener = bind_listener(self._config.listen)
        self.port = int(listener.getsockname()[1])
        self._hyper = hypercorn_config(self._config, listener, self._context)
        app = cast(Any, self._app)
        self._task = asyncio.create_task(
            serve(app, self._hyper, shutdown_trigger=self._shutdown.wait, mode="asgi")
        )
        waiter = asyncio.ensure_future(started.wait())
        await asyncio.wait({self._task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if self._task.done():
            waiter.cancel()
            listener.close()
            self._task.result()  # raises what stopped it
            raise ConfigurationError(f"the HTTPS server on {self._config.listen} stopped at once")
        return self.port

    async def stop(self, grace: float) -> None:
        """Stop accepting, let requests in progress finish within ``grace`` seconds, then close."""
        task, self._task = self._task, None
        if task is None or self._hyper is None:
            return
        self._hyper.graceful_timeout = grace  # hypercorn reads it when the shutdown begins
        self._shutdown.set()
        with contextlib.suppress(asyncio.CancelledError):
            await task
