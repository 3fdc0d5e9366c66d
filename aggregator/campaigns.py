"""Campaigns: validate a request (or plan epsilon0 from a central target), then create, read,
close, delete and retire campaigns. Pure validation and planning sit above the handler class."""

from __future__ import annotations

import inspect
import logging
import math
from collections import Counter
from typing import Final

from deniable.aggregator.context import HandlerContext
from deniable.aggregator.key_admin import KeyHandlers
from deniable.aggregator.store import (
    CampaignCounts,
    CampaignExists,
    CampaignIdTombstoned,
    UnknownCampaign,
)
from deniable.core import mechanisms
from deniable.core.accounting import planner
from deniable.core.campaigns import BINARY_LABELS, layout_for, randomiser_for
from deniable.core.crypto import kem_named
from deniable.core.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidRequest,
    NotFound,
    Unavailable,
)
from deniable.core.ids import valid_campaign_id
from deniable.core.mechanisms import LocalRandomiser
from deniable.core.plumbing.build import version
from deniable.core.plumbing.metrics import reason_label
from deniable.core.plumbing.process import ChildDied, run_in_child
from deniable.core.rng import default_rng
from deniable.v1 import deniable_pb2 as pb

log = logging.getLogger("deniable.aggregator")

MAX_EPSILON0: Final = 20.0
MIN_EPSILON0: Final = 1e-3
"""Smaller local (or target) epsilons give estimates no one can use and break later arithmetic."""
MAX_EXPECTED_N: Final = planner.MAX_N
"""Planning cost grows with n; no shuffle this system runs holds more reports."""
MAX_PLAN_S: Final = 120.0
"""Planning runs in a process of its own, killed at this limit or at the caller's deadline."""
MAX_LABELS: Final = 4096
MAX_LABEL_CHARS: Final = 256
MAX_QUESTION_CHARS: Final = 4096
DEFAULT_DELTA: Final = 1e-6
DEFAULT_N_MIN: Final = 1000
DEFAULT_WINDOW_S: Final = 7 * 24 * 3600
"""A campaign's collection window when none is given: seven days from its creation (or start)."""
MAX_WINDOW_S: Final = 10 * 366 * 24 * 3600
DEFAULT_RELEASE_S: Final = 600
MAX_RELEASE_S: Final = 24 * 3600
MAX_BATCH_TARGET: Final = 1 << 40
INCARNATION_LENGTH: Final = 16
"""Random bytes that tell one life of a campaign id from any other (docs/wire.md)."""


def _finite(value: float) -> bool:
    return math.isfinite(value)


def _validate_labels(request: pb.CreateCampaignRequest) -> list[str]:
    """Labels of a CATEGORICAL campaign: 2..4096 distinct, non-blank, bounded length."""
    labels = list(request.labels)
    if len(labels) < 2:
        raise InvalidRequest(f"a categorical campaign needs at least 2 labels, got {len(labels)}")
    if len(labels) > MAX_LABELS:
        raise InvalidRequest(f"a campaign has at most {MAX_LABELS} labels, got {len(labels)}")
    for index, label in enumerate(labels):
        if not label.strip():
            raise InvalidRequest(f"label {index} is empty")
        if len(label) > MAX_LABEL_CHARS:
            raise InvalidRequest(f"label {index} is longer than {MAX_LABEL_CHARS} characters")
    repeated = [label for label, count in Counter(labels).items() if count > 1]
    if repeated:
        raise InvalidRequest(f"labels must be distinct; repeated: {repeated[0]!r}")
    return labels


def validate_campaign_request(request: pb.CreateCampaignRequest) -> pb.Campaign:
    """Check every field and apply the defaults; the campaign lacks keys, sizes and time."""
    _check_id_and_question(request)
    labels, mechanism = _labels_and_mechanism(request)
    epsilon0, delta = _epsilon0_and_delta(request)
    start, end = _window(request)
    budget = _device_budget(request, epsilon0)
    randomiser, params = _randomiser(request, mechanism, len(labels), delta)
    # The request's n_min counts devices; the shuffler counts messages (reports). Where every device
    # sends the same number of messages, convert, so a released round holds n_min devices.
    n_min = request.n_min or DEFAULT_N_MIN
    target = _batch_target(request.batch_target, n_min, randomiser)
    return pb.Campaign(
        batch_target=target,
        keep_requests_whole=randomiser.multi_message,
        id=request.id,
        question=request.question,
        kind=request.kind,
        labels=labels,
        mechanism=mechanism,
        epsilon0=epsilon0,
        delta=delta,
        n_min=min(randomiser.message_threshold(n_min), 2**32 - 1),
        window_start_unix=start,
        window_end_unix=end,
        device_budget_epsilon=budget,
        params={**params, **randomiser.parameters()},
        local_guarantee=randomiser.local_privacy,
        local_epsilon=epsilon0 if randomiser.local_privacy else 0.0,
    )


def _check_id_and_question(request: pb.CreateCampaignRequest) -> None:
    """The campaign id follows the one id rule (core.ids); the question is bounded."""
    if not request.id:
        raise InvalidRequest("campaign id is required")
    if not valid_campaign_id(request.id):
        raise InvalidRequest(
            f"invalid campaign id {request.id[:80]!r}:"
            " use 1-63 of a-z 0-9 . _ -, starting with a letter or digit"
        )
    if len(request.question) > MAX_QUESTION_CHARS:
        raise InvalidRequest(f"question is longer than {MAX_QUESTION_CHARS} characters")


def _labels_and_mechanism(request: pb.CreateCampaignRequest) -> tuple[list[str], pb.Mechanism.ValueType]:
    """The labels for the campaign's kind and its mechanism (the kind's default if none is given)."""
    if request.kind == pb.BINARY:
        labels, mechanism = list(BINARY_LABELS), request.mechanism or pb.BINARY_RR
    elif request.kind == pb.CATEGORICAL:
        labels, mechanism = _validate_labels(request), request.mechanism or pb.GRR
    else:
        raise InvalidRequest("kind is required: BINARY or CATEGORICAL")
    try:
        mechanisms.name_for_proto(mechanism)
    except ValueError:
        raise InvalidRequest(f"mechanism {int(mechanism)} is not a known mechanism") from None
    return labels, mechanism


def _epsilon0_and_delta(request: pb.CreateCampaignRequest) -> tuple[float, float]:
    """(epsilon0, delta), checked, delta defaulted."""
    epsilon0 = request.epsilon0
    if not (_finite(epsilon0) and MIN_EPSILON0 <= epsilon0 <= MAX_EPSILON0):
        raise InvalidRequest(
            f"epsilon0 must be a finite number in [{MIN_EPSILON0:g}, {MAX_EPSILON0:g}], got {epsilon0!r}"
        )
    delta = request.delta if request.delta != 0 else DEFAULT_DELTA
    if not (_finite(delta) and 0 < delta < 1):
        raise InvalidRequest(f"delta must lie in (0, 1), got {request.delta!r}")
    return epsilon0, delta


def _device_budget(request: pb.CreateCampaignRequest, epsilon0: float) -> float:
    """The device budget epsilon, checked; epsilon0 if not given."""
    budget = request.device_budget_epsilon if request.device_budget_epsilon != 0 else epsilon0
    if not (_finite(budget) and budget >= epsilon0):
        raise InvalidRequest(
            f"device_budget_epsilon must be a finite number >= epsilon0 ({epsilon0:g}), got {budget!r}"
        )
    return budget


def _window(request: pb.CreateCampaignRequest) -> tuple[int, int]:
    """(window start, window end) in Unix seconds, checked (0: not given)."""
    start, end = request.window_start_unix, request.window_end_unix
    if start < 0 or end < 0:
        raise InvalidRequest("window times are Unix seconds and cannot be negative")
    if start and end and end <= start:
        raise InvalidRequest(f"window_end_unix ({end}) must be after window_start_unix ({start})")
    if not 0 <= request.window_s <= MAX_WINDOW_S:
        raise InvalidRequest(f"window_s must lie in [0, {MAX_WINDOW_S}], got {request.window_s}")
    return start, end


def _randomiser(
    request: pb.CreateCampaignRequest, mechanism: pb.Mechanism.ValueType, domain: int, delta: float
) -> tuple[LocalRandomiser, dict[str, float]]:
    """The campaign's randomiser and the parameters it was built with; the mechanism decides
    whether it fits this domain and these parameters."""
    name = mechanisms.name_for_proto(mechanism)
    params = {key: float(value) for key, value in request.params.items()}
    # Shuffle protocols calibrate their noise to the campaign's delta and expected n: hand them over.
    accepted = inspect.signature(mechanisms.mechanism_class(name)).parameters
    if "delta" in accepted:
        params.setdefault("delta", delta)
    if "expected_n" in accepted and request.expected_n:
        params.setdefault("expected_n", float(request.expected_n))
    try:
        randomiser = mechanisms.create(name, epsilon0=request.epsilon0, domain_size=domain, **params)
    except ValueError as exc:
        kind = "binary" if request.kind == pb.BINARY else f"{domain}-category"
        raise InvalidRequest(f"{name} cannot serve this {kind} campaign: {exc}") from None
    return randomiser, params


def _batch_target(devices: int, n_min: int, randomiser: LocalRandomiser) -> int:
    """The batch target in messages: what ``devices`` (default n_min) devices' worth of messages
    needs (``message_threshold``), so a batch that reaches it holds at least that many devices."""
    if devices and devices < n_min:
        raise InvalidRequest(f"batch_target ({devices}) cannot be below n_min ({n_min})")
    if devices > MAX_BATCH_TARGET:
        raise InvalidRequest(f"batch_target must be at most {MAX_BATCH_TARGET}, got {devices}")
    return randomiser.message_threshold(devices or n_min)


def wants_plan(request: pb.CreateCampaignRequest) -> bool:
    """Whether the request asks for a planned epsilon0 (target_epsilon or expected_n set)."""
    return request.target_epsilon != 0 or request.expected_n != 0


def plan_campaign(request: pb.CreateCampaignRequest) -> pb.Campaign:
    """Validate a campaign given as a central target: the planner picks epsilon0 (and mechanism).

    CPU-bound (up to seconds): run it off the event loop. Candidates are tried best first; the
    first one the campaign rules accept is stored, with n_min defaulting to expected_n.
    """
    target, expected_n = request.target_epsilon, request.expected_n
    if request.epsilon0 != 0:
        raise InvalidRequest("give either epsilon0 or target_epsilon with expected_n, not both")
    if target == 0:
        raise InvalidRequest("expected_n is for planning: it needs target_epsilon (or give epsilon0)")
    if not (_finite(target) and MIN_EPSILON0 <= target <= MAX_EPSILON0):
        raise InvalidRequest(
            f"target_epsilon must be a finite number in [{MIN_EPSILON0:g}, {MAX_EPSILON0:g}], got {target!r}"
        )
    if not 1 <= expected_n <= MAX_EXPECTED_N:
        raise InvalidRequest(
            f"expected_n (the reports per shuffled batch) must lie in [1, {MAX_EXPECTED_N:.0e}],"
            f" got {expected_n}"
        )
    delta = request.delta if request.delta != 0 else DEFAULT_DELTA
    if not (_finite(delta) and 0 < delta < 1):
        raise InvalidRequest(f"delta must lie in (0, 1), got {request.delta!r}")
    if request.kind == pb.CATEGORICAL:
        domain = len(_validate_labels(request))
    elif request.kind == pb.BINARY:
        domain = 2
    else:
        raise InvalidRequest("kind is required: BINARY or CATEGORICAL")
    try:
        names = [mechanisms.name_for_proto(request.mechanism)] if request.mechanism else None
        plan = planner.plan(target, delta, int(expected_n), domain, names, dict(request.params) or None)
    except ValueError as exc:  # PlanningError, unknown mechanism, bad parameters
        raise InvalidRequest(f"cannot plan epsilon0: {exc}") from None
    refused: list[str] = []
    for candidate in plan.candidates:
        if not candidate.feasible:
            continue
        planned = pb.CreateCampaignRequest()
        planned.CopyFrom(request)
        planned.mechanism = mechanisms.proto_for_name(candidate.mechanism)  # type: ignore[assignment]
        planned.epsilon0 = candidate.epsilon0
        planned.n_min = request.n_min or min(int(expected_n), 2**32 - 1)
        planned.batch_target = request.batch_target or max(int(expected_n), planned.n_min)
        try:
            campaign = validate_campaign_request(planned)
        except InvalidRequest as exc:
            refused.append(f"{candidate.mechanism}: {exc}")
            continue
        campaign.params.clear()
        campaign.params.update(candidate.params)
        campaign.target_epsilon = target
        campaign.expected_n = expected_n
        return campaign
    raise InvalidRequest(f"no planned mechanism is allowed for this campaign ({'; '.join(refused)})")


async def _plan_bounded(request: pb.CreateCampaignRequest, deadline_s: float | None) -> pb.Campaign:
    """``plan_campaign`` in a killable process, within MAX_PLAN_S and the caller's deadline."""
    limit = MAX_PLAN_S if deadline_s is None else max(0.0, min(MAX_PLAN_S, deadline_s))
    try:
        return await run_in_child(plan_campaign, request, timeout=limit)
    except TimeoutError:
        raise InvalidRequest(
            f"planning did not finish within {limit:g} s (limit {MAX_PLAN_S:g} s or the call's deadline):"
            " give epsilon0, or a smaller expected_n or domain"
        ) from None
    except ChildDied:
        raise Unavailable("the planning process died; try again") from None


class CampaignHandlers:
    """Create, read, change, close, delete and retire campaigns."""

    def __init__(self, ctx: HandlerContext, keys: KeyHandlers) -> None:
        """Work on the shared ``ctx``; ``keys`` are swept when campaigns close or go."""
        self._ctx = ctx
        self._keys = keys

    async def create_campaign(
        self, request: pb.CreateCampaignRequest, deadline_s: float | None = None
    ) -> pb.Campaign:
        """Validate (planning epsilon0 from a central target if asked), fill in key and sizes, store.

        Planning runs in a child process killed after MAX_PLAN_S, at ``deadline_s`` (the caller's
        time left) or when the RPC is cancelled, so no request holds a core past its caller.
        """
        if wants_plan(request):
            campaign = await _plan_bounded(request, deadline_s)
        else:
            campaign = validate_campaign_request(request)
        try:
            kem = kem_named(request.kem)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        try:
            layout = layout_for(randomiser_for(campaign), kem.suite_name)
        except ValueError as exc:
            raise InvalidRequest(f"mechanism parameters rejected: {exc}") from exc
        campaign.hpke_suite = kem.suite_name
        campaign.payload_length = layout.payload_length
        campaign.plaintext_length = layout.plaintext_length
        campaign.ciphertext_length = layout.ciphertext_length
        campaign.created_unix = int(self._ctx.clock())
        campaign.incarnation = default_rng().bytes(INCARNATION_LENGTH)
        campaign.quota_per_source = request.quota_per_source
        if not campaign.window_end_unix:
            opens = max(campaign.window_start_unix, campaign.created_unix)
            campaign.window_end_unix = opens + (request.window_s or DEFAULT_WINDOW_S)
        async with self._ctx.keys_lock:
            key = self._ctx.keyring.active_or_create(kem.name).public
            campaign.key_id = key.key_id
            campaign.public_key = key.raw
            signed = self._ctx.signed(campaign)
            try:
                await self._ctx.store.create_campaign(signed)
            except CampaignIdTombstoned:
                raise AlreadyExists(
                    f"campaign id {campaign.id} belonged to a deleted campaign and is never reused"
                    " (devices and old reports could confuse the two): choose another id"
                ) from None
            except CampaignExists:
                raise AlreadyExists(f"campaign {campaign.id} already exists") from None
        return signed

    async def save_campaign(self, campaign: pb.Campaign) -> pb.Campaign:
        """Re-sign and store a changed campaign description (operator changes go through here)."""
        signed = self._ctx.signed(campaign)
        try:
            await self._ctx.store.update_campaign(signed)
        except UnknownCampaign:
            raise NotFound(f"no campaign {campaign.id!r}") from None
        return signed

    async def release_below_n_min(self, request: pb.ReleaseBelowNMinRequest) -> pb.Campaign:
        """Operator: accept batches below n_min for ``valid_s`` seconds (recorded, then stated)."""
        valid_s = request.valid_s or DEFAULT_RELEASE_S
        if valid_s > MAX_RELEASE_S:
            raise InvalidRequest(f"valid_s must be at most {MAX_RELEASE_S}, got {valid_s}")
        campaign = await self._ctx.campaign(request.campaign_id)
        campaign.below_n_min_until_unix = int(self._ctx.clock()) + valid_s
        self._ctx.metrics.operator_action("release_below_n_min")
        return await self.save_campaign(campaign)

    async def get_campaign(self, request: pb.GetCampaignRequest) -> pb.Campaign:
        """One campaign by id, signed."""
        return self._ctx.signed(await self._ctx.campaign(request.campaign_id))

    async def list_campaigns(self) -> pb.ListCampaignsResponse:
        """Every campaign, oldest first, each signed."""
        return pb.ListCampaignsResponse(
            campaigns=[self._ctx.signed(c) for c in await self._ctx.store.list_campaigns()]
        )

    async def close_campaign(self, request: pb.KeyCloseCampaignRequest) -> pb.Campaign:
        """End the campaign's window now (kept if it ended earlier); the new description is re-signed."""
        campaign = await self._ctx.campaign(request.campaign_id)
        now = int(self._ctx.clock())
        if not campaign.closed:  # also marks it closed: the shuffler releases what it holds (ADR 0014)
            campaign.closed = True
            if not self._ctx.closed(campaign, now):
                campaign.window_end_unix = max(now, campaign.window_start_unix + 1)
            self._ctx.metrics.operator_action("close_campaign")
            campaign = await self.save_campaign(campaign)
        await self._keys.sweep_keys()
        return self._ctx.signed(campaign)

    async def status(self) -> pb.StatusResponse:
        """Operator summary: every campaign with its tallies and last batch, and the keys."""
        now = self._ctx.clock()
        rows = []
        for campaign in await self._ctx.store.list_campaigns():
            try:
                snap = await self._ctx.store.snapshot(campaign.id, randomiser_for(campaign).count_cells)
            except UnknownCampaign:  # deleted meanwhile
                continue
            rows.append(self._status_row(campaign, snap, now))
        keys = (await self._keys.key_listing()).keys
        return pb.StatusResponse(version=version(), now_unix=now, campaigns=rows, keys=keys)

    def _status_row(self, campaign: pb.Campaign, snap: CampaignCounts, now: float) -> pb.StatusCampaign:
        rejected = [
            pb.StatusRejection(reason=reason_label(reason), count=count)
            for reason, count in sorted(snap.rejected.items())
            if count
        ]
        return pb.StatusCampaign(
            campaign=self._ctx.signed(campaign),
            counted=snap.n,
            batches=snap.batches,
            smallest_batch=snap.smallest_batch,
            rejected=rejected,
            last_batch_unix=self._ctx.last_batch.get(campaign.id, 0.0),
            closed=self._ctx.closed(campaign, now),
        )

    async def delete_campaign(
        self, request: pb.StatusDeleteCampaignRequest
    ) -> pb.StatusDeleteCampaignResponse:
        """Remove a closed campaign and its counts; refused while its window is open (ADR 0021)."""
        campaign = await self._ctx.campaign(request.campaign_id)
        if not self._ctx.closed(campaign, self._ctx.clock()):
            raise FailedPrecondition(
                f"campaign {campaign.id!r} is open: close it (deniable campaign close), let the shufflers"
                " forward what they hold, then delete it"
            )
        try:
            counted, batches = await self._ctx.store.delete_campaign(campaign.id)
        except UnknownCampaign:
            raise NotFound(f"no campaign {campaign.id!r}") from None
        self._ctx.last_batch.pop(campaign.id, None)
        log.info("campaign deleted", extra={"campaign": campaign.id, "counted": counted, "batches": batches})
        await self._keys.sweep_keys()
        return pb.StatusDeleteCampaignResponse(campaign_id=campaign.id, counted=counted, batches=batches)

    async def collect_garbage(self) -> dict[str, int]:
        """Retire every campaign whose retention ended (forgetting its report ids): {id: ids removed}."""
        now = self._ctx.clock()
        retired = await self._ctx.store.retired()
        removed: dict[str, int] = {}
        for campaign in await self._ctx.store.list_campaigns():
            if campaign.id not in retired and self._ctx.expired(campaign, now):
                removed[campaign.id] = await self._ctx.store.retire_campaign(campaign.id)
                self._ctx.metrics.report_ids_forgotten.inc(removed[campaign.id])
        return removed
