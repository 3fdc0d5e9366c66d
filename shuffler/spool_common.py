"""What the SQLite and PostgreSQL spools share above their SQL: argument checks, grouping, records.

Both keep the segment layout of ``columns``; each implements only its storage steps (``_form``,
``_append_segments``, ``load_wire``, ``batch_ids``) and inherits the rest of ``SpoolStore``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from deniable.shuffler.columns import U32, Columns, parse_batch_wire, segments_of
from deniable.shuffler.spool import BatchRecord, Envelope, FormedBatch, Permutation


@dataclass(frozen=True)
class FormRequest:
    """One batch formation: up to ``limit`` oldest reports of a campaign, none unless ``at_least``.

    ``sizes``: the chunks of one permutation (None: one batch of what is taken); ``whole``: the
    release must end on a request (segment) boundary.
    """

    campaign_id: str
    sizes: list[int] | None
    limit: int
    at_least: int
    permutation: Permutation
    whole: bool = False


@dataclass
class ChunkGather:
    """The reports at release positions ``own`` of one chunk, picked from the segments in one pass.

    Feed every segment of the release in stored order; only this chunk's reports are copied, so a
    spool holds one chunk (plus one segment) while forming a release, never the whole release. The
    permutation is still one permutation of the whole release (``release_slices``): ``own`` is this
    chunk's slice of it.
    """

    own: npt.NDArray[np.int64]
    _by_position: npt.NDArray[np.int64] = field(init=False)
    _wanted: npt.NDArray[np.int64] = field(init=False)
    _pieces: list[Columns] = field(init=False, default_factory=list)
    _base: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        """Sort the chunk's positions once: each segment then takes one contiguous run of them."""
        self._by_position = np.argsort(self.own, kind="stable")
        self._wanted = self.own[self._by_position]

    def feed(self, segment: Columns) -> None:
        """Keep (a copy of) this segment's reports that belong to the chunk."""
        low, high = np.searchsorted(self._wanted, [self._base, self._base + segment.count])
        if high > low:
            self._pieces.append(segment.take(self._wanted[low:high] - self._base))
        self._base += segment.count

    def finish(self) -> tuple[Columns, npt.NDArray[np.int64]]:
        """(the chunk's reports in stored order, the order that puts them in permuted order)."""
        own = self.own
        rows = (
            Columns.concat(self._pieces)
            if self._pieces
            else Columns(own[:0].astype(U32), own[:0].astype(U32), np.empty(0, np.uint8))
        )
        self._pieces = []
        if rows.count != own.size:
            raise RuntimeError("pending segments changed while a release was formed")
        return rows, np.argsort(self._by_position).astype(np.int64)


class SegmentStoreBase(ABC):
    """The SpoolStore methods written once for every segment spool."""

    @abstractmethod
    def _form(self, ask: FormRequest) -> list[FormedBatch]:
        """Take up to ``limit`` oldest reports (none if fewer than ``at_least``), permute, cut, store."""

    @abstractmethod
    def _append_segments(self, segments: list[tuple[str, Columns]]) -> None:
        """Store the segments durably, in one transaction."""

    @abstractmethod
    def load_wire(self, batch_id: str) -> tuple[bytes, int] | None:
        """The batch as serialised ``ShuffledBatch`` bytes and its report count, or None."""

    @abstractmethod
    def batch_ids(self, campaign_id: str | None = None) -> list[str]:
        """Ids of unacknowledged batches in the order they were formed."""

    def append(self, reports: Sequence[Envelope]) -> None:
        """Insert every report durably: one segment per campaign, order kept (nothing if empty)."""
        if reports:
            self._append_segments(segments_of(reports))

    def form_batch(
        self, campaign_id: str, max_reports: int, permutation: Permutation, min_reports: int = 1
    ) -> BatchRecord | None:
        """Move the oldest ``max_reports`` pending reports into a permuted batch in one transaction."""
        if max_reports < 1:
            raise ValueError("max_reports must be at least 1")
        formed = self._form(FormRequest(campaign_id, None, max_reports, max(1, min_reports), permutation))
        return self._record(formed[0]) if formed else None

    def form_batches(
        self, campaign_id: str, sizes: Sequence[int], permutation: Permutation
    ) -> list[BatchRecord]:
        """Several batches from one permutation of the oldest sum(sizes) pending reports."""
        return [self._record(b) for b in self.form_batch_sizes(campaign_id, sizes, permutation)]

    def form_batch_sizes(
        self, campaign_id: str, sizes: Sequence[int], permutation: Permutation, whole: bool = False
    ) -> list[FormedBatch]:
        """``form_batches`` without building an envelope per report; [] unless every size is filled."""
        if not sizes or min(sizes) < 1:
            raise ValueError("batch sizes must be at least 1")
        total = sum(sizes)
        return self._form(FormRequest(campaign_id, list(sizes), total, total, permutation, whole))

    def load_batch(self, batch_id: str) -> BatchRecord | None:
        """One unacknowledged batch with its reports in the stored (permuted) order."""
        wire = self.load_wire(batch_id)
        return None if wire is None else parse_batch_wire(wire[0])

    def unacknowledged_batches(self, campaign_id: str | None = None) -> list[BatchRecord]:
        """Every unacknowledged batch, oldest first."""
        batches = (self.load_batch(batch_id) for batch_id in self.batch_ids(campaign_id))
        return [b for b in batches if b is not None]

    def _record(self, batch: FormedBatch) -> BatchRecord:
        """The formed batch as a record (read back when its wire bytes were not kept)."""
        stored = self.load_batch(batch.batch_id) if not batch.wire else None
        return stored if stored is not None else parse_batch_wire(batch.wire)
