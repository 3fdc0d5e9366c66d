"""Prometheus metrics of the aggregator, in a registry of its own.

A private ``CollectorRegistry`` lets an aggregator and a shuffler share one process (tests,
the demo) without clashing metric names.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, generate_latest, start_http_server

from deniable.v1 import deniable_pb2 as pb


def reason_name(reason: int) -> str:
    """Lower-case RejectReason name (the value itself if the enum does not know it)."""
    try:
        return pb.RejectReason.Name(reason).lower()  # type: ignore[arg-type]
    except ValueError:
        return str(reason)


class AggregatorMetrics:
    """Counters for counted and rejected reports, batches and failed requests."""

    def __init__(self) -> None:
        """Create the counters in a fresh registry."""
        self.registry = CollectorRegistry()
        self.reports_counted = Counter(
            "deniable_aggregator_reports_counted",
            "Reports decrypted, validated and added to the counts.",
            registry=self.registry,
        )
        self.reports_rejected = Counter(
            "deniable_aggregator_reports_rejected",
            "Reports received in batches but not counted, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.batches = Counter(
            "deniable_aggregator_batches",
            "Shuffled batches received, by outcome (ingested, duplicate, refused).",
            ["outcome"],
            registry=self.registry,
        )
        self.requests_failed = Counter(
            "deniable_aggregator_requests_failed",
            "RPCs that ended with a non-OK status, by method and status code.",
            ["rpc", "code"],
            registry=self.registry,
        )
        self._http: WSGIServer | None = None
        self._http_thread: threading.Thread | None = None

    def counted(self, count: int) -> None:
        """Record ``count`` reports added to the counts."""
        self.reports_counted.inc(count)

    def rejected(self, by_reason: Mapping[int, int]) -> None:
        """Record rejected reports by RejectReason value."""
        for reason, count in by_reason.items():
            if count:
                self.reports_rejected.labels(reason=reason_name(reason)).inc(count)

    def batch(self, outcome: str) -> None:
        """Record one batch as ``ingested``, ``duplicate`` or ``refused``."""
        self.batches.labels(outcome=outcome).inc()

    def failed(self, rpc: str, code: str) -> None:
        """Record one failed RPC."""
        self.requests_failed.labels(rpc=rpc, code=code).inc()

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)

    def serve_http(self, port: int, address: str = "127.0.0.1") -> int:
        """Serve ``/metrics`` on ``address:port`` from a daemon thread; returns the bound port."""
        server, thread = start_http_server(port, addr=address, registry=self.registry)
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
