"""Where the shuffler learns campaigns: memory, then the spool's cache, then the aggregator.

The aggregator owns campaigns; the shuffler caches them durably so that a restart can validate
envelopes while the aggregator is down. An id is asked upstream at most once per
``refresh_interval_s`` however many requests name it, so unknown ids cannot stampede upstream;
an id the aggregator called unknown is refused locally for ``negative_ttl_s`` (bounded table).

The shuffler keeps its own floor (ADR 0032): descriptions are verified against the aggregator's
signing key when one is configured, and a description whose n_min or batch target is below the
shuffler's configured minimums, or that changes n_min or lowers the batch target while this
shuffler holds reports of the campaign, is refused and logged (the last accepted one stays).
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

from deniable.core.descriptions import CampaignSignatureError, verify_campaign, verify_key
from deniable.core.errors import Unavailable
from deniable.core.ids import valid_campaign_id
from deniable.shuffler.spool import SpoolStore
from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:
    from deniable.v1.deniable_pb2_grpc import AggregatorAsyncStub

log = logging.getLogger("deniable.shuffler.campaigns")

_MISSING_CODES: Final = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT)
_MAX_REMEMBERED_ATTEMPTS: Final = 10_000

DEFAULT_NEGATIVE_TTL_S: Final = 60.0

Outcome = Literal["found", "missing", "unavailable"]


@dataclass(frozen=True)
class Floor:
    """The shuffler's own minimums, which no campaign description can lower (ADR 0032).

    ``n_min``: devices' reports per released batch at least this many; ``batch_target``: the
    release target at least this; ``signing_key``: the aggregator's Ed25519 signing public key
    (raw or hex): descriptions that do not verify with it are refused. None: not verified (logged).
    """

    n_min: int = 1
    batch_target: int = 1
    signing_key: bytes | str | None = None

    def n_min_of(self, campaign: pb.Campaign) -> int:
        """The smallest batch this shuffler releases for ``campaign`` (operator override aside)."""
        return max(1, self.n_min, campaign.n_min)

    def target_of(self, campaign: pb.Campaign) -> int:
        """The batch target this shuffler releases ``campaign`` at."""
        return max(self.n_min_of(campaign), self.batch_target, campaign.batch_target)

    def check(self, campaign: pb.Campaign) -> str | None:
        """Why ``campaign`` on its own is refused (signature, below the floor), or None."""
        if self.signing_key is not None:
            try:
                verify_campaign(campaign, verify_key(self.signing_key))
            except CampaignSignatureError as exc:
                return f"signature: {exc}"
        if max(1, campaign.n_min) < self.n_min:
            return f"n_min {campaign.n_min} is below this shuffler's minimum {self.n_min}"
        if max(campaign.n_min, campaign.batch_target) < self.batch_target:
            return (
                f"batch target {max(campaign.n_min, campaign.batch_target)} is below this"
                f" shuffler's minimum {self.batch_target}"
            )
        return None


def change_refused(old: pb.Campaign, new: pb.Campaign) -> str | None:
    """Why ``new`` may not replace ``old`` while reports of the campaign are held, or None."""
    if new.n_min != old.n_min:
        return f"n_min changed from {old.n_min} to {new.n_min} after devices joined"
    if max(new.n_min, new.batch_target) < max(old.n_min, old.batch_target):
        return (
            f"batch target lowered from {max(old.n_min, old.batch_target)} to"
            f" {max(new.n_min, new.batch_target)} after devices joined"
        )
    return None


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
        floor: Floor | None = None,
        negative_ttl_s: float = DEFAULT_NEGATIVE_TTL_S,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        """``ttl_s``: age after which a known campaign is refreshed in the background;
        ``negative_ttl_s``: how long an id the aggregator called unknown is refused without asking;
        ``on_refused(reason)`` counts descriptions refused by ``floor``."""
        self.floor = floor or Floor()
        self._negative_ttl_s = negative_ttl_s
        self._on_refused = on_refused
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
            if cached is not None and self._refusal(cached, None, "cache") is None:
                entry = self._memory.setdefault(
                    campaign_id, _Entry(cached, cached.SerializeToString(deterministic=True), -math.inf)
                )
        if entry is not None:
            if self._clock() - entry.fetched_at >= self._ttl_s:
                self._refresh_in_background(campaign_id)
            return entry.campaign
        return await self.refresh(campaign_id)

    def known(self, campaign_id: str) -> bool | None:
        """True if the campaign is in memory, False if the aggregator recently called it unknown
        (refused locally, no upstream call), None if only a look-up can tell."""
        if campaign_id in self._memory:
            return True
        attempt = self._attempts.get(campaign_id)
        ttl = max(self._negative_ttl_s, self._refresh_interval_s)
        if attempt is not None and attempt.outcome == "missing" and self._clock() - attempt.at < ttl:
            return False
        return None

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
        """Relay ListCampaigns from upstream (caching them), only descriptions the floor accepts
        (pinned copies where a change was refused); the cached campaigns if it is down."""
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
        kept = []  # relay (and announce over MQTT) only what this shuffler accepted, pinned copies
        for campaign in response.campaigns:
            if valid_campaign_id(campaign.id) and await self._remember(campaign):
                kept.append(self._memory[campaign.id].campaign)
        return pb.ListCampaignsResponse(campaigns=kept)

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
        if attempt is None:
            return None
        ttl = self._refresh_interval_s
        if attempt.outcome == "missing" and campaign_id not in self._memory:
            ttl = max(ttl, self._negative_ttl_s)  # known unknown: refused locally for a while
        return attempt if self._clock() - attempt.at < ttl else None

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
                outcome = "found" if await self._remember(campaign) else "missing"
            else:
                log.warning("upstream answered GetCampaign with another campaign")
                outcome = "unavailable"
        self._attempts[campaign_id] = _Attempt(self._clock(), outcome)
        self._attempts.move_to_end(campaign_id)
        while len(self._attempts) > _MAX_REMEMBERED_ATTEMPTS:
            self._attempts.popitem(last=False)
        return outcome

    async def _remember(self, campaign: pb.Campaign) -> bool:
        """Keep ``campaign`` unless the floor refuses it (then the last accepted copy stays)."""
        blob = campaign.SerializeToString(deterministic=True)
        old = self._memory.get(campaign.id)
        if old is not None and old.blob == blob:
            old.fetched_at = self._clock()
            return True
        held = False
        if old is not None and change_refused(old.campaign, campaign) is not None:
            held = await asyncio.to_thread(self._store.pending_count, campaign.id) > 0
        if self._refusal(campaign, old.campaign if held and old else None, "upstream") is not None:
            if old is not None:
                old.fetched_at = self._clock()  # keep the pinned copy; ask again only after the ttl
                return True
            return False
        await asyncio.to_thread(self._store.cache_campaign, campaign)
        self._memory[campaign.id] = _Entry(campaign, blob, self._clock())
        return True

    def _refusal(self, campaign: pb.Campaign, pinned: pb.Campaign | None, origin: str) -> str | None:
        """Why the description is refused (logged and counted), or None to accept it."""
        reason = self.floor.check(campaign)
        if reason is None and pinned is not None:
            reason = change_refused(pinned, campaign)
        if reason is not None:
            log.warning(
                "campaign description refused: %s",
                reason,
                extra={"campaign": campaign.id[:80], "origin": origin},
            )
            if self._on_refused is not None:
                self._on_refused(reason.split(" ", 1)[0].rstrip(":"))
        return reason


def _log_failure(task: asyncio.Task[Outcome]) -> None:
    """Retrieve and log a look-up's unexpected exception (asyncio would otherwise warn at exit)."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("campaign look-up failed", exc_info=exc)
