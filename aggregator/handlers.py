"""The aggregator's logic, free of gRPC: campaigns, batch ingestion, queries, keys.

Failures are the exceptions below; the servicer maps each to one gRPC status. Decryption runs
off the event loop (a process pool when configured, else the default thread executor).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from concurrent.futures.process import BrokenProcessPool
from functools import partial
from typing import Final

import numpy as np

from deniable.aggregator import postprocess
from deniable.aggregator.decrypt import OK, Envelope, Opened, open_packed, open_reports, unpack_opened
from deniable.aggregator.ingest_plan import CountCells, Counting, plan_ingest
from deniable.aggregator.keys import RETIRED, Keyring, KeyStateError
from deniable.aggregator.metrics import AggregatorMetrics
from deniable.aggregator.pool import DecryptPool, PoolUnavailable
from deniable.aggregator.releases import ReleaseCheck, ReleaseChunk, ReleaseConflict
from deniable.aggregator.store import (
    AggregatorStore,
    BatchConflict,
    CampaignCounts,
    CampaignExists,
    StoreError,
    UnknownCampaign,
)
from deniable.core import mechanisms
from deniable.core.accounting import planner
from deniable.core.accounting.shuffle import LOCAL_ONLY
from deniable.core.batches import batch_digest
from deniable.core.campaigns import BINARY_LABELS, layout_for, randomiser_for
from deniable.core.crypto import kem_named
from deniable.core.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidRequest,
    NotFound,
    RequestRefused,
    Unavailable,
)
from deniable.core.ids import valid_campaign_id
from deniable.core.mechanisms import LocalRandomiser, manipulation
from deniable.core.mechanisms.base import Estimate, IntArray
from deniable.core.plumbing.build import version
from deniable.core.plumbing.metrics import reason_label
from deniable.core.plumbing.process import ChildDied, run_in_child
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
DEFAULT_CONFIDENCE: Final = 0.95
DEFAULT_KEY_DRAIN_S: Final = 86_400.0
"""A retired key is destroyed this long after the last campaign sealed to it closed."""
DEFAULT_RETENTION_MARGIN_S: Final = 7 * 86_400.0
"""Report ids are kept this long after a campaign's window ends (late batches still dedupe)."""
CAMPAIGN_CLOSED: Final = int(pb.CAMPAIGN_CLOSED)
DEFAULT_WINDOW_S: Final = 7 * 24 * 3600
"""A campaign's collection window when none is given: seven days from its creation (or start)."""
MAX_WINDOW_S: Final = 10 * 366 * 24 * 3600
DEFAULT_RELEASE_S: Final = 600
MAX_RELEASE_S: Final = 24 * 3600
MAX_BATCH_TARGET: Final = 1 << 40
MIN_CHUNK: Final = 512
POOL_ATTEMPTS: Final = 3
PAYLOAD_OUT_OF_DOMAIN: Final = int(pb.PAYLOAD_OUT_OF_DOMAIN)


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
    if not request.id:
        raise InvalidRequest("campaign id is required")
    if not valid_campaign_id(request.id):
        raise InvalidRequest(
            f"invalid campaign id {request.id[:80]!r}:"
            " use 1-63 of a-z 0-9 . _ -, starting with a letter or digit"
        )
    if len(request.question) > MAX_QUESTION_CHARS:
        raise InvalidRequest(f"question is longer than {MAX_QUESTION_CHARS} characters")

    if request.kind == pb.BINARY:
        labels = list(BINARY_LABELS)
        mechanism = request.mechanism or pb.BINARY_RR
    elif request.kind == pb.CATEGORICAL:
        labels = _validate_labels(request)
        mechanism = request.mechanism or pb.GRR
    else:
        raise InvalidRequest("kind is required: BINARY or CATEGORICAL")
    try:
        mechanism_name = mechanisms.name_for_proto(mechanism)
    except ValueError:
        raise InvalidRequest(f"mechanism {int(mechanism)} is not a known mechanism") from None
    params = {key: float(value) for key, value in request.params.items()}

    epsilon0 = request.epsilon0
    if not (_finite(epsilon0) and MIN_EPSILON0 <= epsilon0 <= MAX_EPSILON0):
        raise InvalidRequest(
            f"epsilon0 must be a finite number in [{MIN_EPSILON0:g}, {MAX_EPSILON0:g}], got {epsilon0!r}"
        )
    delta = request.delta if request.delta != 0 else DEFAULT_DELTA
    if not (_finite(delta) and 0 < delta < 1):
        raise InvalidRequest(f"delta must lie in (0, 1), got {request.delta!r}")
    n_min = request.n_min or DEFAULT_N_MIN
    start, end = request.window_start_unix, request.window_end_unix
    if start < 0 or end < 0:
        raise InvalidRequest("window times are Unix seconds and cannot be negative")
    if start and end and end <= start:
        raise InvalidRequest(f"window_end_unix ({end}) must be after window_start_unix ({start})")
    if not 0 <= request.window_s <= MAX_WINDOW_S:
        raise InvalidRequest(f"window_s must lie in [0, {MAX_WINDOW_S}], got {request.window_s}")
    budget = request.device_budget_epsilon if request.device_budget_epsilon != 0 else epsilon0
    if not (_finite(budget) and budget >= epsilon0):
        raise InvalidRequest(
            f"device_budget_epsilon must be a finite number >= epsilon0 ({epsilon0:g}), got {budget!r}"
        )
    # Shuffle protocols calibrate their noise to the campaign's delta and expected n: hand them over.
    accepted = inspect.signature(mechanisms.mechanism_class(mechanism_name)).parameters
    if "delta" in accepted:
        params.setdefault("delta", delta)
    if "expected_n" in accepted and request.expected_n:
        params.setdefault("expected_n", float(request.expected_n))
    try:  # the mechanism itself decides whether it fits this domain and these parameters
        randomiser = mechanisms.create(mechanism_name, epsilon0=epsilon0, domain_size=len(labels), **params)
    except ValueError as exc:
        kind = "binary" if request.kind == pb.BINARY else f"{len(labels)}-category"
        raise InvalidRequest(f"{mechanism_name} cannot serve this {kind} campaign: {exc}") from None
    # The request's n_min counts devices; the shuffler counts messages (reports). Where every device
    # sends the same number of messages, convert, so a released round holds n_min devices.
    per_device = _messages_per_device(randomiser)
    target = _batch_target(request.batch_target, n_min, randomiser.max_messages_per_device, per_device)
    n_min = min(n_min * per_device, 2**32 - 1)
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
        n_min=n_min,
        window_start_unix=start,
        window_end_unix=end,
        device_budget_epsilon=budget,
        params={**params, **randomiser.parameters()},
        local_guarantee=randomiser.local_privacy,
        local_epsilon=epsilon0 if randomiser.local_privacy else 0.0,
    )


def _messages_per_device(randomiser: LocalRandomiser) -> int:
    """Messages the shuffler counts per device of n_min: the fixed number, else the most one device
    sends (so n_min messages always hold n_min devices), else 1."""
    return randomiser.messages_per_device or randomiser.max_messages_per_device or 1


def _batch_target(devices: int, n_min: int, most_per_device: int | None, per_device: int) -> int:
    """The batch target in messages: ``devices`` (default n_min devices) times the most messages one
    device sends, so a batch that reaches it holds at least that many devices."""
    if devices and devices < n_min:
        raise InvalidRequest(f"batch_target ({devices}) cannot be below n_min ({n_min})")
    if devices > MAX_BATCH_TARGET:
        raise InvalidRequest(f"batch_target must be at most {MAX_BATCH_TARGET}, got {devices}")
    if not devices:
        return n_min * per_device
    return devices * (most_per_device or 1)


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
    most = randomiser_for(campaign).max_messages_per_device or 1
    return int(campaign.batch_target) // most


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


class AggregatorHandlers:
    """Every aggregator RPC as a plain coroutine over protobuf messages."""

    def __init__(
        self,
        store: AggregatorStore,
        keyring: Keyring,
        metrics: AggregatorMetrics | None = None,
        executor: Executor | DecryptPool | None = None,
        decrypt_workers: int = 0,
        clock: Callable[[], float] = time.time,
        key_drain_s: float = DEFAULT_KEY_DRAIN_S,
        retention_margin_s: float = DEFAULT_RETENTION_MARGIN_S,
    ) -> None:
        """``executor`` runs decryption (None: the loop's default; a ``DecryptPool`` is healed when
        a worker dies); ``decrypt_workers`` sets chunking; ``key_drain_s``: how long after its
        campaigns close a retired key is destroyed."""
        self.store = store
        self.keyring = keyring
        self.metrics = metrics or AggregatorMetrics()
        self.pool = executor if isinstance(executor, DecryptPool) else None
        self._executor = None if isinstance(executor, DecryptPool) else executor
        self._workers = decrypt_workers
        self._clock = clock
        self._key_drain_s = key_drain_s
        self._retention_margin_s = retention_margin_s
        # Held from picking a campaign's key until the campaign is stored, and by every key state
        # change: a sweep never sees a key as unused while a campaign sealed to it is being created.
        self._keys_lock = asyncio.Lock()
        self.last_batch: dict[str, float] = {}
        """When each campaign last had a batch ingested by this process (``Status``)."""

    def _signed(self, campaign: pb.Campaign) -> pb.Campaign:
        """The description as devices may see it: signed over its current content (so any change,
        such as a closed window, is re-signed)."""
        return self.keyring.signing.sign_campaign(campaign)

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
        campaign.created_unix = int(self._clock())
        campaign.quota_per_source = request.quota_per_source
        if not campaign.window_end_unix:
            opens = max(campaign.window_start_unix, campaign.created_unix)
            campaign.window_end_unix = opens + (request.window_s or DEFAULT_WINDOW_S)
        async with self._keys_lock:
            key = self.keyring.active_or_create(kem.name).public
            campaign.key_id = key.key_id
            campaign.public_key = key.raw
            signed = self._signed(campaign)
            try:
                await self.store.create_campaign(signed)
            except CampaignExists:
                raise AlreadyExists(f"campaign {campaign.id} already exists") from None
        return signed

    async def save_campaign(self, campaign: pb.Campaign) -> pb.Campaign:
        """Re-sign and store a changed campaign description (operator changes go through here)."""
        signed = self._signed(campaign)
        try:
            await self.store.update_campaign(signed)
        except UnknownCampaign:
            raise NotFound(f"no campaign {campaign.id!r}") from None
        return signed

    async def release_below_n_min(self, request: pb.ReleaseBelowNMinRequest) -> pb.Campaign:
        """Operator: accept batches below n_min for ``valid_s`` seconds (recorded, then stated)."""
        valid_s = request.valid_s or DEFAULT_RELEASE_S
        if valid_s > MAX_RELEASE_S:
            raise InvalidRequest(f"valid_s must be at most {MAX_RELEASE_S}, got {valid_s}")
        campaign = await self._campaign(request.campaign_id)
        campaign.below_n_min_until_unix = int(self._clock()) + valid_s
        self.metrics.operator_action("release_below_n_min")
        return await self.save_campaign(campaign)

    async def _campaign(self, campaign_id: str) -> pb.Campaign:
        if not campaign_id:
            raise InvalidRequest("campaign_id is required")
        campaign = await self.store.get_campaign(campaign_id)
        if campaign is None:
            raise NotFound(f"no campaign {campaign_id[:80]!r}")
        return campaign

    async def get_campaign(self, request: pb.GetCampaignRequest) -> pb.Campaign:
        """One campaign by id, signed."""
        return self._signed(await self._campaign(request.campaign_id))

    async def list_campaigns(self) -> pb.ListCampaignsResponse:
        """Every campaign, oldest first, each signed."""
        return pb.ListCampaignsResponse(
            campaigns=[self._signed(c) for c in await self.store.list_campaigns()]
        )

    async def close_campaign(self, request: pb.KeyCloseCampaignRequest) -> pb.Campaign:
        """End the campaign's window now (kept if it ended earlier); the new description is re-signed."""
        campaign = await self._campaign(request.campaign_id)
        now = int(self._clock())
        if not campaign.closed:  # also marks it closed: the shuffler releases what it holds (ADR 0014)
            campaign.closed = True
            if not self._closed(campaign, now):
                campaign.window_end_unix = max(now, campaign.window_start_unix + 1)
            self.metrics.operator_action("close_campaign")
            campaign = await self.save_campaign(campaign)
        await self.sweep_keys()
        return self._signed(campaign)

    async def status(self) -> pb.StatusResponse:
        """Operator summary: every campaign with its tallies and last batch, and the keys."""
        now = self._clock()
        rows = []
        for campaign in await self.store.list_campaigns():
            try:
                snap = await self.store.snapshot(campaign.id, randomiser_for(campaign).count_cells)
            except UnknownCampaign:  # deleted meanwhile
                continue
            rows.append(self._status_row(campaign, snap, now))
        keys = (await self._key_listing()).keys
        return pb.StatusResponse(version=version(), now_unix=now, campaigns=rows, keys=keys)

    def _status_row(self, campaign: pb.Campaign, snap: CampaignCounts, now: float) -> pb.StatusCampaign:
        rejected = [
            pb.StatusRejection(reason=reason_label(reason), count=count)
            for reason, count in sorted(snap.rejected.items())
            if count
        ]
        return pb.StatusCampaign(
            campaign=self._signed(campaign),
            counted=snap.n,
            batches=snap.batches,
            smallest_batch=snap.smallest_batch,
            rejected=rejected,
            last_batch_unix=self.last_batch.get(campaign.id, 0.0),
            closed=self._closed(campaign, now),
        )

    async def delete_campaign(
        self, request: pb.StatusDeleteCampaignRequest
    ) -> pb.StatusDeleteCampaignResponse:
        """Remove a closed campaign and its counts; refused while its window is open (ADR 0021)."""
        campaign = await self._campaign(request.campaign_id)
        if not self._closed(campaign, self._clock()):
            raise FailedPrecondition(
                f"campaign {campaign.id!r} is open: close it (deniable campaign close), let the shufflers"
                " forward what they hold, then delete it"
            )
        try:
            counted, batches = await self.store.delete_campaign(campaign.id)
        except UnknownCampaign:
            raise NotFound(f"no campaign {campaign.id!r}") from None
        self.last_batch.pop(campaign.id, None)
        log.info("campaign deleted", extra={"campaign": campaign.id, "counted": counted, "batches": batches})
        await self.sweep_keys()
        return pb.StatusDeleteCampaignResponse(campaign_id=campaign.id, counted=counted, batches=batches)

    def _expired(self, campaign: pb.Campaign, now: float) -> bool:
        """Whether the campaign's retention ended: window closed more than the margin ago.

        A campaign stored without an end keeps its ids until closed (``deniable campaign close``)."""
        end = campaign.window_end_unix
        return end != 0 and end + self._retention_margin_s <= now

    async def collect_garbage(self) -> dict[str, int]:
        """Retire every campaign whose retention ended (forgetting its report ids): {id: ids removed}."""
        now = self._clock()
        retired = await self.store.retired()
        removed: dict[str, int] = {}
        for campaign in await self.store.list_campaigns():
            if campaign.id not in retired and self._expired(campaign, now):
                removed[campaign.id] = await self.store.retire_campaign(campaign.id)
                self.metrics.report_ids_forgotten.inc(removed[campaign.id])
        return removed

    @staticmethod
    def _closed(campaign: pb.Campaign, now: float) -> bool:
        """Whether the campaign's window has ended (an open-ended campaign never has)."""
        return campaign.window_end_unix != 0 and campaign.window_end_unix <= now

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
        work = partial(
            open_reports,
            campaign.id,
            campaign.plaintext_length,
            campaign.ciphertext_length,
            self.keyring.private_keys(),
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
            self.keyring.private_keys(),
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
            self.metrics.batch("refused")
            raise

    async def _ingest(self, batch: pb.ShuffledBatch) -> pb.IngestBatchResponse:
        if not batch.batch_id:
            raise InvalidRequest("batch_id is required")
        campaign = await self._campaign(batch.campaign_id)
        envelopes, digest = await asyncio.to_thread(_envelopes_and_digest, batch)
        if digest != batch.digest:
            raise InvalidRequest(f"batch {batch.batch_id[:80]!r}: digest does not match its reports")

        seen = await self.store.find_batch(batch.batch_id)
        if seen is not None:
            return self._duplicate(batch, seen.campaign_id, seen.digest)

        release = _release_of(batch, len(envelopes))
        # n_min applies to the release's total; it is only counted once its chunks add up to it.
        self._check_batch_size(campaign, len(envelopes) if release is None else release.messages)
        randomiser = randomiser_for(campaign)
        if self._expired(campaign, self._clock()):
            # Past retention its ids may be gone: nothing can be deduplicated, so nothing counts.
            await self.store.retire_campaign(campaign.id)
            valid: list[tuple[bytes, bytes]] = []
            rejected = {CAMPAIGN_CLOSED: len(envelopes)}
        else:
            with self.metrics.decrypt_seconds.time(), self.metrics.span("aggregator.decrypt"):
                opened = await self._open(campaign, envelopes)
            valid, rejected = await asyncio.to_thread(_screen, randomiser, opened)
            if randomiser.multi_message and release is None:
                await self._check_devices(campaign, randomiser, batch.batch_id, valid)
        counting = Counting(
            cells=randomiser.count_cells,
            count_cells=_counter(randomiser),
            devices=randomiser.devices if randomiser.multi_message else None,
            check_release=self._release_check(campaign, randomiser) if randomiser.multi_message else None,
        )
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
            )
        )
        try:
            with self.metrics.commit_seconds.time(), self.metrics.span("aggregator.commit"):
                outcome = await self.store.apply(plan)
        except ReleaseConflict as exc:
            self.metrics.batch("release_conflict")
            raise FailedPrecondition(str(exc)) from None
        except BatchConflict as exc:
            raise AlreadyExists(str(exc)) from None
        except UnknownCampaign:
            raise NotFound(f"no campaign {campaign.id!r}") from None
        if outcome.duplicate_batch:
            return self._duplicate(batch, campaign.id, batch.digest)
        self.metrics.batch("ingested")
        self.last_batch[campaign.id] = self._clock()
        self.metrics.counted(outcome.counted)
        self.metrics.rejected(outcome.rejected)
        return pb.IngestBatchResponse(
            batch_id=batch.batch_id,
            duplicate_batch=False,
            counted=outcome.counted,
            rejected=[
                pb.RejectionCount(reason=reason, count=count)  # type: ignore[arg-type]
                for reason, count in sorted(outcome.rejected.items())
            ],
        )

    def _check_batch_size(self, campaign: pb.Campaign, size: int) -> None:
        """Refuse a batch below n_min unless the operator authorised it (and it has not lapsed).

        An empty batch counts nobody and hides nobody: it is recorded as before.
        """
        if size == 0 or size >= campaign.n_min or self._clock() < campaign.below_n_min_until_unix:
            return
        self.metrics.batch("below_n_min")
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
            self.metrics.batch("incomplete")
            raise FailedPrecondition(f"batch {batch_id[:80]!r} is refused: {problem}")
        devices = randomiser.devices(counts, len(valid))
        least = campaign.n_min // _messages_per_device(randomiser)
        if 0 < devices < least and self._clock() >= campaign.below_n_min_until_unix:
            self.metrics.batch("below_n_min")
            raise FailedPrecondition(
                f"batch {batch_id[:80]!r} holds {devices} devices, below the campaign's n_min ({least})"
                " and no operator authorised a release below n_min (ReleaseBelowNMin)"
            )

    def _release_check(self, campaign: pb.Campaign, randomiser: LocalRandomiser) -> ReleaseCheck:
        """Multi-message: a complete release must be whole devices, at least n_min of them."""
        least = campaign.n_min // _messages_per_device(randomiser)
        authorised = self._clock() < campaign.below_n_min_until_unix

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
        self.metrics.batch("duplicate")
        return pb.IngestBatchResponse(batch_id=batch.batch_id, duplicate_batch=True)

    async def query(self, request: pb.QueryRequest, binary: bool) -> pb.QueryResponse:
        """Debiased estimates with confidence intervals, and the privacy guarantee that holds."""
        confidence = request.confidence if request.confidence != 0 else DEFAULT_CONFIDENCE
        if not (_finite(confidence) and 0 < confidence < 1):
            raise InvalidRequest(f"confidence must lie in (0, 1), got {request.confidence!r}")
        if request.fake_reports > manipulation.MAX_FAKE_REPORTS:
            raise InvalidRequest(
                f"fake_reports must be at most {manipulation.MAX_FAKE_REPORTS}, got {request.fake_reports}"
            )
        campaign = await self._campaign(request.campaign_id)
        if binary and campaign.kind != pb.BINARY:
            raise FailedPrecondition(f"campaign {campaign.id} is categorical: use Histogram, not BinarySum")
        pp = request.post_processing
        options = postprocess.Options(pp.clip_non_negative, pp.project_simplex, pp.suppress_below, pp.top_k)
        try:
            options.check(len(campaign.labels))
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        randomiser = randomiser_for(campaign)
        try:
            snapshot = await self.store.snapshot(campaign.id, randomiser.count_cells)
        except UnknownCampaign:
            raise NotFound(f"no campaign {campaign.id!r}") from None
        devices = randomiser.devices(snapshot.counts, snapshot.n)  # == messages unless multi-message
        level = (
            postprocess.bonferroni_confidence(confidence, len(campaign.labels))
            if request.simultaneous
            else confidence
        )
        try:
            estimates = (
                randomiser.estimate(snapshot.counts, devices, level)
                if devices
                else [Estimate(0, 0.0, 0.0, 0.0, 0.0) for _ in campaign.labels]  # nothing counted yet
            )
        except ValueError as exc:  # counts the estimator cannot read (e.g. a replayed share)
            raise FailedPrecondition(
                f"campaign {campaign.id}: the counts cannot be estimated: {exc}"
            ) from None
        processed = postprocess.apply(np.array([e.estimate for e in estimates]), devices, options)
        # The tightest accountant analyses take up to about a second (cached after): off the loop.
        privacy = await asyncio.to_thread(
            privacy_statement, campaign, devices, snapshot.smallest_batch, snapshot.batches
        )
        privacy.releases = snapshot.releases
        privacy.incomplete_releases = snapshot.incomplete_releases
        if snapshot.incomplete_releases:
            pending = f"{snapshot.incomplete_releases} release(s) still arriving are not counted yet"
            privacy.note = "; ".join(filter(None, [privacy.note, pending]))
        budget = await asyncio.to_thread(
            manipulation_budget, randomiser, snapshot.counts, devices, request.fake_reports
        )
        return pb.QueryResponse(
            campaign_id=campaign.id,
            mechanism=campaign.mechanism,
            n=devices,
            messages=snapshot.n,
            buckets=[
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
            ],
            privacy=privacy,
            confidence=confidence,
            rejected=sum(snapshot.rejected.values()),
            simultaneous=request.simultaneous,
            post_processing_applied=processed.applied,
            manipulation=budget,
        )

    async def list_keys(self) -> pb.ListKeysResponse:
        """Public metadata of every aggregator key (with the campaigns sealed to it) and the signing key.

        Keys are listed even while the store is down (without their campaigns)."""
        try:
            await self.sweep_keys()
            return await self._key_listing()
        except StoreError:
            return await self._key_listing(with_campaigns=False)

    async def _key_listing(self, with_campaigns: bool = True) -> pb.ListKeysResponse:
        by_key: dict[int, list[str]] = {}
        for campaign in await self.store.list_campaigns() if with_campaigns else []:
            by_key.setdefault(campaign.key_id, []).append(campaign.id)
        infos = self.keyring.infos()
        for info in infos:
            info.campaigns.extend(by_key.get(info.key_id, []))
        return pb.ListKeysResponse(keys=infos, signing_public_key=self.keyring.signing.public_raw)

    async def rotate_key(self, request: pb.KeyRotateRequest) -> pb.KeyInfo:
        """A new active key for the KEM; the old one is retired and still decrypts."""
        try:
            kem = kem_named(request.kem).name
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        async with self._keys_lock:
            pair = await asyncio.to_thread(self.keyring.rotate, kem)
        await self.sweep_keys()
        return await self._key_info(pair.key_id)

    async def destroy_key(self, request: pb.KeyDestroyRequest) -> pb.KeyInfo:
        """Destroy a retired key now (the operator has drained it); refused while a campaign sealed
        to it is open."""
        async with self._keys_lock:
            open_campaigns = await self._open_campaigns_of(request.key_id)
            if open_campaigns:
                raise FailedPrecondition(
                    f"key {request.key_id} still serves open campaigns ({', '.join(open_campaigns[:5])});"
                    " close them and let the shuffler drain them first"
                )
            try:
                await asyncio.to_thread(self.keyring.destroy, request.key_id)
            except KeyStateError as exc:
                raise FailedPrecondition(str(exc)) from None
        return await self._key_info(request.key_id)

    async def sweep_keys(self) -> list[int]:
        """Destroy every retired key whose campaigns all closed at least ``key_drain_s`` ago."""
        if not any(info.state == RETIRED for info in self.keyring.infos()):
            return []
        async with self._keys_lock:
            retired = [info.key_id for info in self.keyring.infos() if info.state == RETIRED]
            now = self._clock()
            campaigns = await self.store.list_campaigns()
            destroyed = []
            for key_id in retired:
                sealed = [c for c in campaigns if c.key_id == key_id]
                if all(self._closed(c, now - self._key_drain_s) for c in sealed):
                    await asyncio.to_thread(self.keyring.destroy, key_id)
                    destroyed.append(key_id)
            return destroyed

    async def _open_campaigns_of(self, key_id: int) -> list[str]:
        now = self._clock()
        return [
            c.id for c in await self.store.list_campaigns() if c.key_id == key_id and not self._closed(c, now)
        ]

    async def _key_info(self, key_id: int) -> pb.KeyInfo:
        listing = await self._key_listing()
        return next(info for info in listing.keys if info.key_id == key_id)


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
