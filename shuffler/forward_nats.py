"""Forwarding batches to NATS JetStream instead of gRPC (optional; see core/plumbing/jetstream.py).

A batch leaves the spool only after JetStream acknowledged storing it (a PubAck), exactly as the
gRPC forwarder waits for the aggregator's acknowledgement; a repeat publish of the same batch id
is dropped by JetStream's duplicate window and, beyond it, by the aggregator's batch-id check.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from deniable.core.plumbing.jetstream import SUBJECT
from deniable.shuffler.forwarder import ForwardResult
from deniable.shuffler.metrics import ShufflerMetrics
from deniable.shuffler.spool import SpoolStore

if TYPE_CHECKING:
    from nats.js.client import JetStreamContext

log = logging.getLogger("deniable.shuffler.nats")


class NatsForwarder:
    """Publishes every unacknowledged batch to the stream; deletes it once JetStream stored it."""

    def __init__(
        self, store: SpoolStore, js: JetStreamContext, metrics: ShufflerMetrics, *, timeout_s: float = 30.0
    ) -> None:
        """``timeout_s`` bounds one publish (the wait for JetStream's PubAck)."""
        self._store = store
        self._js = js
        self._metrics = metrics
        self._timeout_s = timeout_s

    async def forward(self, campaign_id: str = "", *, force: bool = False) -> ForwardResult:
        """Publish the batches (of ``campaign_id`` if given), oldest first; stop at the first failure."""
        batches = reports = 0
        for batch_id in await asyncio.to_thread(self._store.batch_ids, campaign_id or None):
            loaded = await asyncio.to_thread(self._store.load_wire, batch_id)
            if loaded is None:
                continue  # forwarded by another shuffler meanwhile
            wire, size = loaded
            try:
                await self._js.publish(
                    SUBJECT, wire, timeout=self._timeout_s, headers={"Nats-Msg-Id": batch_id}
                )
            except Exception as exc:  # timeouts, no responders, connection loss: keep, retry
                self._metrics.forward_failures.inc()
                log.warning(
                    "publishing to NATS failed; batches kept, retried later",
                    extra={"batch_id": batch_id, "error": type(exc).__name__},
                )
                return ForwardResult(batches, reports, 1)
            await asyncio.to_thread(self._store.delete_batch, batch_id)
            self._metrics.batches_forwarded.inc()
            self._metrics.reports_forwarded.inc(size)
            batches += 1
            reports += size
        return ForwardResult(batches, reports, 0)
