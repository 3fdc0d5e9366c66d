"""The one ingest transaction both stores run: look up, dedupe across batches, write (ADR 0029).

Each store implements ``IngestStatements`` with its own SQL, opens a transaction and awaits
``apply_plan`` inside it. The SQLite statements never suspend, so its store drives the same
coroutine to completion on its database thread (``finish_now``); PostgreSQL awaits them.
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping
from typing import Any, Protocol, TypeVar, cast

from deniable.aggregator.ingest_plan import Contribution, IngestOutcome, IngestPlan, new_release_state
from deniable.aggregator.releases import ReleaseConflict, ReleaseState

T = TypeVar("T")


class StoreError(Exception):
    """Base of the errors a store raises on purpose."""


class UnknownCampaign(StoreError):
    """No campaign with this id."""


class BatchConflict(StoreError):
    """A batch id seen before arrived with a different campaign or digest."""


class BelowNMin(StoreError):
    """After decryption, validation and every dedupe the batch counts fewer distinct devices than
    n_min: nothing of it is stored (the transaction is rolled back)."""

    def __init__(self, devices: int, least: int) -> None:
        super().__init__(f"{devices} distinct valid devices, below n_min ({least})")
        self.devices = devices
        self.least = least


class IngestStatements(Protocol):
    """The storage steps of one ingestion, all inside one open transaction of one store."""

    async def lock_campaign(self, campaign_id: str) -> int | None:
        """The campaign's seq, its row locked against concurrent ingestions; None if unknown."""
        ...

    async def batch_record(self, batch_id: str) -> tuple[int, bytes] | None:
        """(campaign seq, digest) of an already ingested batch id, or None."""
        ...

    async def is_retired(self, seq: int) -> bool:
        """Whether the campaign's retention has ended (its report ids are gone)."""
        ...

    async def record_report_ids(self, seq: int, report_ids: list[bytes]) -> list[bytes]:
        """Record the (distinct, sorted) ids; return those recorded before (by earlier batches)."""
        ...

    async def release_state(self, seq: int, release_id: str) -> tuple[bool, str] | None:
        """(done, stored state) of a release, locked for update; None before its first chunk."""
        ...

    async def save_release(self, seq: int, release_id: str, done: bool, state: str) -> None:
        """Insert or replace a release's state."""
        ...

    async def add_counts(self, seq: int, cells: list[int], counts: list[int]) -> None:
        """Add ``counts`` to the campaign's count ``cells``."""
        ...

    async def add_rejections(self, seq: int, rejected: Mapping[int, int]) -> None:
        """Add rejection counts by reason."""
        ...

    async def add_to_campaign(self, seq: int, counted: int, effective: int, batches: int) -> None:
        """Add to n and batches; lower smallest_batch to ``effective`` unless that is 0."""
        ...

    async def insert_batch(self, plan: IngestPlan, seq: int, counted: int) -> None:
        """Remember the batch id (BatchConflict if another transaction took it meanwhile)."""
        ...


async def apply_plan(statements: IngestStatements, plan: IngestPlan) -> IngestOutcome:
    """Count one planned batch atomically and idempotently (the caller holds the transaction)."""
    seq = await statements.lock_campaign(plan.campaign_id)
    if seq is None:
        raise UnknownCampaign(plan.campaign_id)
    seen = await statements.batch_record(plan.batch_id)
    if seen is not None:
        if seen != (seq, plan.digest):
            raise BatchConflict(f"batch id {plan.batch_id!r} was already used for a different batch")
        return IngestOutcome(duplicate_batch=True)
    if await statements.is_retired(seq):
        plan = plan.closed()
    if plan.reports:
        plan = plan.without(await statements.record_report_ids(seq, plan.report_ids()))
    gained = await _contribution(statements, seq, plan)
    if 0 < gained.effective < plan.min_devices:
        # Duplicates, replays and garbage do not hide anyone: n_min counts devices (issue 20).
        raise BelowNMin(gained.effective, plan.min_devices)
    cells, counts = gained.nonzero_cells()
    if cells:
        await statements.add_counts(seq, cells, counts)
    rejected = plan.all_rejected()
    if rejected:
        await statements.add_rejections(seq, rejected)
    await statements.add_to_campaign(seq, gained.counted, gained.effective, gained.batches)
    await statements.insert_batch(plan, seq, gained.counted)
    return IngestOutcome(
        duplicate_batch=False, counted=gained.counted, rejected=rejected, devices=gained.effective
    )


async def _contribution(statements: IngestStatements, seq: int, plan: IngestPlan) -> Contribution:
    """The batch's contribution; a release chunk is held with its release until all are in."""
    chunk = plan.release
    if chunk is None:
        return plan.contribution()
    stored = await statements.release_state(seq, chunk.release_id)
    if stored is not None and stored[0]:
        raise ReleaseConflict(f"release {chunk.release_id[:80]!r} is already complete")
    state = ReleaseState.loads(stored[1]) if stored is not None else new_release_state(chunk)
    complete = plan.join_release(state)
    await statements.save_release(seq, chunk.release_id, complete, state.dumps())
    return plan.contribution(state if complete else None)


def finish_now(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that never suspends (its awaits are plain calls) to its end, here and now."""
    try:
        coroutine.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    coroutine.close()
    raise RuntimeError("the ingest pipeline suspended on a store whose statements must not")
