"""Batch policy: when a campaign's pending reports become permuted batches, and how they are split.

Privacy first: below the campaign's n_min nothing is batched unless an operator overrides it.
The only timing state is one last-arrival time per campaign, in memory; nothing per report.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from deniable.core.rng import default_rng
from deniable.shuffler.campaigns import CampaignDirectory
from deniable.shuffler.errors import Unavailable
from deniable.shuffler.segments import SegmentPaths
from deniable.shuffler.spool import Permutation, SpoolStore

log = logging.getLogger("deniable.shuffler.batcher")

MAX_BATCH_BYTES: Final = 48 * 1024 * 1024
"""Keeps a ShuffledBatch well under the 64 MiB gRPC message limit."""
_PER_REPORT_OVERHEAD: Final = 32


def chunk_sizes(pending: int, max_batch: int, n_min: int) -> list[int]:
    """Split ``pending`` into ceil(pending / max_batch) near-equal chunks, never one below n_min.

    When ``pending >= n_min`` every chunk is at least n_min (fewer, larger chunks if max_batch <
    2·n_min would otherwise break that); below n_min (operator override) chunks only respect max_batch.
    """
    if pending <= 0:
        return []
    count = math.ceil(pending / max(1, max_batch))
    if n_min > 0 and pending >= n_min:
        count = min(count, pending // n_min)
    count = max(1, count)
    base, extra = divmod(pending, count)
    return [base + 1 if i < extra else base for i in range(count)]


@dataclass(frozen=True)
class BatchingResult:
    """What one batching pass did: batches formed, reports put in them, reports left pending."""

    batches_formed: int = 0
    reports_batched: int = 0
    reports_held: int = 0


class Batcher:
    """Turns pending reports into permuted batches according to n_min, size and quiet time."""

    def __init__(
        self,
        store: SpoolStore,
        directory: CampaignDirectory,
        *,
        max_batch_reports: int = 50_000,
        quiet_s: float = 2.0,
        max_batch_bytes: int = MAX_BATCH_BYTES,
        permutation: Permutation | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``permutation`` defaults to the process CSPRNG's; tests never replace it in production code."""
        if max_batch_reports < 1:
            raise ValueError("max_batch_reports must be at least 1")
        self._store = store
        self._directory = directory
        self._max_batch_reports = max_batch_reports
        self._quiet_s = quiet_s
        self._max_batch_bytes = max_batch_bytes
        self._permutation: Permutation = permutation or default_rng().permutation
        self._clock = clock
        self._last_arrival: dict[str, float] = {}
        self._lock = asyncio.Lock()

    def note_arrival(self, campaign_id: str) -> None:
        """Record that reports of the campaign were just spooled (restarts its quiet period)."""
        self._last_arrival[campaign_id] = self._clock()

    async def run_once(
        self, *, campaign_id: str = "", flush: bool = False, below_n_min: bool = False
    ) -> BatchingResult:
        """One pass over campaigns with pending reports (only ``campaign_id`` if given).

        ``flush`` batches every campaign at or above n_min now; ``below_n_min`` also those below.
        """
        async with self._lock:
            stats = await asyncio.to_thread(self._store.stats)
            formed = batched = held = 0
            for entry in stats:
                if entry.pending == 0 or (campaign_id and entry.campaign_id != campaign_id):
                    continue
                plan = await self._plan(entry.campaign_id, entry.pending, flush, below_n_min)
                if plan is None:
                    held += entry.pending
                    continue
                if isinstance(self._store, SegmentPaths):  # sizes only: no envelope per report
                    fast = await asyncio.to_thread(
                        self._store.form_batch_sizes, entry.campaign_id, plan, self._permutation
                    )
                    formed += len(fast)
                    batched += sum(b.report_count for b in fast)
                else:
                    records = await asyncio.to_thread(
                        self._store.form_batches, entry.campaign_id, plan, self._permutation
                    )
                    formed += len(records)
                    batched += sum(len(r.reports) for r in records)
                held += await asyncio.to_thread(self._store.pending_count, entry.campaign_id)
            if formed:
                await asyncio.to_thread(self._store.scrub)
            return BatchingResult(formed, batched, held)

    async def _plan(self, campaign_id: str, pending: int, flush: bool, below_n_min: bool) -> list[int] | None:
        """Batch sizes for the campaign's pending reports, or None to hold them."""
        try:
            campaign = await self._directory.get(campaign_id)
        except Unavailable:
            campaign = None
        if campaign is None:
            log.warning(
                "holding reports of a campaign that cannot be looked up",
                extra={"campaign": campaign_id},
            )
            return None
        n_min = max(1, campaign.n_min)
        max_batch = self._max_batch_reports
        if campaign.ciphertext_length:
            per_report = campaign.ciphertext_length + _PER_REPORT_OVERHEAD
            max_batch = min(max_batch, self._max_batch_bytes // per_report)
        max_batch = max(1, max_batch)
        if pending < n_min:
            return chunk_sizes(pending, max_batch, 0) if flush and below_n_min else None
        quiet = self._clock() - self._last_arrival.get(campaign_id, -math.inf) >= self._quiet_s
        if flush or quiet or pending >= max_batch:
            return chunk_sizes(pending, max_batch, n_min)
        return None
