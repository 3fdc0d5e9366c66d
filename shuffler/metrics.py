"""Prometheus metrics of one shuffler, in its own registry (several shufflers can share a process)."""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, start_http_server

from deniable.core.errors import ConfigurationError


class ShufflerMetrics:
    """Counters and gauges; labels carry reasons, RPC names and codes, never a client identifier."""

    def __init__(self) -> None:
        """Create every metric in a fresh registry."""
        self.registry = CollectorRegistry()
        self.reports_accepted = Counter(
            "deniable_shuffler_reports_accepted",
            "Reports durably spooled.",
            registry=self.registry,
        )
        self.reports_rejected = Counter(
            "deniable_shuffler_reports_rejected",
            "Reports refused at the envelope check, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.batches_forwarded = Counter(
            "deniable_shuffler_batches_forwarded",
            "Batches acknowledged by the aggregator.",
            registry=self.registry,
        )
        self.reports_forwarded = Counter(
            "deniable_shuffler_reports_forwarded",
            "Reports in batches acknowledged by the aggregator.",
            registry=self.registry,
        )
        self.forward_failures = Counter(
            "deniable_shuffler_forward_failures",
            "IngestBatch attempts that did not succeed (the batch is kept and retried).",
            registry=self.registry,
        )
        self.requests_failed = Counter(
            "deniable_shuffler_requests_failed",
            "RPCs answered with a non-OK status, by RPC and status code.",
            ["rpc", "code"],
            registry=self.registry,
        )
        self.pending = Gauge(
            "deniable_shuffler_pending_reports",
            "Reports spooled and not yet in a batch.",
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "deniable_shuffler_in_flight_reports",
            "Reports in batches not yet acknowledged by the aggregator.",
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
