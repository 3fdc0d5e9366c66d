"""Batch policy: when a campaign's pending reports become permuted batches, and how they are split.

A campaign is released when its batch target is reached, when its window closes (if at least
n_min are held; otherwise they stay held and the operator is told), or when the operator forces
it. Never on a quiet period, and never below n_min without the operator's override. A campaign
whose requests must stay whole (multi-message) is released as whole requests (ADR 0014); a release
is one permutation cut into chunks that fit the byte limit (ADR 0023).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from deniable.core.errors import Unavailable
from deniable.core.rng import default_rng
from deniable.shuffler.campaigns import CampaignDirectory
from deniable.shuffler.metrics import ShufflerMetrics
from deniable.shuffler.spool import Permutation, SpoolStore
from deniable.v1 import deniable_pb2 as pb

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
    """What one batching pass did: batches formed, reports put in them, reports left pending,
    and campaigns whose window closed with fewer than n_min held (id, pending, n_min)."""

    batches_formed: int = 0
    reports_batched: int = 0
    reports_held: int = 0
    window_held: tuple[tuple[str, int, int], ...] = ()


@dataclass(frozen=True)
class _Plan:
    sizes: list[int]
    whole: bool
    cause: str


class Batcher:
    """Turns pending reports into permuted batches at the batch target, window close or on demand."""

    def __init__(
        self,
        store: SpoolStore,
        directory: CampaignDirectory,
        *,
        max_batch_reports: int = 50_000,
        max_batch_bytes: int = MAX_BATCH_BYTES,
        permutation: Permutation | None = None,
        wall_clock: Callable[[], float] = time.time,
        metrics: ShufflerMetrics | None = None,
    ) -> None:
        """``permutation`` defaults to the process CSPRNG's; ``wall_clock`` (Unix s) decides windows."""
        if max_batch_reports < 1:
            raise ValueError("max_batch_reports must be at least 1")
        self._store = store
        self._directory = directory
        self._max_batch_reports = max_batch_reports
        self._max_batch_bytes = max_batch_bytes
        self._permutation: Permutation = permutation or default_rng().permutation
        self._wall_clock = wall_clock
        self._metrics = metrics
        self._held_logged: set[str] = set()
        self._lock = asyncio.Lock()

    async def run_once(
        self, *, campaign_id: str = "", flush: bool = False, below_n_min: bool = False
    ) -> BatchingResult:
        """One pass over campaigns with pending reports (only ``campaign_id`` if given).

        ``flush`` (operator) batches every campaign at or above n_min now; ``below_n_min`` also those below.
        """
        async with self._lock:
            stats = await asyncio.to_thread(self._store.stats)
            formed = batched = held = 0
            window_held: list[tuple[str, int, int]] = []
            for entry in stats:
                if entry.pending == 0 or (campaign_id and entry.campaign_id != campaign_id):
                    continue
                plan = await self._plan(entry.campaign_id, entry.pending, flush, below_n_min, window_held)
                if plan is None:
                    held += entry.pending
                    continue
                count, reports = await self._form(entry.campaign_id, plan)
                formed += count
                batched += reports
                if count and self._metrics is not None:
                    self._metrics.releases.labels(cause=plan.cause).inc()
                held += await asyncio.to_thread(self._store.pending_count, entry.campaign_id)
            if formed:
                await asyncio.to_thread(self._store.scrub)
            if self._metrics is not None and not campaign_id:
                self._metrics.window_held.set(sum(pending for _, pending, _ in window_held))
            return BatchingResult(formed, batched, held, tuple(window_held))

    async def _form(self, campaign_id: str, plan: _Plan) -> tuple[int, int]:
        """Form the planned batches (sizes only: no envelope per report); (batches, reports) formed."""
        formed = await asyncio.to_thread(
            self._store.form_batch_sizes, campaign_id, plan.sizes, self._permutation, plan.whole
        )
        return len(formed), sum(b.report_count for b in formed)

    async def _plan(
        self,
        campaign_id: str,
        pending: int,
        flush: bool,
        below_n_min: bool,
        window_held: list[tuple[str, int, int]],
    ) -> _Plan | None:
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
        floor = self._directory.floor  # the shuffler's own minimums (ADR 0032)
        n_min = floor.n_min_of(campaign)
        target = floor.target_of(campaign)
        closed = campaign.closed or bool(
            campaign.window_end_unix and self._wall_clock() >= campaign.window_end_unix
        )
        if pending < n_min:
            if flush and below_n_min:
                return await self._sizes(campaign, pending, 1, "operator_below_n_min")
            if closed:
                window_held.append((campaign_id, pending, n_min))
                self._tell_held(campaign_id, pending, n_min)
            return None
        if pending >= target:
            return await self._sizes(campaign, pending, target, "target")
        # Below the target: batches as large as what is held (and the byte limit) allows.
        if closed:
            return await self._sizes(campaign, pending, pending, "window")
        if flush:
            log.warning(
                "operator released a batch below the campaign's batch target",
                extra={"campaign": campaign_id, "pending": pending, "target": target},
            )
            return await self._sizes(campaign, pending, pending, "operator")
        return None

    def _tell_held(self, campaign_id: str, pending: int, n_min: int) -> None:
        """Log once per campaign that its window closed with too few reports to release."""
        if campaign_id in self._held_logged:
            return
        self._held_logged.add(campaign_id)
        log.warning(
            "window closed with fewer than n_min reports: holding them (operator: flush --below-n-min"
            " after authorising it at the aggregator, or leave them)",
            extra={"campaign": campaign_id, "pending": pending, "n_min": n_min},
        )

    def _limits(self, campaign: pb.Campaign, floor: int) -> tuple[int, int]:
        """(reports per batch, smallest batch): the configured cap raised to ``floor`` where the
        byte limit allows; the floor lowered to the byte limit, but never below n_min."""
        byte_cap = 2**63
        if campaign.ciphertext_length:
            byte_cap = self._max_batch_bytes // (campaign.ciphertext_length + _PER_REPORT_OVERHEAD)
        floor = max(min(floor, byte_cap), self._directory.floor.n_min_of(campaign))
        return max(1, min(max(self._max_batch_reports, floor), byte_cap)), floor

    async def _sizes(self, campaign: pb.Campaign, pending: int, floor: int, cause: str) -> _Plan:
        """Chunks of at least ``floor`` (when ``pending`` allows); whole requests where required."""
        max_batch, floor = self._limits(campaign, floor)
        if campaign.keep_requests_whole:
            # Every pending request, as one release: one permutation cut into chunks under the
            # byte limit, anywhere (the aggregator counts the release whole; ADR 0023).
            return _Plan(chunk_sizes(pending, max_batch, 1), True, cause)
        return _Plan(chunk_sizes(pending, max_batch, floor), False, cause)
