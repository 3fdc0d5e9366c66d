"""Ingest as a pure plan: what one batch adds to its campaign, decided without touching storage.

The domain rules live here once for every store: within-batch dedupe (first occurrence wins), a
retired campaign's reports become CAMPAIGN_CLOSED, cross-batch repeats become DUPLICATE_REPORT,
a release chunk counts only with its complete release (ADR 0023), and the effective batch size
the privacy statement depends on. A store only looks up and writes (``store_pipeline``, ADR 0029).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Final

import numpy as np
import numpy.typing as npt

from deniable.aggregator.releases import ReleaseCheck, ReleaseConflict, ReleaseState
from deniable.core.batches import ReleaseChunk
from deniable.v1 import deniable_pb2 as pb

CountCells = Callable[[Sequence[bytes]], npt.NDArray[np.int64]]
DeviceCount = Callable[[Sequence[int], int], int]  # (count cells of a batch, messages) -> devices

DUPLICATE_REPORT: Final = int(pb.DUPLICATE_REPORT)
CAMPAIGN_CLOSED: Final = int(pb.CAMPAIGN_CLOSED)


@dataclass(frozen=True)
class Counting:
    """How a campaign counts its reports: cells, the tally, devices (multi-message), release check."""

    cells: int
    count_cells: CountCells
    devices: DeviceCount | None = None
    check_release: ReleaseCheck | None = None

    def tally(self, payloads: Sequence[bytes]) -> npt.NDArray[np.int64]:
        """Count cells of validated payloads, checked to be ``cells`` long and non-negative."""
        if not payloads:
            return np.zeros(self.cells, dtype=np.int64)
        tally = np.asarray(self.count_cells(payloads), dtype=np.int64)
        if tally.shape != (self.cells,) or bool(np.any(tally < 0)):
            raise ValueError(f"count_cells returned shape {tally.shape}, expected ({self.cells},)")
        return tally

    def effective_size(self, tally: npt.NDArray[np.int64], counted: int, size: int) -> int:
        """How many reports (devices, for multi-message) one counted report hides among.

        Rejected and repeated reports hide nobody, so it is at most the counted number.
        """
        effective = min(size, counted)
        if self.devices is not None and counted:
            effective = min(effective, self.devices([int(c) for c in tally], counted))
        return effective


@dataclass(frozen=True)
class Contribution:
    """What one ingested batch adds to its campaign's row and count cells."""

    tally: npt.NDArray[np.int64]
    counted: int
    effective: int
    batches: int

    def nonzero_cells(self) -> tuple[list[int], list[int]]:
        """(cells, counts) of the cells this batch adds to; none when nothing is counted."""
        if not self.counted:
            return [], []
        cells = [int(c) for c in np.flatnonzero(self.tally)]
        return cells, [int(self.tally[c]) for c in cells]


@dataclass(frozen=True)
class IngestOutcome:
    """Result of one ingestion: nothing changed if ``duplicate_batch``."""

    duplicate_batch: bool
    counted: int = 0
    rejected: dict[int, int] = field(default_factory=dict)
    devices: int = 0
    """Distinct valid devices counted (0 while a release chunk is held back)."""


@dataclass(frozen=True)
class IngestPlan:
    """One batch, screened and deduplicated within itself, with its tally; pure data."""

    batch_id: str
    campaign_id: str
    digest: bytes
    batch_size: int
    reports: Mapping[bytes, bytes]
    """Valid reports to count, report id -> payload, first occurrence in the batch kept."""
    rejected: Mapping[int, int]
    duplicates: int
    """Repeated report ids: within the batch, plus earlier batches' once ``without`` ran."""
    tally: npt.NDArray[np.int64]
    counting: Counting
    release: ReleaseChunk | None = None
    min_devices: int = 0
    """n_min in distinct valid devices after every dedupe; 0 when the operator authorised less."""

    @property
    def counted(self) -> int:
        """Reports this batch counts (before release hold-back)."""
        return len(self.reports)

    def report_ids(self) -> list[bytes]:
        """The ids to record, sorted (index order: one walk of the B-tree)."""
        return sorted(self.reports)

    def closed(self) -> IngestPlan:
        """The plan for a retired campaign: every valid report, repeats too, is CAMPAIGN_CLOSED."""
        gone = len(self.reports) + self.duplicates
        if not gone:
            return self
        merged = dict(self.rejected)
        merged[CAMPAIGN_CLOSED] = merged.get(CAMPAIGN_CLOSED, 0) + gone
        empty = np.zeros(self.counting.cells, dtype=np.int64)
        return replace(self, reports={}, rejected=merged, duplicates=0, tally=empty)

    def without(self, known: Collection[bytes]) -> IngestPlan:
        """The plan once ``known`` ids (seen in earlier batches) are DUPLICATE_REPORT, recounted."""
        if not known:
            return self
        drop = set(known)
        reports = {rid: payload for rid, payload in self.reports.items() if rid not in drop}
        tally = self.counting.tally(list(reports.values()))
        return replace(self, reports=reports, duplicates=self.duplicates + len(drop), tally=tally)

    def all_rejected(self) -> dict[int, int]:
        """Rejections by reason, repeats included; zero counts left out."""
        rejected = {int(reason): int(count) for reason, count in self.rejected.items() if count}
        if self.duplicates:
            rejected[DUPLICATE_REPORT] = rejected.get(DUPLICATE_REPORT, 0) + self.duplicates
        return rejected

    def rejected_json(self) -> str:
        """Rejections as the batch record stores them."""
        return json.dumps(self.all_rejected(), sort_keys=True)

    def join_release(self, state: ReleaseState) -> bool:
        """Add this chunk to its release's ``state``; True once complete. ReleaseConflict if refused."""
        assert self.release is not None
        chunk = self.release
        complete = state.add(chunk, [int(c) for c in self.tally], self.counted, self.batch_size)
        check = self.counting.check_release
        if complete and check is not None and (problem := check(state.counts, state.counted)):
            raise ReleaseConflict(f"release {chunk.release_id[:80]!r} is refused: {problem}")
        return complete

    def contribution(self, whole_release: ReleaseState | None = None) -> Contribution:
        """What the campaign gains: this batch; for a chunk, nothing until ``whole_release`` is in."""
        if self.release is None:
            tally, counted, size = self.tally, self.counted, self.batch_size
        elif whole_release is None:
            return Contribution(self.tally, counted=0, effective=0, batches=0)
        else:
            tally = np.asarray(whole_release.counts, dtype=np.int64)
            counted, size = whole_release.counted, whole_release.size
        effective = self.counting.effective_size(tally, counted, size)
        return Contribution(tally, counted, effective, batches=int(size > 0 or self.release is None))


def new_release_state(chunk: ReleaseChunk) -> ReleaseState:
    """The state of a release whose first chunk arrives."""
    return ReleaseState(chunk.count, chunk.messages)


def plan_ingest(
    *,
    batch_id: str,
    campaign_id: str,
    digest: bytes,
    batch_size: int,
    valid_reports: Sequence[tuple[bytes, bytes]],
    rejected: Mapping[int, int],
    counting: Counting,
    release: ReleaseChunk | None = None,
    min_devices: int = 0,
) -> IngestPlan:
    """Plan one batch: dedupe within it (first occurrence kept) and tally what remains."""
    unique: dict[bytes, bytes] = {}
    for report_id, payload in valid_reports:
        unique.setdefault(report_id, payload)
    return IngestPlan(
        batch_id=batch_id,
        campaign_id=campaign_id,
        digest=digest,
        batch_size=batch_size,
        reports=unique,
        rejected=dict(rejected),
        duplicates=len(valid_reports) - len(unique),
        tally=counting.tally(list(unique.values())),
        counting=counting,
        release=release,
        min_devices=min_devices,
    )
