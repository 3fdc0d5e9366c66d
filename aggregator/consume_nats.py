"""An aggregator worker taking batches from NATS JetStream (optional; see core/plumbing/jetstream.py).

Every worker pulls from the one durable consumer, one batch at a time: more workers, more
consumers. A batch is acknowledged only after ``ingest_batch`` committed it (or recognised it as
a duplicate); a worker killed before that leaves it unacknowledged, so JetStream redelivers it to
a worker after ``ack_wait`` and the batch-id check makes it count once. A batch that can never be
counted (bad bytes, wrong digest, reused id) is terminated and counted in metrics; a store that is
down gets the batch back later (nak with a delay).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Final

from google.protobuf.message import DecodeError

from deniable.aggregator.handlers import AggregatorHandlers
from deniable.core.errors import RequestRefused, Unavailable
from deniable.core.plumbing.jetstream import CONSUMER, DEFAULT_ACK_WAIT_S, SUBJECT
from deniable.v1 import deniable_pb2 as pb

log = logging.getLogger("deniable.aggregator.nats")

RETRY_DELAY_S: Final = 2.0
FETCH_WAIT_S: Final = 1.0


class NatsConsumer:
    """Pulls batches from the durable consumer and ingests them until stopped."""

    def __init__(
        self, js: Any, handlers: AggregatorHandlers, *, ack_wait_s: float = DEFAULT_ACK_WAIT_S
    ) -> None:
        """``js`` is a connected JetStream context; nothing is pulled until ``start``."""
        self._js = js
        self._handlers = handlers
        self._ack_wait_s = ack_wait_s
        self._task: asyncio.Task[None] | None = None

    async def subscribe(self) -> Any:
        """Bind to (or create) the durable pull consumer shared by every worker."""
        from nats.js.api import AckPolicy, ConsumerConfig

        config = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=self._ack_wait_s, max_deliver=-1)
        return await self._js.pull_subscribe(SUBJECT, durable=CONSUMER, config=config)

    def start(self, subscription: Any) -> None:
        """Pull and ingest in the background."""
        self._task = asyncio.create_task(self._run(subscription), name="nats-consumer")

    async def stop(self) -> None:
        """Stop pulling; a batch being ingested is abandoned unacknowledged (and redelivered)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self, subscription: Any) -> None:
        import nats.errors

        while True:
            try:
                messages = await subscription.fetch(1, timeout=FETCH_WAIT_S)
            except nats.errors.TimeoutError:
                continue
            except Exception:
                log.exception("pulling from NATS failed; retrying")
                await asyncio.sleep(RETRY_DELAY_S)
                continue
            for message in messages:
                await self._handle(message)

    async def _handle(self, message: Any) -> None:
        """Ingest one batch, then ack (counted or duplicate), nak (retry later) or term (never)."""
        try:
            batch = pb.ShuffledBatch.FromString(message.data)
        except DecodeError:
            self._handlers.metrics.batch("refused")
            log.error("dropped a NATS message that is not a ShuffledBatch")
            await message.term()
            return
        try:
            await self._handlers.ingest_batch(batch)
        except Unavailable as exc:
            log.warning("store unavailable; batch redelivered later", extra={"error": str(exc)[:200]})
            await message.nak(delay=RETRY_DELAY_S)
            return
        except RequestRefused as exc:
            log.error(
                "refused a batch from NATS",
                extra={"batch_id": batch.batch_id[:80], "error": f"{type(exc).__name__}: {str(exc)[:200]}"},
            )
            await message.term()
            return
        except Exception:  # the store failing mid-ingest: nothing was committed, try again later
            log.exception("ingesting a batch from NATS failed; redelivered later")
            await message.nak(delay=RETRY_DELAY_S)
            return
        await message.ack_sync()
