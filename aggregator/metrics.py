"""Prometheus metrics of the aggregator, in a registry of its own.

A private ``CollectorRegistry`` lets an aggregator and a shuffler share one process (tests,
the demo) without clashing metric names.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import Counter, Histogram

from deniable.core.plumbing.metrics import ServiceMetrics, reason_label, reject_reasons, service_rpcs
from deniable.v1 import deniable_pb2 as pb

BATCH_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Seconds, for work on a whole batch (up to tens of thousands of reports)."""


def reason_name(reason: int) -> str:
    """Lower-case RejectReason name (the value itself if the enum does not know it)."""
    return reason_label(reason)


class AggregatorMetrics(ServiceMetrics):
    """Counters for counted and rejected reports, batches and failed requests."""

    def __init__(self) -> None:
        """Create the counters in a fresh registry.

        Long: one flat table of metric definitions.
        """
        super().__init__("aggregator")
        self.preinitialise(service_rpcs(pb.DESCRIPTOR.services_by_name["Aggregator"]))
        self.decrypt_seconds = Histogram(
            "deniable_aggregator_decrypt_duration_seconds",
            "Decrypting one batch (all its reports, over the worker processes).",
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.commit_seconds = Histogram(
            "deniable_aggregator_commit_duration_seconds",
            "The one store transaction that adds a batch to the counts.",
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
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
        for reason in reject_reasons():
            self.reports_rejected.labels(reason=reason)
        for outcome in ("ingested", "duplicate", "refused"):
            self.batches.labels(outcome=outcome)
        self.operator_actions = Counter(
            "deniable_aggregator_operator_actions",
            "Recorded operator actions on campaigns (close_campaign, release_below_n_min).",
            ["action"],
            registry=self.registry,
        )
        self.requests_failed = Counter(
            "deniable_aggregator_requests_failed",
            "RPCs that ended with a non-OK status, by method and status code.",
            ["rpc", "code"],
            registry=self.registry,
        )

        self.pool_rebuilds = Counter(
            "deniable_aggregator_decrypt_pool_rebuilds",
            "Decrypt worker pools replaced after a worker died (the batch in flight was retried).",
            registry=self.registry,
        )
        self.report_ids_forgotten = Counter(
            "deniable_aggregator_report_ids_forgotten",
            "Report ids garbage-collected after their campaign's retention ended.",
            registry=self.registry,
        )
        self.malformed = Counter(
            "deniable_aggregator_malformed_requests",
            "Requests refused with INVALID_ARGUMENT because their bytes were not valid protobuf.",
            ["rpc"],
            registry=self.registry,
        )

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

    def operator_action(self, action: str) -> None:
        """Record one operator action on a campaign."""
        self.operator_actions.labels(action=action).inc()

    def failed(self, rpc: str, code: str) -> None:
        """Record one failed RPC."""
        self.requests_failed.labels(rpc=rpc, code=code).inc()
