"""Where the shuffler learns campaigns: memory, then the spool's cache, then the aggregator.

The aggregator owns campaigns; the shuffler caches them durably so that a restart can validate
envelopes while the aggregator is down. An id is asked upstream at most once per
``refresh_interval_s`` however many requests name it, so unknown ids cannot stampede upstream.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

import grpc

from deniable.core.errors import Unavailable
from deniable.core.ids import valid_campaign_id
from deniable.shuffler.spool import SpoolStore
from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:
    from deniable.v1.deniable_pb2_grpc import AggregatorAsyncStub

log = logging.getLogger("deniable.shuffler.campaigns")

_MISSING_CODES: Final = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT)
_MAX_REMEMBERED_ATTEMPTS: Final = 10_000

Outcome = Literal["found", "missing", "unavailable"]


@dataclass
class _Entry:
    campaign: pb.Campaign
    blob: bytes
    fetched_at: float


@dataclass
class _Attempt:
    at: float
    outcome: Outcome


class CampaignDirectory:
    """Campaign look-ups with a memory cache, a durable cache in the spool and rate-limited refresh."""

    def __init__(
        self,
        store: SpoolStore,
        upstream: AggregatorAsyncStub,
        *,
        deadline_s: float = 2.0,
        refresh_interval_s: float = 5.0,
        ttl_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``ttl_s``: age after which a known campaign is refreshed in the background."""
        self._store = store
        self._upstream = upstream
        self._deadline_s = deadline_s
        self._refresh_interval_s = refresh_interval_s
        self._ttl_s = ttl_s
        self._clock = clock
        self._memory: dict[str, _Entry] = {}
        self._attempts: OrderedDict[str, _Attempt] = OrderedDict()
        self._inflight: dict[str, asyncio.Task[Outcome]] = {}
        self._background: set[asyncio.Task[Outcome]] = set()

    async def get(self, campaign_id: str) -> pb.Campaign | None:
        """The campaign, None if the aggregator does not know it; Unavailable if nobody can tell."""
        if not valid_campaign_id(campaign_id):
            return None
        entry = self._memory.get(campaign_id)
        if entry is None:
            cached = await asyncio.to_thread(self._store.cached_campaign, campaign_id)
            if cached is not None:
                entry = self._memory.setdefault(
                    campaign_id, _Entry(cached, cached.SerializeToString(deterministic=True), -math.inf)
                )
        if entry is not None:
            if self._clock() - entry.fetched_at >= self._ttl_s:
                self._refresh_in_background(campaign_id)
            return entry.campaign
        return await self.refresh(campaign_id)

    async def refresh(self, campaign_id: str, *, force: bool = False) -> pb.Campaign | None:
        """Ask upstream (unless asked within the refresh interval, or ``force``: operator calls);
        the best known campaign or None. Raises Unavailable only when upstream is unreachable and
        no copy is known.
        """
        if not valid_campaign_id(campaign_id):
            return None
        if force:
            self._attempts.pop(campaign_id, None)
        outcome = await self._fetch_once(campaign_id)
        entry = self._memory.get(campaign_id)
        if entry is not None:
            return entry.campaign
        if outcome == "unavailable":
            raise Unavailable("the aggregator is unreachable and the campaign is not cached; retry later")
        return None

    async def list(self) -> pb.ListCampaignsResponse:
        """Relay ListCampaigns from upstream (caching them); the cached campaigns if it is down."""
        try:
            response: pb.ListCampaignsResponse = await self._upstream.ListCampaigns(
                pb.ListCampaignsRequest(), timeout=self._deadline_s
            )
        except grpc.aio.AioRpcError as exc:
            log.warning("upstream ListCampaigns failed, serving the cache", extra={"code": exc.code().name})
            cached = await asyncio.to_thread(self._store.cached_campaigns)
            if not cached:
                raise Unavailable("the aggregator is unreachable and no campaign is cached") from exc
            return pb.ListCampaignsResponse(campaigns=cached)
        for campaign in response.campaigns:
            if valid_campaign_id(campaign.id):
                await self._remember(campaign)
        return response

    async def close(self) -> None:
        """Cancel background refreshes."""
        tasks = list(self._background) + list(self._inflight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _refresh_in_background(self, campaign_id: str) -> None:
        if campaign_id in self._inflight or self._recent_attempt(campaign_id) is not None:
            return
        task = asyncio.ensure_future(self._fetch_once(campaign_id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_log_failure)

    def _recent_attempt(self, campaign_id: str) -> _Attempt | None:
        attempt = self._attempts.get(campaign_id)
        if attempt is not None and self._clock() - attempt.at < self._refresh_interval_s:
            return attempt
        return None

    async def _fetch_once(self, campaign_id: str) -> Outcome:
        recent = self._recent_attempt(campaign_id)
        if recent is not None:
            return recent.outcome
        task = self._inflight.get(campaign_id)
        if task is None:
            task = asyncio.ensure_future(self._fetch(campaign_id))
            self._inflight[campaign_id] = task
            task.add_done_callback(lambda _: self._inflight.pop(campaign_id, None))
            task.add_done_callback(_log_failure)
        return await asyncio.shield(task)

    async def _fetch(self, campaign_id: str) -> Outcome:
        outcome: Outcome
        try:
            campaign: pb.Campaign = await self._upstream.GetCampaign(
                pb.GetCampaignRequest(campaign_id=campaign_id), timeout=self._deadline_s
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() in _MISSING_CODES:
                outcome = "missing"
            else:
                log.warning("upstream GetCampaign failed", extra={"code": exc.code().name})
                outcome = "unavailable"
        else:
            if campaign.id == campaign_id:
                await self._remember(campaign)
                outcome = "found"
            else:
                log.warning("upstream answered GetCampaign with another campaign")
                outcome = "unavailable"
        self._attempts[campaign_id] = _Attempt(self._clock(), outcome)
        self._attempts.move_to_end(campaign_id)
        while len(self._attempts) > _MAX_REMEMBERED_ATTEMPTS:
            self._attempts.popitem(last=False)
        return outcome

    async def _remember(self, campaign: pb.Campaign) -> None:
        blob = campaign.SerializeToString(deterministic=True)
        old = self._memory.get(campaign.id)
        if old is None or old.blob != blob:
            await asyncio.to_thread(self._store.cache_campaign, campaign)
        self._memory[campaign.id] = _Entry(campaign, blob, self._clock())


def _log_failure(task: asyncio.Task[Outcome]) -> None:
    """Retrieve and log a look-up's unexpected exception (asyncio would otherwise warn at exit)."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("campaign look-up failed", exc_info=exc)
