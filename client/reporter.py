"""The device side of a campaign: randomise locally, seal to the aggregator, queue, deliver.

Every answer is randomised on the device (local epsilon0-DP) before anything leaves it, padded to
the campaign's fixed plaintext length and sealed with HPKE to the aggregator's key, so the
shuffler only ever relays ciphertexts of one size.

Trust note: the campaign description (including the aggregator's public key) reaches the device
through the shuffler. A malicious shuffler could swap in a key of its own and read every report
(it would still see only locally randomised answers, so epsilon0 holds, but the shuffle
amplification would be lost). The deployment's answer is to pin the aggregator's key (or the
campaign description's digest) in the app, and to use mutual TLS to an authenticated shuffler;
this SDK checks the key's form and the report sizes, not who issued the key.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from deniable.client.budget import BudgetExceeded, BudgetLedger, fits
from deniable.client.outbox import Outbox
from deniable.client.transport import Transport, TransportError
from deniable.core.campaigns import layout_for, randomiser_for, valid_campaign_id
from deniable.core.crypto import SUITE_NAME, PublicKey, seal_report
from deniable.core.rng import Csprng, default_rng
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


def backoff_delay(attempt: int, base_delay_s: float, max_delay_s: float, rng: Csprng | None = None) -> float:
    """Full-jitter backoff: uniform in [0, min(max_delay_s, base_delay_s * 2**attempt)], CSPRNG drawn."""
    cap = min(max_delay_s, base_delay_s * 2.0 ** min(attempt, 64))
    if cap <= 0:
        return 0.0
    return cap * (rng or default_rng()).randbits(53) / float((1 << 53) - 1)


def validate_campaign(campaign: pb.Campaign) -> None:
    """Raise CampaignInvalid unless the description is one this SDK can report to correctly."""
    if not valid_campaign_id(campaign.id):
        raise CampaignInvalid(f"invalid campaign id {campaign.id!r}")
    try:
        randomiser = randomiser_for(campaign)
    except ValueError as exc:
        raise CampaignInvalid(f"campaign {campaign.id!r}: {exc}") from exc
    layout = layout_for(randomiser)
    declared = (campaign.payload_length, campaign.plaintext_length, campaign.ciphertext_length)
    expected = (layout.payload_length, layout.plaintext_length, layout.ciphertext_length)
    if declared != expected:
        raise CampaignInvalid(
            f"campaign {campaign.id!r} declares payload/plaintext/ciphertext lengths {declared}, "
            f"its mechanism gives {expected}"
        )
    if len(campaign.public_key) != 32:
        raise CampaignInvalid(
            f"campaign {campaign.id!r}: public key is {len(campaign.public_key)} bytes, not 32"
        )
    if campaign.hpke_suite != SUITE_NAME:
        raise CampaignInvalid(f"campaign {campaign.id!r}: unsupported HPKE suite {campaign.hpke_suite!r}")
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
        clock: Clock = time.time,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        """Check the campaign (CampaignInvalid) and rebuild its randomiser; ``clock``/``sleep`` for tests."""
        validate_campaign(campaign)
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
        clock: Clock = time.time,
        sleep: Sleep = asyncio.sleep,
        give_up_after_s: float = 60.0,
        base_delay_s: float = 0.05,
        max_delay_s: float = 5.0,
    ) -> Reporter:
        """A Reporter for the campaign as the shuffler describes it (see the trust note above).

        A retryable TransportError is retried with the full-jitter backoff of ``send_pending``;
        after ``give_up_after_s`` (measured with ``clock``) it raises CampaignUnavailable.
        """
        campaign = await _get_campaign_retrying(
            campaign_id, transport, clock, sleep, give_up_after_s, base_delay_s, max_delay_s
        )
        if campaign.id != campaign_id:
            raise CampaignInvalid(f"asked for campaign {campaign_id!r}, got {campaign.id!r}")
        return cls(campaign, outbox, transport, ledger, clock=clock, sleep=sleep)

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
            ciphertext = seal_report(plaintext, self.public_key, campaign.id)
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
            self.ledger.charge(self.campaign.id, self.campaign.epsilon0, self.campaign.device_budget_epsilon)
        sealed = self._seal(value)
        self.outbox.add_answers([[report for _, report in sealed]])
        return sealed[0][0]

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
        after full-jitter exponential backoff; after ``max_attempts`` consecutive failures the
        rest stay queued for a later call. A non-retryable TransportError (including a response
        that does not account for every report) is raised, leaving the current batch queued.
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
