"""Prometheus plumbing shared by the services: a private registry and an optional /metrics endpoint.

A registry per service lets an aggregator and a shuffler share one process (tests, the demo)
without clashing metric names. Labels carry reasons, RPC names and codes, never a client identifier.
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, generate_latest, start_http_server

from deniable.core.errors import ConfigurationError


class ServiceMetrics:
    """A fresh ``CollectorRegistry`` with exposition and an HTTP endpoint; services add their metrics."""

    def __init__(self) -> None:
        """Create the empty registry."""
        self.registry = CollectorRegistry()
        self.auth_refusals = Counter(
            "deniable_auth_refusals",
            "Calls refused for a missing or wrong credential (UNAUTHENTICATED / PERMISSION_DENIED).",
            ["service", "rpc", "reason"],
            registry=self.registry,
        )
        self._http: WSGIServer | None = None
        self._http_thread: threading.Thread | None = None

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        return bytes(generate_latest(self.registry))

    def serve_http(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve /metrics on ``addr:port`` (0 picks a free port) in a thread; return the port."""
        try:
            server, thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as exc:
            raise ConfigurationError(f"cannot serve metrics on {addr}:{port}: {exc}") from exc
        self._http, self._http_thread = server, thread
        return int(server.server_port)

    def stop_http(self) -> None:
        """Stop the metrics endpoint if it runs."""
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self._http_thread is not None:
            self._http_thread.join(timeout=5)
            self._http_thread = None
