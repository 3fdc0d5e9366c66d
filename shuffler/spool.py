"""The shuffler's spool interface (``SpoolStore``) and the records it deals in.

Nothing here identifies a sender: a pending report is (campaign id, key id, ciphertext) and the
arrival order exists only until batch formation moves the reports, permuted, into batches. Two
implementations keep one segment layout: ``segments.SegmentSpool`` (SQLite, the default) and
``spool_postgres.PostgresSpool`` (shared by several shufflers); see ADR 0026.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from deniable.core.rng import default_rng
from deniable.v1 import deniable_pb2 as pb

Permutation = Callable[[int], "npt.NDArray[np.int64] | Sequence[int]"]
"""Given n, a permutation of range(n): ``default_rng().permutation`` in production."""


class Envelope(NamedTuple):
    """One sealed report as the shuffler sees it: campaign, key id, opaque ciphertext."""

    campaign_id: str
    key_id: int
    ciphertext: bytes


@dataclass(frozen=True)
class BatchRecord:
    """A permuted batch: its id (stable across retries), campaign, ordered reports and digest."""

    batch_id: str
    campaign_id: str
    reports: tuple[Envelope, ...]
    digest: bytes
    release_id: str = ""
    chunk_index: int = 0
    chunk_count: int = 0
    release_messages: int = 0


@dataclass(frozen=True)
class CampaignSpoolStats:
    """Reports of one campaign still waiting for a batch (pending) or for an ack (in flight)."""

    campaign_id: str
    pending: int
    in_flight: int


def new_batch_id() -> str:
    """128 bits from the CSPRNG, hex: unguessable and unrelated to the batch's contents."""
    return default_rng().bytes(16).hex()


@dataclass(frozen=True)
class FormedBatch:
    """A batch just formed: its id and number of reports (what the batcher needs), and its message.

    ``wire`` may be empty when the store did not keep the bytes after writing them.
    """

    batch_id: str
    campaign_id: str
    report_count: int
    digest: bytes
    wire: bytes | bytearray


class SpoolUnavailable(OSError):
    """The spool's database cannot be reached or refused a write: handled like a full disk."""


class SpoolStore(Protocol):
    """Storage interface of the shuffler; every method is durable when it returns."""

    def append(self, reports: Sequence[Envelope]) -> None:
        """Add reports to the pending set in one transaction."""

    def pending_count(self, campaign_id: str) -> int:
        """Reports of the campaign not yet in a batch."""

    def form_batch(
        self, campaign_id: str, max_reports: int, permutation: Permutation, min_reports: int = 1
    ) -> BatchRecord | None:
        """Move up to ``max_reports`` pending reports into a new batch in permuted order.

        Returns None, changing nothing, when fewer than ``min_reports`` (at least 1) are pending.
        """

    def form_batches(
        self, campaign_id: str, sizes: Sequence[int], permutation: Permutation
    ) -> list[BatchRecord]:
        """Move the oldest sum(sizes) pending reports into len(sizes) batches in one transaction.

        One permutation over all of them, then consecutive slices: which batch a report lands in
        says nothing about when it arrived. Returns [] changing nothing if fewer are pending.
        """

    def form_batch_sizes(
        self, campaign_id: str, sizes: Sequence[int], permutation: Permutation, whole: bool = False
    ) -> list[FormedBatch]:
        """``form_batches`` without building an envelope per report (the batcher's path).

        ``whole``: the release must end on a request boundary, so no request is split across
        releases; ValueError (SQLite) or [] (PostgreSQL, where another shuffler may have moved
        the boundary) if it does not.
        """

    def pending_segment_counts(self, campaign_id: str) -> list[int]:
        """Reports per pending segment (one per request), oldest first."""

    def batch_ids(self, campaign_id: str | None = None) -> list[str]:
        """Ids of unacknowledged batches, oldest first."""

    def load_wire(self, batch_id: str) -> tuple[bytes, int] | None:
        """The batch as serialised ``ShuffledBatch`` bytes and its report count, or None."""

    def load_batch(self, batch_id: str) -> BatchRecord | None:
        """One unacknowledged batch with its reports in permuted order, or None."""

    def unacknowledged_batches(self, campaign_id: str | None = None) -> list[BatchRecord]:
        """Every unacknowledged batch, oldest first, to (re)send with the same batch id."""

    def delete_batch(self, batch_id: str) -> bool:
        """Forget a batch once the aggregator acknowledged it; False if it was not there."""

    def stats(self) -> list[CampaignSpoolStats]:
        """Pending and in-flight counts of every campaign that has either, sorted by id."""

    def cache_campaign(self, campaign: pb.Campaign) -> None:
        """Remember a campaign so that a restart can validate without the aggregator."""

    def cached_campaign(self, campaign_id: str) -> pb.Campaign | None:
        """The cached campaign, or None."""

    def cached_campaigns(self) -> list[pb.Campaign]:
        """Every cached campaign, sorted by id."""

    def scrub(self) -> None:
        """Best effort to leave no copy of pre-permutation row order in the store's files."""

    def close(self) -> None:
        """Release the store; later calls fail."""


def envelopes_of(reports: Iterable[pb.EncryptedReport]) -> list[Envelope]:
    """Protobuf reports as envelopes (copies the three fields, nothing else)."""
    return [Envelope(r.campaign_id, r.key_id, r.ciphertext) for r in reports]
