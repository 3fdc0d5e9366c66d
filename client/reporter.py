"""The device side of a campaign: randomise on the device, seal to the aggregator, queue, deliver.

Every answer is randomised on the device before anything leaves it, padded to the campaign's fixed
plaintext length and sealed with HPKE to the aggregator's key, so the shuffler only ever relays
ciphertexts of one size. What a device keeps depends on the mechanism (docs/sdk-privacy.md):

- local randomisers (``mechanism_has_local_guarantee``): each report is locally epsilon0-DP, so
  epsilon0 holds whatever the shuffler, the aggregator, or both together do; the shuffle only adds
  the central (epsilon, delta) on top, and is lost if either misbehaves.
- shuffle-only protocols (cheu_binary_sum, balcer_cheu_histogram, multi_message_sum(_binomial),
  multi_message_histogram, sample_and_threshold): a report alone is NOT private (a message can
  carry the true value, or shares that add up to it). Their epsilon0 is a central target that
  holds only if the shuffler hides senders AND the aggregator never sees who sent what. A
  shuffler that swaps in a key of its own, or an aggregator that also sees the shuffler's input,
  learns each device's value. ``require_local_guarantee`` refuses such campaigns.

Trust note: the campaign description (including the aggregator's HPKE public key and epsilon0)
reaches the device through the shuffler or an MQTT broker, neither of which is trusted with it.
The aggregator signs every description with its Ed25519 signing key; ``Reporter.fetch`` verifies
that signature against the key the app pins (``aggregator_key``) and the app's ``DevicePolicy``
before anything is sealed (docs/security.md, "Campaign signatures").
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from deniable.client.budget import BudgetExceeded, BudgetLedger, IncarnationMismatch, fits
from deniable.client.outbox import Outbox
from deniable.client.transport import Transport, TransportError
from deniable.core import mechanisms
from deniable.core.backoff import backoff_delay
from deniable.core.campaigns import (
    layout_for,
    mechanism_has_local_guarantee,
    randomiser_for,
)
from deniable.core.crypto import (
    CampaignSignatureError,
    PublicKey,
    kem_for_suite,
    seal_report,
    verify_campaign,
)
from deniable.core.ids import valid_campaign_id
from deniable.core.wire import Plaintext, encode, new_report_id
from deniable.v1 import deniable_pb2 as pb

logger = logging.getLogger("deniable.client")

Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]


class ProgressBar(Protocol):
    """The part of a tqdm bar the Reporter uses."""

    def update(self, n: int = 1) -> object:
        """Advance by ``n``."""
        ...

    def close(self) -> None:
        """Finish the bar."""
        ...


class _NoBar:
    """A progress bar that shows nothing (the default: the SDK does not need tqdm)."""

    def update(self, n: int = 1) -> None:
        """Do nothing."""

    def close(self) -> None:
        """Do nothing."""


def progress_bar(total: int, desc: str, unit: str, enabled: bool) -> ProgressBar:
    """A tqdm bar when asked for (tqdm comes with ``deniable[server]``), otherwise a silent one."""
    if not enabled:
        return _NoBar()
    try:
        from tqdm import tqdm
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError("progress bars need tqdm: pip install 'deniable[server]'") from exc
    return tqdm(total=total, desc=desc, unit=unit)


class CampaignClosed(Exception):
    """The campaign's collection window is not open now."""


class CampaignUnavailable(TransportError):
    """The campaign description could not be fetched before ``fetch`` gave up (retryable later)."""


class CampaignInvalid(Exception):
    """The campaign description is inconsistent, so reports made from it could not be counted."""


class CampaignPolicyError(Exception):
    """A correctly signed campaign asks for weaker privacy than the app's DevicePolicy accepts."""


@dataclass(frozen=True)
class DevicePolicy:
    """The weakest campaign an app accepts, checked after the signature (``CampaignPolicyError``).

    ``allowed_mechanisms``: mechanism names (e.g. "grr", "binary_rr"); None allows every one.
    ``min_batch``: the smallest n_min (reports per shuffled batch) accepted.
    ``require_local_dp``: refuse shuffle-only protocols, whose reports carry no local guarantee.
    """

    max_epsilon0: float = math.inf
    allowed_mechanisms: frozenset[str] | None = None
    min_batch: int = 0
    max_device_budget: float = math.inf
    require_local_dp: bool = False

    @classmethod
    def of(
        cls,
        max_epsilon0: float = math.inf,
        allowed_mechanisms: Iterable[str] | None = None,
        min_batch: int = 0,
        max_device_budget: float = math.inf,
        require_local_dp: bool = False,
    ) -> DevicePolicy:
        """A policy from any iterable of mechanism names."""
        names = None if allowed_mechanisms is None else frozenset(m.lower() for m in allowed_mechanisms)
        return cls(max_epsilon0, names, min_batch, max_device_budget, require_local_dp)

    def check(self, campaign: pb.Campaign) -> None:
        """Raise CampaignPolicyError naming the first limit the campaign exceeds."""
        name = f"campaign {campaign.id[:80]!r}"
        if self.require_local_dp and not mechanism_has_local_guarantee(campaign):
            raise CampaignPolicyError(
                f"{name}: a shuffle-only protocol, its reports carry no local guarantee"
            )
        if not campaign.epsilon0 <= self.max_epsilon0:
            raise CampaignPolicyError(
                f"{name}: ε0 {campaign.epsilon0:g} exceeds the policy's {self.max_epsilon0:g}"
            )
        if not campaign.device_budget_epsilon <= self.max_device_budget:
            raise CampaignPolicyError(
                f"{name}: device budget {campaign.device_budget_epsilon:g} exceeds the policy's"
                f" {self.max_device_budget:g}"
            )
        if campaign.n_min < self.min_batch:
            raise CampaignPolicyError(
                f"{name}: n_min {campaign.n_min} is below the policy's {self.min_batch}"
            )
        if self.allowed_mechanisms is not None:
            try:
                mechanism = mechanisms.name_for_proto(campaign.mechanism)
            except ValueError:
                mechanism = f"mechanism {int(campaign.mechanism)}"
            if mechanism not in self.allowed_mechanisms:
                raise CampaignPolicyError(f"{name}: {mechanism} is not an allowed mechanism")


def verify_description(
    campaign: pb.Campaign,
    aggregator_key: bytes | str | None,
    *,
    insecure_skip_verify: bool = False,
    policy: DevicePolicy | None = None,
) -> None:
    """Check a fetched description: signature by the pinned key, then the device policy.

    Without ``aggregator_key`` it refuses (CampaignSignatureError) unless ``insecure_skip_verify``.
    """
    if aggregator_key is not None:
        try:
            verify_campaign(campaign, aggregator_key)
        except ValueError as exc:  # a malformed pinned key is the app's bug: say so
            raise CampaignSignatureError(f"the pinned aggregator key is unusable: {exc}") from None
    elif not insecure_skip_verify:
        raise CampaignSignatureError(
            "no aggregator signing key pinned: pass aggregator_key=..."
            " (or insecure_skip_verify=True in tests)"
        )
    if policy is not None:
        policy.check(campaign)


class CampaignRefused(Exception):
    """The campaign is valid but weaker than this device accepts (e.g. no local guarantee)."""


@dataclass(frozen=True)
class SendResult:
    """Outcome of one ``send_pending``: acknowledged, permanently rejected, and still queued reports."""

    acknowledged: int
    rejected: int
    pending: int
    rejections: dict[str, int] = field(default_factory=dict)


def reason_name(reason: pb.RejectReason.ValueType) -> str:
    """Enum name of a RejectReason, tolerating values newer than this SDK."""
    try:
        return pb.RejectReason.Name(reason)
    except ValueError:
        return f"REJECT_REASON_{reason}"


def validate_campaign(campaign: pb.Campaign) -> None:
    """Raise CampaignInvalid unless the description is one this SDK can report to correctly."""
    if not valid_campaign_id(campaign.id):
        raise CampaignInvalid(f"invalid campaign id {campaign.id!r}")
    try:
        randomiser = randomiser_for(campaign)
    except ValueError as exc:
        raise CampaignInvalid(f"campaign {campaign.id!r}: {exc}") from exc
    try:
        kem = kem_for_suite(campaign.hpke_suite)
    except ValueError as exc:
        raise CampaignInvalid(f"campaign {campaign.id!r}: {exc}") from None
    layout = layout_for(randomiser, kem.suite_name)
    declared = (campaign.payload_length, campaign.plaintext_length, campaign.ciphertext_length)
    expected = (layout.payload_length, layout.plaintext_length, layout.ciphertext_length)
    if declared != expected:
        raise CampaignInvalid(
            f"campaign {campaign.id!r} declares payload/plaintext/ciphertext lengths {declared}, "
            f"its mechanism gives {expected}"
        )
    if len(campaign.public_key) != kem.public_length:
        raise CampaignInvalid(
            f"campaign {campaign.id!r}: public key is {len(campaign.public_key)} bytes,"
            f" not {kem.public_length} ({kem.name})"
        )
    budget = campaign.device_budget_epsilon
    if not (math.isfinite(budget) and budget > 0):
        raise CampaignInvalid(f"campaign {campaign.id!r}: device budget {budget!r} is not a positive number")


class Reporter:
    """Records answers to one campaign into the outbox and delivers them to the shuffler."""

    def __init__(
        self,
        campaign: pb.Campaign,
        outbox: Outbox,
        transport: Transport,
        ledger: BudgetLedger | None = None,
        *,
        require_local_guarantee: bool = False,
        clock: Clock = time.time,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        """Check the campaign (CampaignInvalid, also for an incarnation other than the one ``ledger``
        pinned for its id; CampaignRefused if ``require_local_guarantee`` and it has none) and
        rebuild its randomiser; ``clock``/``sleep`` for tests.

        The description is trusted as given: use ``fetch``, or ``verify_description`` first, for one
        that came through the shuffler, a broker or any cache."""
        validate_campaign(campaign)
        if ledger is not None:
            try:
                ledger.pin_incarnation(campaign.id, campaign.incarnation)
            except IncarnationMismatch as exc:
                raise CampaignInvalid(str(exc)) from None
        if require_local_guarantee and not mechanism_has_local_guarantee(campaign):
            raise CampaignRefused(
                f"campaign {campaign.id!r} uses a shuffle-only protocol: its reports carry no local guarantee"
            )
        self.campaign = pb.Campaign()
        self.campaign.CopyFrom(campaign)
        self.randomiser = randomiser_for(self.campaign)
        self.public_key = PublicKey(self.campaign.key_id, bytes(self.campaign.public_key))
        self.outbox = outbox
        self.transport = transport
        self.ledger = ledger
        self._clock = clock
        self._sleep = sleep
        self._send_lock = asyncio.Lock()

    @classmethod
    async def fetch(
        cls,
        campaign_id: str,
        transport: Transport,
        outbox: Outbox,
        ledger: BudgetLedger | None = None,
        *,
        aggregator_key: bytes | str | None = None,
        insecure_skip_verify: bool = False,
        policy: DevicePolicy | None = None,
        require_local_guarantee: bool = False,
        clock: Clock = time.time,
        sleep: Sleep = asyncio.sleep,
        give_up_after_s: float = 60.0,
        base_delay_s: float = 0.05,
        max_delay_s: float = 5.0,
    ) -> Reporter:
        """A Reporter for the campaign, once its signature verifies with the pinned ``aggregator_key``
        (the aggregator's Ed25519 signing public key, raw or hex) and it fits ``policy``.

        A retryable TransportError is retried with the equal-jitter backoff of ``send_pending``;
        after ``give_up_after_s`` (measured with ``clock``) it raises CampaignUnavailable. Raises
        CampaignSignatureError (unsigned, altered, another key, or no key pinned without
        ``insecure_skip_verify=True``), CampaignPolicyError, or CampaignInvalid.
        """
        campaign = await _get_campaign_retrying(
            campaign_id, transport, clock, sleep, give_up_after_s, base_delay_s, max_delay_s
        )
        verify_description(campaign, aggregator_key, insecure_skip_verify=insecure_skip_verify, policy=policy)
        if campaign.id != campaign_id:
            raise CampaignInvalid(f"asked for campaign {campaign_id!r}, got {campaign.id!r}")
        return cls(
            campaign,
            outbox,
            transport,
            ledger,
            require_local_guarantee=require_local_guarantee,
            clock=clock,
            sleep=sleep,
        )

    def check_open(self) -> None:
        """Raise CampaignClosed unless the window is open now (start inclusive, end exclusive)."""
        now = self._clock()
        start, end = self.campaign.window_start_unix, self.campaign.window_end_unix
        if start and now < start:
            raise CampaignClosed(f"campaign {self.campaign.id!r} opens at {start}")
        if end and now >= end:
            raise CampaignClosed(f"campaign {self.campaign.id!r} closed at {end}")

    def _seal_payload(self, payload: bytes) -> list[tuple[bytes, pb.EncryptedReport]]:
        """Encode and seal each message of one randomised answer apart, each with its own id.

        Multi-message mechanisms emit several messages per answer; they share nothing (no common
        id), so after the shuffle nobody can tell which messages came from the same device.
        """
        campaign = self.campaign
        sealed = []
        for message in self.randomiser.split_messages(payload):
            report_id = new_report_id()
            plaintext = encode(
                Plaintext(report_id, campaign.id, campaign.key_id, message), campaign.plaintext_length
            )
            ciphertext = seal_report(plaintext, self.public_key, campaign.id, campaign.incarnation)
            if len(ciphertext) != campaign.ciphertext_length:  # guaranteed by validate_campaign
                raise CampaignInvalid(
                    f"sealed {len(ciphertext)} bytes, campaign expects {campaign.ciphertext_length}"
                )
            envelope = pb.EncryptedReport(
                campaign_id=campaign.id, key_id=campaign.key_id, ciphertext=ciphertext
            )
            sealed.append((report_id, envelope))
        return sealed

    def _seal(self, value: int) -> list[tuple[bytes, pb.EncryptedReport]]:
        """Randomise, encode and seal one answer; its messages' report ids and envelopes."""
        return self._seal_payload(self.randomiser.randomise(value))

    def record(self, value: int) -> bytes:
        """Queue one randomised, sealed answer of this device; returns its (first message's) report id.

        Refuses a value outside the domain (ValueError), a closed window (CampaignClosed) and an
        exhausted budget (BudgetExceeded). The budget is charged durably before the answer is
        randomised, so a crash can over-count spend but never under-count it.
        """
        self.randomiser.check_value(value)
        self.check_open()
        if self.ledger is not None:
            self._book(self.ledger)
        sealed = self._seal(value)
        self.outbox.add_answers([[report for _, report in sealed]])
        return sealed[0][0]

    def _book(self, ledger: BudgetLedger) -> None:
        """Local epsilon0 for a local randomiser; a central-only participation for a shuffle-only one
        (at most budget / epsilon0 reports per campaign), never booked as local epsilon."""
        campaign = self.campaign
        if mechanism_has_local_guarantee(campaign):
            ledger.charge(campaign.id, campaign.epsilon0, campaign.device_budget_epsilon)
        else:
            limit = max(1, math.floor(campaign.device_budget_epsilon / campaign.epsilon0 * (1 + 1e-9)))
            ledger.participate(campaign.id, campaign.epsilon0, limit)

    def record_many(self, values: Sequence[int], progress: bool = False) -> int:
        """Queue one report per value, each from a distinct simulated device; for simulations.

        Nothing is charged to the ledger: the ledger is this device's, and here every value
        stands for a different device spending epsilon0 once, which fits its budget (checked).
        All values are checked first and written in one transaction: all or nothing.
        """
        for value in values:
            self.randomiser.check_value(value)
        self.check_open()
        if not fits(self.campaign.epsilon0, self.campaign.device_budget_epsilon):
            raise BudgetExceeded(
                f"campaign {self.campaign.id!r}",
                0.0,
                self.campaign.epsilon0,
                self.campaign.device_budget_epsilon,
            )
        payloads = self.randomiser.randomise_many(values)
        bar = progress_bar(len(payloads), "seal", "device", progress)
        answers: list[list[pb.EncryptedReport]] = []
        for payload in payloads:
            answers.append([report for _, report in self._seal_payload(payload)])
            bar.update(1)
        bar.close()
        return self.outbox.add_answers(answers)

    async def send_pending(
        self,
        batch_size: int = 1000,
        max_attempts: int = 8,
        base_delay_s: float = 0.05,
        max_delay_s: float = 5.0,
        progress: bool = False,
    ) -> SendResult:
        """Deliver this campaign's queued reports in batches, retrying transient failures.

        Accepted and rejected reports leave the outbox (rejections are counted and logged with
        their reason: every per-report rejection is final). A retryable TransportError is retried
        after equal-jitter exponential backoff (``core.backoff``); after ``max_attempts`` consecutive
        failures the rest stay queued for a later call. A non-retryable TransportError (including a
        response that does not account for every report) is raised, leaving the current batch queued.
        """
        if batch_size <= 0 or max_attempts <= 0:
            raise ValueError("batch_size and max_attempts must be positive")
        campaign_id = self.campaign.id
        acknowledged = rejected = 0
        rejections: Counter[str] = Counter()
        async with self._send_lock:
            bar = progress_bar(self.outbox.count(campaign_id), "send", "report", progress)
            try:
                failures = 0
                while rows := self.outbox.pending(batch_size, campaign_id):
                    ids = [row.id for row in rows]
                    self.outbox.mark_attempt(ids)
                    try:
                        response = await self.transport.submit([row.to_proto() for row in rows])
                    except TransportError as exc:
                        if not exc.retryable:
                            raise
                        failures += 1
                        if failures >= max_attempts:
                            logger.warning(
                                "shuffler unreachable, reports stay queued",
                                extra={"campaign": campaign_id, "attempts": failures, "error": exc.message},
                            )
                            break
                        await self._sleep(backoff_delay(failures - 1, base_delay_s, max_delay_s))
                        continue
                    failures = 0
                    refused = _check_response(response, len(rows))
                    for rejection in refused.values():
                        name = reason_name(rejection.reason)
                        rejections[name] += 1
                        logger.warning(
                            "report rejected by the shuffler",
                            extra={"campaign": campaign_id, "reason": name, "detail": rejection.detail},
                        )
                    self.outbox.remove(ids)
                    acknowledged += len(rows) - len(refused)
                    rejected += len(refused)
                    bar.update(len(rows))
            finally:
                bar.close()
        return SendResult(acknowledged, rejected, self.outbox.count(campaign_id), dict(rejections))


async def _get_campaign_retrying(
    campaign_id: str,
    transport: Transport,
    clock: Clock,
    sleep: Sleep,
    give_up_after_s: float,
    base_delay_s: float,
    max_delay_s: float,
) -> pb.Campaign:
    """GetCampaign, retrying retryable failures with jittered backoff until ``give_up_after_s``."""
    if not give_up_after_s >= 0:
        raise ValueError("give_up_after_s must be a non-negative number of seconds")
    deadline = clock() + give_up_after_s
    attempt = 0
    while True:
        try:
            return await transport.get_campaign(campaign_id)
        except TransportError as exc:
            if not exc.retryable:
                raise
            remaining = deadline - clock()
            if remaining <= 0:
                raise CampaignUnavailable(
                    f"campaign {campaign_id!r} unavailable after {give_up_after_s:g} s and"
                    f" {attempt + 1} attempts: {exc.message}",
                    retryable=True,
                ) from exc
            await sleep(min(remaining, backoff_delay(attempt, base_delay_s, max_delay_s)))
            attempt += 1


def _check_response(response: pb.SubmitReportsResponse, sent: int) -> dict[int, pb.Rejection]:
    """Rejections by index; a response that does not account for each report exactly once is refused."""
    refused: dict[int, pb.Rejection] = {}
    for rejection in response.rejected:
        if rejection.index >= sent or rejection.index in refused:
            raise TransportError(f"shuffler response has a bad rejection index {rejection.index}", False)
        refused[rejection.index] = rejection
    if response.accepted + len(refused) != sent:
        raise TransportError(
            f"shuffler accounted for {response.accepted} + {len(refused)} of {sent} reports", retryable=False
        )
    return refused
