"""Prometheus metrics of one shuffler, in its own registry (several shufflers can share a process)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from deniable.core.plumbing.metrics import ServiceMetrics, reject_reasons, service_rpcs
from deniable.v1 import deniable_pb2 as pb

BATCH_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Seconds, for a spool commit or a whole batch's round trip to the aggregator."""


class ShufflerMetrics(ServiceMetrics):
    """Counters and gauges; labels carry reasons, RPC names and codes, never a client identifier."""

    def __init__(self) -> None:
        """Create every metric in a fresh registry.

        Long: one flat table of metric definitions.
        """
        super().__init__("shuffler")
        self.preinitialise(service_rpcs(pb.DESCRIPTOR.services_by_name["Shuffler"]))
        self.forward_seconds = Histogram(
            "deniable_shuffler_forward_duration_seconds",
            "One IngestBatch round trip to the aggregator (acknowledged or not).",
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.commit_seconds = Histogram(
            "deniable_shuffler_spool_commit_duration_seconds",
            "One durable spool append (fsync included) before a request is acknowledged.",
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
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
        for reason in reject_reasons():
            self.reports_rejected.labels(reason=reason)
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
        self.quota_refusals = Counter(
            "deniable_shuffler_quota_refusals",
            "SubmitReports requests refused because their source was over its quota (nothing spooled).",
            registry=self.registry,
        )
        self.descriptions_refused = Counter(
            "deniable_shuffler_descriptions_refused",
            "Campaign descriptions refused by the shuffler's floor (signature, n_min, batch target).",
            ["reason"],
            registry=self.registry,
        )
        self.lookups_refused = Counter(
            "deniable_shuffler_lookups_refused",
            "Campaign ids refused without an upstream look-up (known unknown, or over the look-up budget).",
            ["reason"],
            registry=self.registry,
        )
        self.device_rpcs_shed = Counter(
            "deniable_shuffler_rpcs_shed",
            "RPCs refused by the admission budgets (device or other) or past the device deadline.",
            ["rpc", "code"],
            registry=self.registry,
        )
        self.requests_failed = Counter(
            "deniable_shuffler_requests_failed",
            "RPCs answered with a non-OK status, by RPC and status code.",
            ["rpc", "code"],
            registry=self.registry,
        )
        self.spool_write_failures = Counter(
            "deniable_shuffler_spool_write_failures",
            "Spool appends that failed (disk full, I/O error): the request got UNAVAILABLE.",
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
        self.window_held = Gauge(
            "deniable_shuffler_window_held_reports",
            "Reports held because their campaign's window ended with fewer than n_min of them.",
            registry=self.registry,
        )
        self.releases = Counter(
            "deniable_shuffler_releases",
            "Batch releases by cause (target, window, operator, operator_below_n_min).",
            ["cause"],
            registry=self.registry,
        )
