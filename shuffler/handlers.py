"""The shuffler's request handlers: protobuf in, protobuf out, domain errors; no gRPC context.

Only the envelope is checked (campaign, key id, ciphertext length, window): the shuffler never
decrypts. Accepted reports are spooled in one durable transaction before the response exists.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from google.protobuf.message import DecodeError

from deniable.core.errors import InvalidRequest, NotFound, QuotaExceeded, RequestRefused, Unavailable
from deniable.core.ids import valid_campaign_id
from deniable.core.plumbing.metrics import reason_label
from deniable.shuffler.batcher import Batcher
from deniable.shuffler.campaigns import CampaignDirectory
from deniable.shuffler.columns import ColumnReports
from deniable.shuffler.forwarder import Pipeline
from deniable.shuffler.metrics import ShufflerMetrics
from deniable.shuffler.quota import LookupBudget, SourceKeys, SourceQuota
from deniable.shuffler.rawsubmit import RawSubmit
from deniable.shuffler.spool import SpoolStore
from deniable.v1 import deniable_pb2 as pb

log = logging.getLogger("deniable.shuffler")

__all__ = ["InvalidRequest", "NotFound", "RequestRefused", "ShufflerHandlers", "Unavailable"]

DEFAULT_MAX_REPORTS_PER_REQUEST: Final = 10_000
MAX_CAMPAIGNS_PER_REQUEST: Final = 256
"""Bounds the campaign look-ups one request can cause."""


def _campaign_label(campaign_id: str) -> str:
    """The id for a rejection detail, only when it has the contract's shape (never echo junk)."""
    return repr(campaign_id) if valid_campaign_id(campaign_id) else "(malformed id)"


def check_envelope(
    report: pb.EncryptedReport, campaign: pb.Campaign | None, now_unix: float
) -> tuple[pb.RejectReason.ValueType, str] | None:
    """Why the envelope is refused (reason, detail), or None to accept it."""
    if campaign is None:
        return pb.UNKNOWN_CAMPAIGN, f"campaign {_campaign_label(report.campaign_id)} is not known"
    if report.key_id != campaign.key_id:
        return pb.UNKNOWN_KEY_ID, f"key id {report.key_id} is not the campaign's key id {campaign.key_id}"
    if len(report.ciphertext) != campaign.ciphertext_length:
        return (
            pb.WRONG_CIPHERTEXT_LENGTH,
            f"ciphertext is {len(report.ciphertext)} bytes, the campaign's is {campaign.ciphertext_length}",
        )
    if campaign.window_end_unix and now_unix >= campaign.window_end_unix:
        return pb.CAMPAIGN_CLOSED, "the campaign's collection window has ended"
    return None


class ShufflerHandlers:
    """Submit, flush, campaign relay and stats, over a spool store, a directory and the pipeline."""

    def __init__(
        self,
        store: SpoolStore,
        directory: CampaignDirectory,
        batcher: Batcher,
        pipeline: Pipeline,
        metrics: ShufflerMetrics,
        *,
        max_reports_per_request: int = DEFAULT_MAX_REPORTS_PER_REQUEST,
        wall_clock: Callable[[], float] = time.time,
        quota: SourceQuota | None = None,
        lookups: LookupBudget | None = None,
    ) -> None:
        """``wall_clock`` (Unix seconds) decides whether a campaign window has ended; ``quota``
        limits what one source may spool (None: no limit); ``lookups`` bounds the upstream
        campaign look-ups one request and one source may cause (default: LookupBudget())."""
        self.lookups = lookups or LookupBudget()
        self.store = store
        self.directory = directory
        self._batcher = batcher
        self._pipeline = pipeline
        self._metrics = metrics
        self._max_reports = max_reports_per_request
        self._wall_clock = wall_clock
        self.quota = quota
        self.spool_failure: str | None = None
        """Why the last spool write failed; health clears it once a probe write succeeds."""

    async def submit(
        self, request: pb.SubmitReportsRequest | RawSubmit, source: SourceKeys = ()
    ) -> pb.SubmitReportsResponse:
        """Validate every envelope, spool the accepted ones durably, list the rejected ones.

        The checks are those of ``check_envelope``, made once per campaign and then as plain
        comparisons per report; a rejected report gets ``check_envelope``'s reason and detail.
        A request still in bytes (``RawSubmit``) whose reports all fit one campaign is accepted
        without parsing it report by report; any other goes the general way. The accepted reports
        count against ``source``'s quota: over it, QuotaExceeded and nothing is spooled.
        """
        if isinstance(request, RawSubmit):
            uniform = await self._submit_uniform(request, source)
            if uniform is not None:
                return uniform
            request = _parsed(request)
        reports = request.reports
        campaign_ids, distinct = self._check_shape(reports)
        campaigns = await self._campaigns_with_current_keys(
            distinct, campaign_ids, [r.key_id for r in reports], _Spent(source)
        )
        now = self._wall_clock()
        accepted, response = _sort_reports(
            reports, campaign_ids, campaigns, _expectations(campaigns, now), now
        )
        columns = ColumnReports([(c, keys, texts) for c, (keys, texts) in accepted.items()])
        demand = {c: len(keys) for c, (keys, _) in accepted.items()}
        await self._spool(columns, source, demand, campaigns)
        response.accepted = len(columns)
        self._count(response)
        return response

    def _check_shape(self, reports: Sequence[pb.EncryptedReport]) -> tuple[list[str], set[str]]:
        """(campaign id of each report, distinct ids); InvalidRequest if empty or too large."""
        if not reports:
            raise InvalidRequest("the request holds no reports")
        if len(reports) > self._max_reports:
            raise InvalidRequest(f"{len(reports)} reports in one request; at most {self._max_reports}")
        campaign_ids = [r.campaign_id for r in reports]
        first = campaign_ids[0]
        distinct = {first} if campaign_ids.count(first) == len(campaign_ids) else set(campaign_ids)
        if len(distinct) > MAX_CAMPAIGNS_PER_REQUEST:
            raise InvalidRequest(
                f"{len(distinct)} campaigns in one request; at most {MAX_CAMPAIGNS_PER_REQUEST}"
            )
        return campaign_ids, distinct

    async def _campaigns_with_current_keys(
        self, distinct: set[str], campaign_ids: list[str], key_ids: list[int], spent: _Spent
    ) -> dict[str, pb.Campaign | None]:
        """The campaigns; one whose cached key id some report does not match (a rotation?) refreshed
        once (rate-limited by the directory, and within the request's look-up budget)."""
        campaigns = await self._resolve(distinct, spent)
        expected_key = {c: campaign.key_id for c, campaign in campaigns.items() if campaign is not None}
        if len(distinct) == 1:
            first = campaign_ids[0]
            want_key = expected_key.get(first)
            mismatch = want_key is not None and key_ids.count(want_key) != len(key_ids)
            rotated = {first} if mismatch else set()
        else:
            rotated = {
                c
                for c, k in zip(campaign_ids, key_ids, strict=True)
                if c in expected_key and k != expected_key[c]
            }
        for campaign_id in sorted(rotated):
            if self._may_look_up(spent):
                campaigns[campaign_id] = await self.directory.refresh(campaign_id)
        return campaigns

    def _may_look_up(self, spent: _Spent) -> bool:
        """Whether this request may ask upstream once more (per request, then per source)."""
        if spent.count >= self.lookups.per_request:
            self._metrics.lookups_refused.labels(reason="per_request").inc()
            return False
        if not self.lookups.take(spent.source):
            self._metrics.lookups_refused.labels(reason="per_source").inc()
            return False
        spent.count += 1
        return True

    async def _look_up(self, campaign_id: str, spent: _Spent) -> pb.Campaign | None:
        """The campaign if known, or looked up within the budget; None: unknown or not asked."""
        known = self.directory.known(campaign_id)
        if known is False:
            self._metrics.lookups_refused.labels(reason="known_unknown").inc()
            return None
        if known is None and not self._may_look_up(spent):
            return None
        return await self.directory.get(campaign_id)

    def _count(self, response: pb.SubmitReportsResponse) -> None:
        """Accepted and rejected (by reason) reports in the metrics."""
        self._metrics.reports_accepted.inc(response.accepted)
        for reason, rejected in Counter(r.reason for r in response.rejected).items():
            self._metrics.reports_rejected.labels(reason=reason_label(reason)).inc(rejected)

    async def _spool(
        self,
        columns: ColumnReports,
        source: SourceKeys,
        demand: dict[str, int],
        campaigns: Mapping[str, pb.Campaign | None],
    ) -> None:
        """Charge ``source``'s quota, then append durably; a failed append gives the charge back."""
        quota = self.quota if source and demand else None
        if quota is not None:
            limits = {c: quota.limit(campaign) for c, campaign in campaigns.items() if campaign}
            try:
                quota.charge(source, demand, limits)
            except QuotaExceeded:
                self._metrics.quota_refusals.inc()
                raise
        try:
            await self._append(columns)
        except BaseException:
            if quota is not None:
                quota.refund(source, demand)
            raise

    async def _append(self, columns: ColumnReports) -> None:
        """Append durably; a write that fails (disk full) is UNAVAILABLE and marks the spool unwritable."""
        try:
            with self._metrics.commit_seconds.time():
                await asyncio.to_thread(self.store.append, columns)
        except (OSError, sqlite3.Error) as exc:
            self.spool_failure = f"the spool cannot be written: {type(exc).__name__}: {str(exc)[:200]}"
            log.error("%s", self.spool_failure)
            self._metrics.spool_write_failures.inc()
            raise Unavailable("the spool cannot be written now; nothing was accepted, retry later") from None

    async def _submit_uniform(
        self, request: RawSubmit, source: SourceKeys
    ) -> pb.SubmitReportsResponse | None:
        """Accept a request of one campaign's well-formed reports as columns; None: not that shape.

        Same checks as the general path (known campaign, its key id and ciphertext length, open
        window, at most ``max_reports``), decided once for the whole request.
        """
        shape = request.uniform()
        if shape is None:
            return None
        campaign_id, key_id, columns = shape
        if not valid_campaign_id(campaign_id) or columns.count > self._max_reports:
            return None  # the general path refuses it with its own words
        if self.directory.known(campaign_id) is not True:
            return None  # the general path looks it up within the budget
        try:
            campaign = await self.directory.get(campaign_id)
        except Unavailable:
            return None  # the general path decides (and raises) as before
        if (
            campaign is None
            or key_id != campaign.key_id
            or int(columns.lengths[0]) != campaign.ciphertext_length
            or (campaign.window_end_unix and self._wall_clock() >= campaign.window_end_unix)
        ):
            return None
        await self._spool(
            ColumnReports.of(campaign_id, columns),
            source,
            {campaign_id: columns.count},
            {campaign_id: campaign},
        )
        self._metrics.reports_accepted.inc(columns.count)
        return pb.SubmitReportsResponse(accepted=columns.count)

    async def _resolve(self, campaign_ids: set[str], spent: _Spent) -> dict[str, pb.Campaign | None]:
        """Look every distinct campaign up (within the budget: ids past it count as unknown);
        Unavailable if any asked cannot be decided."""
        ids = sorted(campaign_ids)
        found = await asyncio.gather(*(self._look_up(c, spent) for c in ids), return_exceptions=True)
        result: dict[str, pb.Campaign | None] = {}
        for campaign_id, outcome in zip(ids, found, strict=True):
            if isinstance(outcome, BaseException):
                raise outcome
            result[campaign_id] = outcome
        return result

    async def flush(self, campaign_id: str = "", below_n_min: bool = False) -> pb.FlushResponse:
        """Batch and forward now; below n_min only with the operator override.

        A named campaign is looked up afresh first, so a window the operator just closed is seen.
        """
        if campaign_id:
            await self.directory.refresh(campaign_id, force=True)
        return await self._pipeline.flush(campaign_id, below_n_min)

    async def get_campaign(self, campaign_id: str, source: SourceKeys = ()) -> pb.Campaign:
        """Relay one campaign (cached or from the aggregator); NotFound if it does not exist (or
        recently did not); QuotaExceeded if ``source`` is over its upstream look-up budget."""
        unknown = self.directory.known(campaign_id) is None and valid_campaign_id(campaign_id)
        if unknown and not self._may_look_up(_Spent(source)):
            raise QuotaExceeded("too many campaign look-ups from this source; retry in a few seconds")
        campaign = await self.directory.get(campaign_id)
        if campaign is None:
            raise NotFound(f"campaign {_campaign_label(campaign_id)} does not exist")
        return campaign

    async def list_campaigns(self) -> pb.ListCampaignsResponse:
        """Relay the aggregator's campaigns (the cached ones while it is unreachable)."""
        return await self.directory.list()

    async def stats(self) -> pb.ShufflerStatsResponse:
        """Pending and in-flight report counts per campaign."""
        stats = await asyncio.to_thread(self.store.stats)
        return pb.ShufflerStatsResponse(
            campaigns=[
                pb.CampaignSpool(campaign_id=s.campaign_id, pending=s.pending, in_flight=s.in_flight)
                for s in stats
            ]
        )


class _Spent:
    """Upstream look-ups one request has caused so far, and its source."""

    __slots__ = ("count", "source")

    def __init__(self, source: SourceKeys) -> None:
        self.source = source
        self.count = 0


def _parsed(request: RawSubmit) -> pb.SubmitReportsRequest:
    """The request parsed report by report; InvalidRequest if it is not a SubmitReportsRequest."""
    try:
        return request.parsed
    except DecodeError:
        raise InvalidRequest("the request is not a SubmitReportsRequest") from None


def _expectations(
    campaigns: Mapping[str, pb.Campaign | None], now: float
) -> dict[str, tuple[int, int] | None]:
    """Per campaign once: (key id, ciphertext length) every report must have, or None if refused."""
    expected: dict[str, tuple[int, int] | None] = {}
    for campaign_id, campaign in campaigns.items():
        closed = campaign is not None and bool(campaign.window_end_unix) and now >= campaign.window_end_unix
        expected[campaign_id] = (
            None if campaign is None or closed else (campaign.key_id, campaign.ciphertext_length)
        )
    return expected


def _sort_reports(
    reports: Sequence[pb.EncryptedReport],
    campaign_ids: list[str],
    campaigns: Mapping[str, pb.Campaign | None],
    expected: Mapping[str, tuple[int, int] | None],
    now: float,
) -> tuple[dict[str, tuple[list[int], list[bytes]]], pb.SubmitReportsResponse]:
    """(accepted key ids and ciphertexts per campaign, a response listing the rejected ones)."""
    key_ids = [r.key_id for r in reports]
    ciphertexts = [r.ciphertext for r in reports]
    response = pb.SubmitReportsResponse()
    first = campaign_ids[0]
    only = expected.get(first) if len(expected) == 1 else None  # one campaign in the request
    if (
        only is not None
        and key_ids.count(only[0]) == len(key_ids)
        and set(map(len, ciphertexts)) == {only[1]}
    ):
        return {first: (key_ids, ciphertexts)}, response  # the usual request: every report fits
    accepted: dict[str, tuple[list[int], list[bytes]]] = {}
    for index, (campaign_id, key_id, ciphertext) in enumerate(
        zip(campaign_ids, key_ids, ciphertexts, strict=True)
    ):
        want = expected[campaign_id]
        if want is not None and key_id == want[0] and len(ciphertext) == want[1]:
            keys, texts = accepted.setdefault(campaign_id, ([], []))
            keys.append(key_id)
            texts.append(ciphertext)
            continue
        verdict = check_envelope(reports[index], campaigns[campaign_id], now)
        assert verdict is not None
        response.rejected.add(index=index, reason=verdict[0], detail=verdict[1])
    return accepted, response
