"""Batch ingestion: check the manifest, decrypt off the event loop, screen, plan, commit once.

Decryption runs on a process pool when configured (healed when a worker dies), else the default
thread executor; the plan and the storage transaction are ``ingest_plan`` and ``store_pipeline``."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Executor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from typing import Final

import numpy as np

from deniable.aggregator.context import HandlerContext
from deniable.aggregator.decrypt import OK, Envelope, Opened, open_packed, open_reports, unpack_opened
from deniable.aggregator.ingest_plan import CountCells, Counting, IngestOutcome, IngestPlan, plan_ingest
from deniable.aggregator.pool import DecryptPool, PoolUnavailable
from deniable.aggregator.releases import ReleaseCheck, ReleaseConflict
from deniable.aggregator.store import (
    BatchConflict,
    BelowNMin,
    UnknownCampaign,
)
from deniable.core.batches import ReleaseChunk, batch_digest
from deniable.core.campaigns import randomiser_for
from deniable.core.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidRequest,
    NotFound,
    RequestRefused,
    Unavailable,
)
from deniable.core.mechanisms import LocalRandomiser
from deniable.core.mechanisms.base import IntArray
from deniable.v1 import deniable_pb2 as pb

log = logging.getLogger("deniable.aggregator")

CAMPAIGN_CLOSED: Final = int(pb.CAMPAIGN_CLOSED)
MIN_CHUNK: Final = 512
POOL_ATTEMPTS: Final = 3
PAYLOAD_OUT_OF_DOMAIN: Final = int(pb.PAYLOAD_OUT_OF_DOMAIN)


def _pack(campaign: pb.Campaign, chunk: Sequence[Envelope]) -> tuple[bytes, bytes] | None:
    """(uint32 key ids, ciphertexts back to back) if every envelope names the campaign and has its
    ciphertext length; None otherwise (such chunks take ``open_reports``)."""
    width = campaign.ciphertext_length
    if any(c != campaign.id or len(t) != width for c, _, t in chunk):
        return None
    keys = np.fromiter((k for _, k, _ in chunk), dtype="<u4", count=len(chunk))
    return keys.tobytes(), b"".join(t for _, _, t in chunk)


def _chunks(items: Sequence[Envelope], parts: int) -> list[Sequence[Envelope]]:
    """Split into at most ``parts`` contiguous chunks of at least MIN_CHUNK items."""
    size = max(MIN_CHUNK, -(-len(items) // max(parts, 1)))
    return [items[i : i + size] for i in range(0, len(items), size)]


class IngestHandlers:
    """``IngestBatch``: count a shuffled batch once, or refuse it whole."""

    def __init__(
        self, ctx: HandlerContext, executor: Executor | DecryptPool | None = None, decrypt_workers: int = 0
    ) -> None:
        """``executor`` runs decryption (None: the loop's default; a ``DecryptPool`` is healed when
        a worker dies); ``decrypt_workers`` sets chunking."""
        self._ctx = ctx
        self.pool = executor if isinstance(executor, DecryptPool) else None
        self._executor = None if isinstance(executor, DecryptPool) else executor
        self._workers = decrypt_workers

    async def _open(self, campaign: pb.Campaign, envelopes: Sequence[Envelope]) -> list[Opened]:
        """Decrypt off the event loop; a dead worker gets the pool rebuilt and the batch retried."""
        pool = self.pool
        if pool is None:
            return await self._open_with(self._executor, campaign, envelopes)
        for _ in range(POOL_ATTEMPTS):
            if pool.broken is not None and await pool.check() is not None:
                raise Unavailable(f"{pool.broken}; the batch was not counted, resend it later")
            executor = pool.executor
            try:
                return await self._open_with(executor, campaign, envelopes)
            except BrokenProcessPool:
                try:
                    await pool.heal(executor)
                except PoolUnavailable as exc:
                    raise Unavailable(f"{exc}; the batch was not counted, resend it later") from None
        raise Unavailable(f"decrypt workers died {POOL_ATTEMPTS} times on this batch; it was not counted")

    async def _open_with(
        self, executor: Executor | None, campaign: pb.Campaign, envelopes: Sequence[Envelope]
    ) -> list[Opened]:
        """Decrypt on ``executor``, in chunks spread over its worker processes."""
        if not envelopes:
            return []
        keys = self._ctx.keyring.private_keys()
        work = partial(
            open_reports,
            campaign.id,
            campaign.plaintext_length,
            campaign.ciphertext_length,
            keys,
            incarnation=campaign.incarnation,
        )
        loop = asyncio.get_running_loop()
        if executor is None or self._workers <= 0:
            return await loop.run_in_executor(executor, work, envelopes)
        chunks = _chunks(envelopes, self._workers)
        packed = await asyncio.to_thread(lambda: [_pack(campaign, chunk) for chunk in chunks])
        if any(p is None for p in packed):  # another campaign or size inside: the general path
            parts = await asyncio.gather(*(loop.run_in_executor(executor, work, c) for c in chunks))
            return [opened for part in parts for opened in part]
        # Few large buffers per worker instead of a tuple per report (keys parsed once per worker).
        packed_work = partial(
            open_packed,
            campaign.id,
            campaign.plaintext_length,
            campaign.ciphertext_length,
            keys,
            incarnation=campaign.incarnation,
        )
        results = await asyncio.gather(
            *(loop.run_in_executor(executor, packed_work, *p) for p in packed if p is not None)
        )
        return await asyncio.to_thread(lambda: [o for result in results for o in unpack_opened(result)])

    async def ingest_batch(self, batch: pb.ShuffledBatch) -> pb.IngestBatchResponse:
        """Count a shuffled batch once: refuse it whole if its manifest is wrong."""
        try:
            return await self._ingest(batch)
        except RequestRefused:
            self._ctx.metrics.batch("refused")
            raise

    async def _ingest(self, batch: pb.ShuffledBatch) -> pb.IngestBatchResponse:
        """Check the manifest, skip a known batch, screen its reports, plan, commit, answer."""
        if not batch.batch_id:
            raise InvalidRequest("batch_id is required")
        campaign = await self._ctx.campaign(batch.campaign_id)
        envelopes, digest = await asyncio.to_thread(_envelopes_and_digest, batch)
        if digest != batch.digest:
            raise InvalidRequest(f"batch {batch.batch_id[:80]!r}: digest does not match its reports")
        seen = await self._ctx.store.find_batch(batch.batch_id)
        if seen is not None:
            return self._duplicate(batch, seen.campaign_id, seen.digest)
        release = _release_of(batch, len(envelopes))
        # n_min applies to the release's total; it is only counted once its chunks add up to it.
        self._check_batch_size(campaign, len(envelopes) if release is None else release.messages)
        randomiser = randomiser_for(campaign)
        valid, rejected = await self._screened(campaign, randomiser, batch.batch_id, envelopes, release)
        counting = self._counting(campaign, randomiser)
        plan = await asyncio.to_thread(
            partial(
                plan_ingest,
                batch_id=batch.batch_id,
                campaign_id=campaign.id,
                digest=batch.digest,
                batch_size=len(envelopes),
                valid_reports=valid,
                rejected=rejected,
                counting=counting,
                release=release,
                min_devices=self._min_devices(campaign),
            )
        )
        outcome = await self._commit(plan)
        if outcome.duplicate_batch:
            return self._duplicate(batch, campaign.id, batch.digest)
        return self._counted(batch, campaign, outcome)

    async def _screened(
        self,
        campaign: pb.Campaign,
        randomiser: LocalRandomiser,
        batch_id: str,
        envelopes: Sequence[Envelope],
        release: ReleaseChunk | None,
    ) -> tuple[list[tuple[bytes, bytes]], dict[int, int]]:
        """(valid reports, rejections by reason): decrypted and validated, or all CAMPAIGN_CLOSED."""
        now = self._ctx.clock()
        if self._ctx.expired(campaign, now):
            # Past retention its ids may be gone: nothing can be deduplicated, so nothing counts.
            await self._ctx.store.retire_campaign(campaign.id)
            return [], {CAMPAIGN_CLOSED: len(envelopes)}
        if self._ctx.too_late(campaign, now):
            # Closed means closed: a batch after the end plus the grace counts nobody (issue 20).
            self._ctx.metrics.batch("after_close")
            return [], {CAMPAIGN_CLOSED: len(envelopes)}
        with self._ctx.metrics.decrypt_seconds.time(), self._ctx.metrics.span("aggregator.decrypt"):
            opened = await self._open(campaign, envelopes)
        valid, rejected = await asyncio.to_thread(_screen, randomiser, opened)
        if randomiser.multi_message and release is None:
            await self._check_devices(campaign, randomiser, batch_id, valid)
        return valid, rejected

    def _counting(self, campaign: pb.Campaign, randomiser: LocalRandomiser) -> Counting:
        """How the campaign's reports are counted (devices and release check for multi-message)."""
        multi = randomiser.multi_message
        return Counting(
            cells=randomiser.count_cells,
            count_cells=_counter(randomiser),
            devices=randomiser.devices if multi else None,
            check_release=self._release_check(campaign, randomiser) if multi else None,
        )

    async def _commit(self, plan: IngestPlan) -> IngestOutcome:
        """Apply the plan in one storage transaction; store refusals become request errors."""
        try:
            with self._ctx.metrics.commit_seconds.time(), self._ctx.metrics.span("aggregator.commit"):
                return await self._ctx.store.apply(plan)
        except ReleaseConflict as exc:
            self._ctx.metrics.batch("release_conflict")
            raise FailedPrecondition(str(exc)) from None
        except BelowNMin as exc:
            self._ctx.metrics.batch("below_n_min")
            raise FailedPrecondition(
                f"batch {plan.batch_id[:80]!r} is refused and nothing of it counted: it holds {exc}"
                " (duplicates, replays and undecryptable reports hide nobody) and no operator authorised"
                " a release below n_min (ReleaseBelowNMin)"
            ) from None
        except BatchConflict as exc:
            raise AlreadyExists(str(exc)) from None
        except UnknownCampaign:
            raise NotFound(f"no campaign {plan.campaign_id!r}") from None

    def _counted(
        self, batch: pb.ShuffledBatch, campaign: pb.Campaign, outcome: IngestOutcome
    ) -> pb.IngestBatchResponse:
        """Record the ingested batch in metrics and answer with what was counted and rejected
        (and whether it was counted below n_min on the operator's authority)."""
        campaign_id = campaign.id
        least = self._devices_floor(campaign)
        self._ctx.metrics.batch("ingested")
        self._ctx.last_batch[campaign_id] = self._ctx.clock()
        self._ctx.metrics.counted(outcome.counted)
        self._ctx.metrics.rejected(outcome.rejected)
        return pb.IngestBatchResponse(
            batch_id=batch.batch_id,
            duplicate_batch=False,
            counted=outcome.counted,
            devices=outcome.devices,
            below_n_min=0 < outcome.devices < least,
            rejected=[
                pb.RejectionCount(reason=reason, count=count)  # type: ignore[arg-type]
                for reason, count in sorted(outcome.rejected.items())
            ],
        )

    def _devices_floor(self, campaign: pb.Campaign) -> int:
        """n_min in devices (multi-message campaigns state n_min in messages)."""
        randomiser = randomiser_for(campaign)
        if randomiser.multi_message:
            return randomiser.devices_within(campaign.n_min)
        return campaign.n_min

    def _min_devices(self, campaign: pb.Campaign) -> int:
        """The distinct valid devices a batch must count, 0 while the operator authorises less."""
        if self._ctx.clock() < campaign.below_n_min_until_unix:
            return 0
        return self._devices_floor(campaign)

    def _check_batch_size(self, campaign: pb.Campaign, size: int) -> None:
        """Refuse a batch below n_min unless the operator authorised it (and it has not lapsed).

        An empty batch counts nobody and hides nobody: it is recorded as before.
        """
        if size == 0 or size >= campaign.n_min or self._ctx.clock() < campaign.below_n_min_until_unix:
            return
        self._ctx.metrics.batch("below_n_min")
        raise FailedPrecondition(
            f"batch of {size} reports is below the campaign's n_min ({campaign.n_min}) and no operator"
            " authorised a release below n_min (ReleaseBelowNMin)"
        )

    async def _check_devices(
        self,
        campaign: pb.Campaign,
        randomiser: LocalRandomiser,
        batch_id: str,
        valid: Sequence[tuple[bytes, bytes]],
    ) -> None:
        """Multi-message: refuse a batch that splits a device, or holds fewer than n_min devices
        (unless the operator authorised batches below n_min)."""
        counts = await asyncio.to_thread(_batch_counts, randomiser, valid)
        problem = randomiser.incomplete_batch(counts)
        if problem is not None:
            self._ctx.metrics.batch("incomplete")
            raise FailedPrecondition(f"batch {batch_id[:80]!r} is refused: {problem}")
        devices = randomiser.devices(counts, len(valid))
        least = randomiser.devices_within(campaign.n_min)
        if 0 < devices < least and self._ctx.clock() >= campaign.below_n_min_until_unix:
            self._ctx.metrics.batch("below_n_min")
            raise FailedPrecondition(
                f"batch {batch_id[:80]!r} holds {devices} devices, below the campaign's n_min ({least})"
                " and no operator authorised a release below n_min (ReleaseBelowNMin)"
            )

    def _release_check(self, campaign: pb.Campaign, randomiser: LocalRandomiser) -> ReleaseCheck:
        """Multi-message: a complete release must be whole devices, at least n_min of them."""
        least = randomiser.devices_within(campaign.n_min)
        authorised = self._ctx.clock() < campaign.below_n_min_until_unix

        def check(counts: Sequence[int], messages: int) -> str | None:
            problem = randomiser.incomplete_batch(list(counts))
            if problem is not None:
                return problem
            devices = randomiser.devices(list(counts), messages)
            if 0 < devices < least and not authorised:
                return f"it holds {devices} devices, below the campaign's n_min ({least})"
            return None

        return check

    def _duplicate(self, batch: pb.ShuffledBatch, campaign_id: str, digest: bytes) -> pb.IngestBatchResponse:
        """Acknowledge a batch seen before (same content); a reused id with new content is refused."""
        if campaign_id != batch.campaign_id or digest != batch.digest:
            raise AlreadyExists(f"batch id {batch.batch_id[:80]!r} was already used for a different batch")
        self._ctx.metrics.batch("duplicate")
        return pb.IngestBatchResponse(batch_id=batch.batch_id, duplicate_batch=True)


def _release_of(batch: pb.ShuffledBatch, size: int) -> ReleaseChunk | None:
    """The batch's place in its release (None: a batch of its own); INVALID_ARGUMENT if malformed."""
    if not batch.release_id:
        if batch.chunk_count or batch.chunk_index or batch.release_messages:
            raise InvalidRequest("chunk fields without a release_id")
        return None
    chunk = ReleaseChunk(batch.release_id, batch.chunk_index, batch.chunk_count, batch.release_messages)
    if len(batch.release_id) > 128 or (problem := chunk.problem(size)) is not None:
        raise InvalidRequest(f"batch {batch.batch_id[:80]!r}: {problem or 'release_id too long'}")
    return chunk


def _batch_counts(randomiser: LocalRandomiser, valid: Sequence[tuple[bytes, bytes]]) -> list[int]:
    """The count cells of one batch's valid messages."""
    if not valid:
        return [0] * randomiser.count_cells
    return [int(c) for c in randomiser.tally([payload for _, payload in valid]).counts]


def _counter(randomiser: LocalRandomiser) -> CountCells:
    """The randomiser's count cells for already validated payloads."""

    def count(payloads: Sequence[bytes]) -> IntArray:
        return randomiser.tally(payloads).counts

    return count


def _envelopes_and_digest(batch: pb.ShuffledBatch) -> tuple[list[Envelope], bytes]:
    """Plain (campaign, key id, ciphertext) tuples and the manifest digest they give."""
    envelopes: list[Envelope] = [(r.campaign_id, r.key_id, r.ciphertext) for r in batch.reports]
    return envelopes, batch_digest([e[2] for e in envelopes])


def _screen(
    randomiser: LocalRandomiser, opened: Sequence[Opened]
) -> tuple[list[tuple[bytes, bytes]], dict[int, int]]:
    """Split opened reports into (report id, payload) pairs to count and rejections by reason."""
    rejected: Counter[int] = Counter(reason for reason, _, _ in opened if reason != OK)
    decoded = [(report_id, payload) for reason, report_id, payload in opened if reason == OK]
    if not decoded:
        return decoded, dict(rejected)
    invalid = randomiser.tally([payload for _, payload in decoded]).invalid.tolist()
    valid = [pair for pair, bad in zip(decoded, invalid, strict=True) if not bad]
    if len(valid) != len(decoded):
        rejected[PAYLOAD_OUT_OF_DOMAIN] += len(decoded) - len(valid)
    return valid, dict(rejected)
