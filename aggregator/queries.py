"""Queries: debiased estimates with confidence intervals, the privacy statement that holds for
what was counted, and the manipulation budget (how far fake reports could move an estimate)."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from typing import Final

import numpy as np

from deniable.aggregator import postprocess
from deniable.aggregator.context import HandlerContext
from deniable.aggregator.store import (
    CampaignCounts,
    UnknownCampaign,
)
from deniable.core.amplification.shuffle import LOCAL_ONLY
from deniable.core.campaigns import randomiser_for
from deniable.core.errors import (
    FailedPrecondition,
    InvalidRequest,
    NotFound,
)
from deniable.core.mechanisms import LocalRandomiser, manipulation
from deniable.core.mechanisms.base import Estimate
from deniable.v1 import deniable_pb2 as pb

log = logging.getLogger("deniable.aggregator")

DEFAULT_CONFIDENCE: Final = 0.95


def manipulation_budget(
    randomiser: LocalRandomiser, counts: Sequence[int], n: int, fake_reports: int = 0
) -> pb.ManipulationBudget:
    """How far m fake well-formed reports could move each estimate (m given, or by the documented rule)."""
    m = fake_reports or manipulation.default_fake_reports(n)
    rule = manipulation.OPERATOR_RULE if fake_reports else manipulation.DEFAULT_RULE
    if randomiser.manipulation_unbounded:
        return pb.ManipulationBudget(
            fake_reports=m, rule=rule, computed=False, note=randomiser.manipulation_unbounded
        )
    state = manipulation.threshold_shift(randomiser, counts, n, m)
    if state is not None:
        return _stated_budget(m, rule, state[0], state[1], manipulation.THRESHOLD_NOTE)
    shift = manipulation.report_shift(randomiser, counts, n)
    if shift is None:
        return pb.ManipulationBudget(
            fake_reports=m,
            rule=rule,
            computed=False,
            note="not derived for this mechanism or domain size (docs/queries.md)",
        )
    up, down = shift.for_reports(m)
    total = manipulation.ReportShift(raise_per_report=up, lower_per_report=down)
    return _stated_budget(m, rule, total, shift, "")


def _stated_budget(
    m: int, rule: str, total: manipulation.ReportShift, single: manipulation.ReportShift, note: str
) -> pb.ManipulationBudget:
    """The budget message: shifts for all m fakes and for one."""
    return pb.ManipulationBudget(
        fake_reports=m,
        rule=rule,
        max_raise=total.raise_per_report.tolist(),
        max_lower=total.lower_per_report.tolist(),
        raise_per_report=single.raise_per_report.tolist(),
        lower_per_report=single.lower_per_report.tolist(),
        computed=True,
        note=note,
    )


def target_devices(campaign: pb.Campaign) -> int:
    """The batch target in devices (``Campaign.batch_target`` counts messages; 0 if unset)."""
    return randomiser_for(campaign).devices_within(int(campaign.batch_target))


def _batch_notes(campaign: pb.Campaign, smallest_batch: int, target: int) -> list[str]:
    """What the statement must say about how the batches were released."""
    notes = []
    if target and smallest_batch < target:
        notes.append(
            f"the smallest batch ({smallest_batch} devices) is below the campaign's batch target"
            f" ({target}): released at the window's close or forced by the operator"
        )
    if campaign.below_n_min_until_unix:
        notes.append("the operator authorised batches below n_min for this campaign")
    return notes


def privacy_statement(
    campaign: pb.Campaign, n: int, smallest_batch: int, batches: int = 0
) -> pb.PrivacyStatement:
    """The guarantee for the counted reports: central (epsilon, delta) at the smallest shuffle."""
    randomiser = randomiser_for(campaign)
    target = target_devices(campaign)
    local = campaign.epsilon0 if randomiser.local_privacy else 0.0
    if n == 0 or smallest_batch == 0:
        return pb.PrivacyStatement(
            batch_target=target,
            below_n_min_authorised=bool(campaign.below_n_min_until_unix),
            epsilon0=campaign.epsilon0,
            central_epsilon=campaign.epsilon0,
            delta=0.0,
            analysis=LOCAL_ONLY,
            amplified=False,
            smallest_batch=0,
            note=(
                "nothing counted yet; every report will carry the local guarantee"
                if randomiser.local_privacy
                else "nothing counted yet; shuffle-only: epsilon0 is the central target, no local guarantee"
            ),
            local_guarantee=randomiser.local_privacy,
            local_epsilon=local,
        )
    bound = randomiser.central_guarantee(smallest_batch, campaign.delta)
    note = "; ".join(filter(None, [bound.note, *_batch_notes(campaign, smallest_batch, target)]))
    unavailable = ""
    if not math.isfinite(bound.epsilon):
        unavailable = bound.note or f"{bound.analysis} gives no finite epsilon at n = {smallest_batch}"
    return pb.PrivacyStatement(
        batch_target=target,
        batches=batches,
        below_n_min_authorised=bool(campaign.below_n_min_until_unix),
        epsilon_unavailable=unavailable,
        local_guarantee=randomiser.local_privacy,
        local_epsilon=local,
        epsilon0=campaign.epsilon0,
        central_epsilon=bound.epsilon,
        delta=bound.delta,
        analysis=bound.analysis,
        amplified=bound.amplified,
        smallest_batch=smallest_batch,
        note=note,
        evaluated_n=bound.evaluated_n,
    )


class QueryHandlers:
    """``BinarySum`` and ``Histogram``."""

    def __init__(self, ctx: HandlerContext) -> None:
        """Read counts through the shared ``ctx``."""
        self._ctx = ctx

    async def query(self, request: pb.QueryRequest, binary: bool) -> pb.QueryResponse:
        """Debiased estimates with confidence intervals, and the privacy guarantee that holds."""
        confidence = _confidence(request)
        campaign = await self._ctx.campaign(request.campaign_id)
        if binary and campaign.kind != pb.BINARY:
            raise FailedPrecondition(f"campaign {campaign.id} is categorical: use Histogram, not BinarySum")
        options = _post_processing(request, len(campaign.labels))
        randomiser = randomiser_for(campaign)
        try:
            snapshot = await self._ctx.store.snapshot(campaign.id, randomiser.count_cells)
        except UnknownCampaign:
            raise NotFound(f"no campaign {campaign.id!r}") from None
        devices = randomiser.devices(snapshot.counts, snapshot.n)  # == messages unless multi-message
        level = (
            postprocess.bonferroni_confidence(confidence, len(campaign.labels))
            if request.simultaneous
            else confidence
        )
        estimates = _estimates(campaign, randomiser, snapshot.counts, devices, level)
        processed = postprocess.apply(np.array([e.estimate for e in estimates]), devices, options)
        # The tightest accountant analyses take up to about a second (cached after): off the loop.
        privacy = await asyncio.to_thread(_statement_for, campaign, devices, snapshot)
        budget = await asyncio.to_thread(
            manipulation_budget, randomiser, snapshot.counts, devices, request.fake_reports
        )
        return pb.QueryResponse(
            campaign_id=campaign.id,
            mechanism=campaign.mechanism,
            n=devices,
            messages=snapshot.n,
            buckets=_buckets(campaign, estimates, processed),
            privacy=privacy,
            confidence=confidence,
            rejected=sum(snapshot.rejected.values()),
            simultaneous=request.simultaneous,
            post_processing_applied=processed.applied,
            manipulation=budget,
        )


def _confidence(request: pb.QueryRequest) -> float:
    """The requested confidence level (default 0.95), checked with the fake-report count."""
    confidence = request.confidence if request.confidence != 0 else DEFAULT_CONFIDENCE
    if not (math.isfinite(confidence) and 0 < confidence < 1):
        raise InvalidRequest(f"confidence must lie in (0, 1), got {request.confidence!r}")
    if request.fake_reports > manipulation.MAX_FAKE_REPORTS:
        raise InvalidRequest(
            f"fake_reports must be at most {manipulation.MAX_FAKE_REPORTS}, got {request.fake_reports}"
        )
    return confidence


def _post_processing(request: pb.QueryRequest, labels: int) -> postprocess.Options:
    """The requested post-processing, checked against the number of labels."""
    pp = request.post_processing
    options = postprocess.Options(pp.clip_non_negative, pp.project_simplex, pp.suppress_below, pp.top_k)
    try:
        options.check(labels)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    return options


def _estimates(
    campaign: pb.Campaign, randomiser: LocalRandomiser, counts: Sequence[int], devices: int, level: float
) -> list[Estimate]:
    """One estimate per label (zeros before anything is counted)."""
    if not devices:
        return [Estimate(0, 0.0, 0.0, 0.0, 0.0) for _ in campaign.labels]
    try:
        return list(randomiser.estimate(list(counts), devices, level))
    except ValueError as exc:  # counts the estimator cannot read (e.g. a replayed share)
        raise FailedPrecondition(f"campaign {campaign.id}: the counts cannot be estimated: {exc}") from None


def _statement_for(campaign: pb.Campaign, devices: int, snapshot: CampaignCounts) -> pb.PrivacyStatement:
    """The privacy statement for a snapshot, with its releases (and those still arriving)."""
    privacy = privacy_statement(campaign, devices, snapshot.smallest_batch, snapshot.batches)
    privacy.releases = snapshot.releases
    privacy.incomplete_releases = snapshot.incomplete_releases
    if snapshot.incomplete_releases:
        pending = f"{snapshot.incomplete_releases} release(s) still arriving are not counted yet"
        privacy.note = "; ".join(filter(None, [privacy.note, pending]))
    return privacy


def _buckets(
    campaign: pb.Campaign, estimates: Sequence[Estimate], processed: postprocess.Processed
) -> list[pb.BucketEstimate]:
    """One answer row per label: raw count, estimate, interval, post-processed value."""
    return [
        pb.BucketEstimate(
            label=label,
            raw_count=e.raw_count,
            estimate=e.estimate,
            std_error=e.std_error,
            ci_low=e.ci_low,
            ci_high=e.ci_high,
            processed=float(value),
            suppressed=bool(hidden),
        )
        for label, e, value, hidden in zip(
            campaign.labels, estimates, processed.values, processed.suppressed, strict=True
        )
    ]
