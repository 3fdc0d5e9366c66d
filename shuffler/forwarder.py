"""Forwarding of permuted batches to the aggregator, and the background loop that drives batching.

A batch is deleted only after the aggregator acknowledged it (OK, possibly as a duplicate); a failed
batch is kept and re-sent later with the same batch id, after a jittered exponential backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

import grpc

from deniable.core.backoff import Backoff
from deniable.shuffler.batcher import Batcher
from deniable.shuffler.metrics import ShufflerMetrics
from deniable.shuffler.spool import BatchRecord, CampaignSpoolStats, SpoolStore
from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:
    from deniable.v1.deniable_pb2_grpc import AggregatorAsyncStub

log = logging.getLogger("deniable.shuffler.forwarder")

_BATCH_SPECIFIC_CODES: Final = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.ALREADY_EXISTS,
    }
)
"""Failures that concern one batch: the others are still tried. Any other code pauses all forwarding."""


@dataclass(frozen=True)
class ForwardResult:
    """Batches and reports acknowledged by the aggregator in one pass, and failed attempts."""

    batches: int = 0
    reports: int = 0
    failures: int = 0


class BatchForwarder(Protocol):
    """Sends unacknowledged batches upstream (gRPC by default, NATS JetStream as an option)."""

    async def forward(self, campaign_id: str = "", *, force: bool = False) -> ForwardResult:
        """One pass over the spool's batches (of ``campaign_id`` if given)."""


RawIngest = Callable[..., Awaitable[pb.IngestBatchResponse]]
"""IngestBatch on a channel, taking the request already serialised: ``await raw(wire, timeout=...)``."""
INGEST_METHOD: Final = "/deniable.v1.Aggregator/IngestBatch"
DECRYPT_BUDGET_S_PER_BYTE: Final = 4e-6
"""Allowance per forwarded byte in the IngestBatch deadline: ≈ 10× the measured decrypt cost of one
core (≈ 50 µs per 144-byte report), so a full 48 MiB chunk gets ≈ 200 s on top of ``deadline_s``."""
DEFAULT_WINDOW: Final = 2
"""Batches in flight to the aggregator at once."""


def raw_ingest_callable(channel: grpc.aio.Channel) -> RawIngest:
    """IngestBatch sending pre-serialised ``ShuffledBatch`` bytes as they are."""

    def identity(wire: bytes) -> bytes:
        return wire

    return channel.unary_unary(
        INGEST_METHOD,
        request_serializer=identity,
        response_deserializer=pb.IngestBatchResponse.FromString,
    )


def shuffled_batch(record: BatchRecord) -> pb.ShuffledBatch:
    """The wire form of a batch: id, campaign, reports in the stored permuted order, digest."""
    message = pb.ShuffledBatch(
        batch_id=record.batch_id,
        campaign_id=record.campaign_id,
        digest=record.digest,
        release_id=record.release_id,
        chunk_index=record.chunk_index,
        chunk_count=record.chunk_count,
        release_messages=record.release_messages,
    )
    for report in record.reports:
        message.reports.add(
            campaign_id=report.campaign_id, key_id=report.key_id, ciphertext=report.ciphertext
        )
    return message


class Forwarder:
    """Sends unacknowledged batches, oldest first, and deletes each once acknowledged."""

    def __init__(
        self,
        store: SpoolStore,
        upstream: AggregatorAsyncStub,
        metrics: ShufflerMetrics,
        *,
        deadline_s: float = 30.0,
        retry_base_s: float = 0.5,
        retry_max_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        raw_ingest: RawIngest | None = None,
        window: int = DEFAULT_WINDOW,
    ) -> None:
        """``deadline_s`` bounds one IngestBatch call; retries back off from ``retry_base_s``.

        ``raw_ingest`` (IngestBatch taking serialised bytes, see ``raw_ingest_callable``) sends the
        batch bytes the spool stored (``load_wire``). ``window`` batches may be in
        flight at once (1: strictly one after the other).
        """
        if window < 1:
            raise ValueError("window must be at least 1")
        self._raw_ingest = raw_ingest
        self._window = window
        self._store = store
        self._upstream = upstream
        self._metrics = metrics
        self._deadline_s = deadline_s
        self._retry_base_s = retry_base_s
        self._retry_max_s = retry_max_s
        self._clock = clock
        self._upstream_backoff = self._new_backoff()
        self._batch_backoff: dict[str, Backoff] = {}

    def _new_backoff(self) -> Backoff:
        return Backoff(self._retry_base_s, self._retry_max_s, self._clock)

    async def forward(self, campaign_id: str = "", *, force: bool = False) -> ForwardResult:
        """Try every unacknowledged batch (of ``campaign_id`` if given) whose backoff has expired.

        ``force`` (operator flush) ignores backoff. Stops at the first failure that is not specific
        to one batch, since the aggregator is then most likely unreachable.
        """
        if not force and not self._upstream_backoff.ready():
            return ForwardResult()
        batch_ids = await asyncio.to_thread(self._store.batch_ids, campaign_id or None)
        for stale in set(self._batch_backoff) - set(batch_ids):
            if not campaign_id:
                del self._batch_backoff[stale]
        due = [
            batch_id
            for batch_id in batch_ids
            if force or (own := self._batch_backoff.get(batch_id)) is None or own.ready()
        ]
        # Up to ``window`` batches in flight: the aggregator decrypts one while it parses, checks
        # and stores the other, instead of leaving its decryption workers idle in between.
        slots = asyncio.Semaphore(self._window)
        unreachable: grpc.StatusCode | None = None

        async def attempt(batch_id: str) -> tuple[int | None, grpc.StatusCode | None]:
            nonlocal unreachable
            async with slots:  # FIFO: batches start in order, the next as soon as one is answered
                if unreachable is not None:
                    return None, None  # not tried: the aggregator looks unreachable
                size, code = await self._attempt(batch_id)
                if code is not None and code not in _BATCH_SPECIFIC_CODES:
                    unreachable = unreachable or code
                return size, code

        outcomes = await asyncio.gather(*(attempt(batch_id) for batch_id in due))
        result = self._tally(due, outcomes)
        if unreachable is not None:
            delay = self._upstream_backoff.failed()
            log.warning(
                "forwarding failed; batches kept, retried later",
                extra={"code": unreachable.name, "retry_in_s": round(delay, 3)},
            )
        return result

    def _tally(
        self, due: list[str], outcomes: list[tuple[int | None, grpc.StatusCode | None]]
    ) -> ForwardResult:
        """Count acknowledged and failed batches; back off a batch the aggregator refused."""
        batches = reports = failures = 0
        for batch_id, (size, code) in zip(due, outcomes, strict=True):
            if size is None:  # gone meanwhile
                continue
            if code is None:
                self._batch_backoff.pop(batch_id, None)
                self._upstream_backoff.succeeded()
                self._metrics.batches_forwarded.inc()
                self._metrics.reports_forwarded.inc(size)
                batches += 1
                reports += size
                continue
            failures += 1
            self._metrics.forward_failures.inc()
            if code in _BATCH_SPECIFIC_CODES:
                delay = self._batch_backoff.setdefault(batch_id, self._new_backoff()).failed()
                log.error(
                    "aggregator refused a batch; kept, retried later",
                    extra={"batch_id": batch_id, "code": code.name, "retry_in_s": round(delay, 3)},
                )
        return ForwardResult(batches, reports, failures)

    async def _attempt(self, batch_id: str) -> tuple[int | None, grpc.StatusCode | None]:
        """Load and send one batch, delete it once acknowledged: (reports or None if gone, failure)."""
        if self._raw_ingest is not None:
            wire = await asyncio.to_thread(self._store.load_wire, batch_id)
            if wire is None:
                return None, None
            size = wire[1]
            with self._metrics.forward_seconds.time(), self._metrics.span("shuffler.forward", root=True):
                code = await self._send_wire(batch_id, wire[0])
        else:
            record = await asyncio.to_thread(self._store.load_batch, batch_id)
            if record is None:
                return None, None
            size = len(record.reports)
            with self._metrics.forward_seconds.time(), self._metrics.span("shuffler.forward", root=True):
                code = await self._send(record)
        if code is None:
            await asyncio.to_thread(self._store.delete_batch, batch_id)
        return size, code

    async def _send(self, record: BatchRecord) -> grpc.StatusCode | None:
        """None if the aggregator acknowledged the batch, else the failure's status code."""
        try:
            batch = shuffled_batch(record)
            response: pb.IngestBatchResponse = await self._upstream.IngestBatch(
                batch, timeout=self.deadline_for(batch.ByteSize())
            )
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        return self._check_ack(record.batch_id, response)

    async def _send_wire(self, batch_id: str, wire: bytes) -> grpc.StatusCode | None:
        """``_send`` of a batch already serialised by the spool (no protobuf work per report)."""
        assert self._raw_ingest is not None
        try:
            response: pb.IngestBatchResponse = await self._raw_ingest(
                wire, timeout=self.deadline_for(len(wire))
            )
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        return self._check_ack(batch_id, response)

    def deadline_for(self, batch_bytes: int) -> float:
        """One IngestBatch call's deadline: ``deadline_s`` plus time to decrypt ``batch_bytes`` on a
        slow aggregator, so a large chunk is never cancelled (and resent) forever."""
        return self._deadline_s + batch_bytes * DECRYPT_BUDGET_S_PER_BYTE

    @staticmethod
    def _check_ack(batch_id: str, response: pb.IngestBatchResponse) -> grpc.StatusCode | None:
        if response.batch_id and response.batch_id != batch_id:
            log.error("aggregator acknowledged another batch id", extra={"batch_id": batch_id})
            return grpc.StatusCode.UNKNOWN
        return None


class Pipeline:
    """Batcher then forwarder: every ``interval_s`` in the background, or at once on an operator flush."""

    def __init__(
        self,
        store: SpoolStore,
        batcher: Batcher,
        forwarder: BatchForwarder,
        metrics: ShufflerMetrics,
        interval_s: float = 0.5,
    ) -> None:
        """Nothing runs until ``start``."""
        self._store = store
        self._batcher = batcher
        self._forwarder = forwarder
        self._metrics = metrics
        self._interval_s = interval_s
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    async def tick(self) -> None:
        """One background round: batch what the policy allows, forward what backoff allows."""
        async with self._lock:
            await self._batcher.run_once()
            await self._forwarder.forward()
            await self._update_gauges()

    async def flush(self, campaign_id: str = "", below_n_min: bool = False) -> pb.FlushResponse:
        """Batch now (below n_min only with the override) and forward now, ignoring backoff."""
        async with self._lock:
            batching = await self._batcher.run_once(
                campaign_id=campaign_id, flush=True, below_n_min=below_n_min
            )
            result = await self._forwarder.forward(campaign_id, force=True)
            stats = await self._update_gauges()
        held = sum(s.pending + s.in_flight for s in stats if not campaign_id or s.campaign_id == campaign_id)
        return pb.FlushResponse(
            batches_forwarded=result.batches,
            reports_forwarded=result.reports,
            reports_held=held,
            window_held=[
                pb.WindowHeld(campaign_id=c, pending=pending, n_min=n_min)
                for c, pending, n_min in batching.window_held
            ],
        )

    async def _update_gauges(self) -> list[CampaignSpoolStats]:
        stats = await asyncio.to_thread(self._store.stats)
        self._metrics.pending.set(sum(s.pending for s in stats))
        self._metrics.in_flight.set(sum(s.in_flight for s in stats))
        return stats

    def start(self) -> None:
        """Start the background loop (idempotent)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="deniable-shuffler-pipeline")

    async def stop(self) -> None:
        """Stop the background loop; a round in progress is cancelled (everything in it is durable)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:
                log.exception("batching/forwarding round failed; retrying next tick")
            await asyncio.sleep(self._interval_s)
