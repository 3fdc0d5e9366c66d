"""Aggregator storage: campaigns, per-campaign count cells, seen batch and report ids.

``AggregatorStore`` is the interface (async, so the PostgreSQL store fits it); the SQLite store
runs every statement on one dedicated thread, each ingestion in one transaction.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from deniable.aggregator.releases import ReleaseCheck, ReleaseChunk, ReleaseConflict, ReleaseState
from deniable.core.errors import ConfigurationError
from deniable.core.plumbing.sqlite import open_database
from deniable.v1 import deniable_pb2 as pb

T = TypeVar("T")
CountCells = Callable[[Sequence[bytes]], npt.NDArray[np.int64]]
DeviceCount = Callable[[Sequence[int], int], int]  # (count cells of a batch, messages) -> devices

DUPLICATE_REPORT: Final = int(pb.DUPLICATE_REPORT)
CAMPAIGN_CLOSED: Final = int(pb.CAMPAIGN_CLOSED)
SCHEMA_VERSION: Final = 1
PAGE_CACHE_KIB: Final = 64 * 1024


class StoreError(Exception):
    """Base of the errors a store raises on purpose."""


class CampaignExists(StoreError):
    """A campaign with this id already exists."""


class UnknownCampaign(StoreError):
    """No campaign with this id."""


class BatchConflict(StoreError):
    """A batch id seen before arrived with a different campaign or digest."""


@dataclass(frozen=True)
class BatchRecord:
    """What the store remembers about an ingested batch."""

    batch_id: str
    campaign_id: str
    digest: bytes
    counted: int


@dataclass(frozen=True)
class IngestOutcome:
    """Result of one ingestion: nothing changed if ``duplicate_batch``."""

    duplicate_batch: bool
    counted: int = 0
    rejected: dict[int, int] = field(default_factory=dict)


DELETED_WITH_CAMPAIGN: Final = ("counts", "rejections", "batches", "seen_reports", "retired", "releases")
"""Tables keyed by a campaign's ``seq``: emptied of it when the campaign is deleted."""


@dataclass(frozen=True)
class CampaignCounts:
    """A consistent snapshot of one campaign's tallies."""

    counts: list[int]
    n: int
    smallest_batch: int
    rejected: dict[int, int]
    batches: int
    releases: int = 0
    incomplete_releases: int = 0


class AggregatorStore(Protocol):
    """What the aggregator needs from storage; every implementation passes tests/aggregator's contract."""

    async def create_campaign(self, campaign: pb.Campaign) -> None:
        """Store a new campaign; CampaignExists if its id is taken."""
        ...

    async def get_campaign(self, campaign_id: str) -> pb.Campaign | None:
        """The campaign, or None."""
        ...

    async def list_campaigns(self) -> list[pb.Campaign]:
        """Every campaign, oldest first."""
        ...

    async def update_campaign(self, campaign: pb.Campaign) -> None:
        """Replace the description of an existing campaign (same id); UnknownCampaign otherwise."""
        ...

    async def find_batch(self, batch_id: str) -> BatchRecord | None:
        """The record of an already ingested batch, or None (a cheap pre-check before decrypting)."""
        ...

    async def delete_campaign(self, campaign_id: str) -> tuple[int, int]:
        """Remove a campaign with its counts, rejections, batches and seen report ids in one
        transaction: (reports counted, batches) it had; UnknownCampaign if there is none."""
        ...

    async def ingest(
        self,
        *,
        batch_id: str,
        campaign_id: str,
        digest: bytes,
        batch_size: int,
        valid_reports: Sequence[tuple[bytes, bytes]],
        rejected: Mapping[int, int],
        count_cells: CountCells,
        cells: int,
        devices: DeviceCount | None = None,
        release: ReleaseChunk | None = None,
        check_release: ReleaseCheck | None = None,
    ) -> IngestOutcome:
        """Count one batch atomically and idempotently.

        A chunk of a ``release`` is held apart until every chunk is in; the complete release is
        then counted as one batch (``check_release`` may refuse it: ReleaseConflict, see ADR 0023).

        ``valid_reports`` are (report_id, payload) pairs that decrypted and validated; report
        ids seen before in this campaign (or earlier in the batch) become DUPLICATE_REPORT
        rejections. Returns ``duplicate_batch=True`` and changes nothing for a known batch id
        with the same campaign and digest; BatchConflict if they differ; UnknownCampaign.
        """
        ...

    async def snapshot(self, campaign_id: str, cells: int) -> CampaignCounts:
        """Counts (``cells`` long), n, smallest batch, rejections and batches of one campaign."""
        ...

    async def retire_campaign(self, campaign_id: str) -> int:
        """Forget the campaign's report ids (retention ended) and mark it retired, so every later
        report of it is a CAMPAIGN_CLOSED rejection, never counted; idempotent; the ids removed."""
        ...

    async def report_id_count(self, campaign_id: str) -> int:
        """How many report ids the store keeps for the campaign (dedupe state; 0 once retired)."""
        ...

    async def retired(self) -> set[str]:
        """Ids of the retired campaigns."""
        ...

    async def ping(self) -> None:
        """Return when the store answers a trivial query; raise (any error) while it cannot (health)."""
        ...

    async def close(self) -> None:
        """Finish pending work and release the store."""
        ...


_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS campaigns (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    body BLOB NOT NULL,
    n INTEGER NOT NULL DEFAULT 0,
    smallest_batch INTEGER NOT NULL DEFAULT 0,
    batches INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS counts (
    campaign INTEGER NOT NULL REFERENCES campaigns(seq),
    cell INTEGER NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (campaign, cell)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rejections (
    campaign INTEGER NOT NULL REFERENCES campaigns(seq),
    reason INTEGER NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (campaign, reason)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS batches (
    batch_id TEXT PRIMARY KEY,
    campaign INTEGER NOT NULL REFERENCES campaigns(seq),
    digest BLOB NOT NULL,
    size INTEGER NOT NULL,
    counted INTEGER NOT NULL,
    rejected TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS seen_reports (
    campaign INTEGER NOT NULL,
    report_id BLOB NOT NULL,
    PRIMARY KEY (campaign, report_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS retired (
    campaign INTEGER PRIMARY KEY REFERENCES campaigns(seq)
);
CREATE TABLE IF NOT EXISTS releases (
    campaign INTEGER NOT NULL REFERENCES campaigns(seq),
    release_id TEXT NOT NULL,
    done INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL,
    PRIMARY KEY (campaign, release_id)
) WITHOUT ROWID;
"""


_INSERT_IDS_FROM_BLOB: Final = (
    "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?1)"
    " INSERT OR IGNORE INTO seen_reports (campaign, report_id)"
    " SELECT ?2, substr(?4, i * ?3 + 1, ?3) FROM n"
)
"""Insert report ids packed in one blob; parameters: count, campaign, width of an id, blob."""


def closed_split(
    retired: bool, rejected: Mapping[int, int], valid_reports: Sequence[tuple[bytes, bytes]]
) -> tuple[Mapping[int, int], Sequence[tuple[bytes, bytes]]]:
    """For a retired campaign every valid report becomes a CAMPAIGN_CLOSED rejection."""
    if not retired or not valid_reports:
        return rejected, valid_reports
    merged = dict(rejected)
    merged[CAMPAIGN_CLOSED] = merged.get(CAMPAIGN_CLOSED, 0) + len(valid_reports)
    return merged, ()


class SqliteAggregatorStore:
    """The embedded store: one SQLite file in WAL mode, fsync on every commit."""

    def __init__(self, path: Path) -> None:
        """Open (creating) the database; ConfigurationError if the file cannot be used."""
        self.path = path
        self._db = open_database(path)
        try:
            version = int(self._db.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise ConfigurationError(
                    f"database {path} has schema version {version}; this aggregator knows {SCHEMA_VERSION}"
                )
            self._db.executescript(_SCHEMA)
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            # Report-id look-ups land all over seen_reports: a larger page cache keeps them in memory.
            self._db.execute(f"PRAGMA cache_size = -{PAGE_CACHE_KIB}")
            self._db.execute(
                "CREATE TEMP TABLE IF NOT EXISTS incoming (report_id BLOB PRIMARY KEY) WITHOUT ROWID"
            )
        except sqlite3.Error as exc:
            self._db.close()
            raise ConfigurationError(f"cannot prepare database {path}: {exc}") from exc
        except ConfigurationError:
            self._db.close()
            raise
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aggregator-sqlite")
        self._closed = False

    async def _run(self, function: Callable[[], T]) -> T:
        """Run blocking SQLite work on the store's own thread (which also serialises it)."""
        if self._closed:
            raise StoreError("the store is closed")
        return await asyncio.get_running_loop().run_in_executor(self._thread, function)

    def _transaction(self, work: Callable[[sqlite3.Connection], T], write: bool) -> T:
        self._db.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            result = work(self._db)
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
        return result

    def _seq(self, db: sqlite3.Connection, campaign_id: str) -> int:
        row = db.execute("SELECT seq FROM campaigns WHERE id = ?", (campaign_id,)).fetchone()
        if row is None:
            raise UnknownCampaign(campaign_id)
        return int(row[0])

    async def create_campaign(self, campaign: pb.Campaign) -> None:
        """Store a new campaign; CampaignExists if its id is taken."""
        body = campaign.SerializeToString(deterministic=True)

        def work(db: sqlite3.Connection) -> None:
            try:
                db.execute("INSERT INTO campaigns (id, body) VALUES (?, ?)", (campaign.id, body))
            except sqlite3.IntegrityError as exc:
                raise CampaignExists(campaign.id) from exc

        await self._run(lambda: self._transaction(work, write=True))

    async def get_campaign(self, campaign_id: str) -> pb.Campaign | None:
        """The campaign, or None."""

        def work() -> bytes | None:
            row = self._db.execute("SELECT body FROM campaigns WHERE id = ?", (campaign_id,)).fetchone()
            return None if row is None else bytes(row[0])

        body = await self._run(work)
        return None if body is None else pb.Campaign.FromString(body)

    async def list_campaigns(self) -> list[pb.Campaign]:
        """Every campaign, oldest first."""

        def work() -> list[bytes]:
            return [bytes(r[0]) for r in self._db.execute("SELECT body FROM campaigns ORDER BY seq")]

        return [pb.Campaign.FromString(body) for body in await self._run(work)]

    async def update_campaign(self, campaign: pb.Campaign) -> None:
        """Replace the description of an existing campaign (same id); UnknownCampaign otherwise."""
        body = campaign.SerializeToString(deterministic=True)

        def work(db: sqlite3.Connection) -> None:
            if db.execute("UPDATE campaigns SET body = ? WHERE id = ?", (body, campaign.id)).rowcount != 1:
                raise UnknownCampaign(campaign.id)

        await self._run(lambda: self._transaction(work, write=True))

    async def delete_campaign(self, campaign_id: str) -> tuple[int, int]:
        """Remove a campaign and everything counted for it, atomically: (counted, batches)."""

        def work(db: sqlite3.Connection) -> tuple[int, int]:
            row = db.execute("SELECT seq, n, batches FROM campaigns WHERE id = ?", (campaign_id,)).fetchone()
            if row is None:
                raise UnknownCampaign(campaign_id)
            for table in DELETED_WITH_CAMPAIGN:
                db.execute(f"DELETE FROM {table} WHERE campaign = ?", (row[0],))  # noqa: S608 - fixed names
            db.execute("DELETE FROM campaigns WHERE seq = ?", (row[0],))
            return int(row[1]), int(row[2])

        return await self._run(lambda: self._transaction(work, write=True))

    async def find_batch(self, batch_id: str) -> BatchRecord | None:
        """The record of an already ingested batch, or None."""

        def work() -> BatchRecord | None:
            row = self._db.execute(
                "SELECT c.id, b.digest, b.counted FROM batches b JOIN campaigns c ON c.seq = b.campaign"
                " WHERE b.batch_id = ?",
                (batch_id,),
            ).fetchone()
            return None if row is None else BatchRecord(batch_id, str(row[0]), bytes(row[1]), int(row[2]))

        return await self._run(work)

    async def ingest(
        self,
        *,
        batch_id: str,
        campaign_id: str,
        digest: bytes,
        batch_size: int,
        valid_reports: Sequence[tuple[bytes, bytes]],
        rejected: Mapping[int, int],
        count_cells: CountCells,
        cells: int,
        devices: DeviceCount | None = None,
        release: ReleaseChunk | None = None,
        check_release: ReleaseCheck | None = None,
    ) -> IngestOutcome:
        """Count one batch atomically and idempotently (see ``AggregatorStore.ingest``)."""

        def work(db: sqlite3.Connection) -> IngestOutcome:
            seq = self._seq(db, campaign_id)
            seen = db.execute(
                "SELECT campaign, digest FROM batches WHERE batch_id = ?", (batch_id,)
            ).fetchone()
            if seen is not None:
                if int(seen[0]) != seq or bytes(seen[1]) != digest:
                    raise BatchConflict(f"batch id {batch_id!r} was already used for a different batch")
                return IngestOutcome(duplicate_batch=True)

            closed_rejected, reports = closed_split(
                db.execute("SELECT 1 FROM retired WHERE campaign = ?", (seq,)).fetchone() is not None,
                rejected,
                valid_reports,
            )
            # Within-batch repeats: keep the first occurrence.
            unique: dict[bytes, bytes] = {}
            for report_id, payload in reports:
                unique.setdefault(report_id, payload)
            duplicates = len(reports) - len(unique)

            # Repeats of earlier batches. Usually there are none: insert every id and check that
            # each one was new; only if some were not, undo and find them through a temp table.
            db.execute("SAVEPOINT fresh_ids")
            before = db.total_changes
            if unique:  # one statement over one blob of sorted ids: no Python per id, B-tree in order
                ids = sorted(unique)
                width = len(ids[0])
                if all(len(rid) == width for rid in ids):
                    db.execute(_INSERT_IDS_FROM_BLOB, (len(ids), seq, width, b"".join(ids)))
                else:
                    db.executemany(
                        "INSERT OR IGNORE INTO seen_reports (campaign, report_id) VALUES (?, ?)",
                        ((seq, rid) for rid in ids),
                    )
            if db.total_changes - before != len(unique):
                db.execute("ROLLBACK TO fresh_ids")
                db.execute("DELETE FROM incoming")
                db.executemany("INSERT INTO incoming (report_id) VALUES (?)", ((rid,) for rid in unique))
                known = db.execute(
                    "SELECT i.report_id FROM incoming i JOIN seen_reports s"
                    " ON s.campaign = ? AND s.report_id = i.report_id",
                    (seq,),
                ).fetchall()
                for (report_id,) in known:
                    del unique[bytes(report_id)]
                duplicates += len(known)
                db.execute(
                    "INSERT OR IGNORE INTO seen_reports (campaign, report_id)"
                    " SELECT ?, report_id FROM incoming",
                    (seq,),
                )
                db.execute("DELETE FROM incoming")
            db.execute("RELEASE fresh_ids")

            payloads = list(unique.values())
            counted = len(payloads)
            tally = np.zeros(cells, dtype=np.int64)
            if counted:
                tally = np.asarray(count_cells(payloads), dtype=np.int64)
                if tally.shape != (cells,) or bool(np.any(tally < 0)):
                    raise ValueError(f"count_cells returned shape {tally.shape}, expected ({cells},)")
            size = batch_size
            if release is not None:
                whole = _sqlite_release(db, seq, release, tally, counted, batch_size, check_release)
                tally, counted, size = whole if whole is not None else (tally, 0, 0)
            if counted:
                db.executemany(
                    "INSERT INTO counts (campaign, cell, count) VALUES (?, ?, ?)"
                    " ON CONFLICT (campaign, cell) DO UPDATE SET count = count + excluded.count",
                    ((seq, int(cell), int(tally[cell])) for cell in np.flatnonzero(tally)),
                )

            all_rejected = {int(reason): int(count) for reason, count in closed_rejected.items() if count}
            if duplicates:
                all_rejected[DUPLICATE_REPORT] = all_rejected.get(DUPLICATE_REPORT, 0) + duplicates
            db.executemany(
                "INSERT INTO rejections (campaign, reason, count) VALUES (?, ?, ?)"
                " ON CONFLICT (campaign, reason) DO UPDATE SET count = count + excluded.count",
                ((seq, reason, count) for reason, count in all_rejected.items()),
            )

            # A report is hidden only among the reports counted with it: rejected and repeated
            # ones hide nobody, so the effective shuffle size is at most the counted number.
            # Multi-message mechanisms: the shuffle hides devices, counted by ``devices``.
            effective = min(size, counted)
            if devices is not None and counted:
                effective = min(effective, devices([int(c) for c in tally], counted))
            db.execute(
                "UPDATE campaigns SET n = n + ?, batches = batches + ?,"
                " smallest_batch = CASE WHEN ? = 0 THEN smallest_batch"
                " WHEN smallest_batch = 0 OR ? < smallest_batch THEN ? ELSE smallest_batch END"
                " WHERE seq = ?",
                (counted, int(size > 0 or release is None), effective, effective, effective, seq),
            )
            db.execute(
                "INSERT INTO batches (batch_id, campaign, digest, size, counted, rejected)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (batch_id, seq, digest, batch_size, counted, json.dumps(all_rejected, sort_keys=True)),
            )
            return IngestOutcome(duplicate_batch=False, counted=counted, rejected=all_rejected)

        return await self._run(lambda: self._transaction(work, write=True))

    async def snapshot(self, campaign_id: str, cells: int) -> CampaignCounts:
        """Counts (``cells`` long), n, smallest batch, rejections and batches of one campaign."""

        def work(db: sqlite3.Connection) -> CampaignCounts:
            row = db.execute(
                "SELECT seq, n, smallest_batch, batches FROM campaigns WHERE id = ?", (campaign_id,)
            ).fetchone()
            if row is None:
                raise UnknownCampaign(campaign_id)
            seq = int(row[0])
            counts = [0] * cells
            for cell, count in db.execute("SELECT cell, count FROM counts WHERE campaign = ?", (seq,)):
                if not 0 <= cell < cells:
                    raise ValueError(f"campaign {campaign_id} has count cell {cell} outside 0..{cells - 1}")
                counts[cell] = int(count)
            rejected = {
                int(reason): int(count)
                for reason, count in db.execute(
                    "SELECT reason, count FROM rejections WHERE campaign = ? ORDER BY reason", (seq,)
                )
            }
            done = dict(
                db.execute("SELECT done, COUNT(*) FROM releases WHERE campaign = ? GROUP BY done", (seq,))
            )
            return CampaignCounts(
                counts=counts,
                n=int(row[1]),
                smallest_batch=int(row[2]),
                rejected=rejected,
                batches=int(row[3]),
                releases=int(done.get(1, 0)),
                incomplete_releases=int(done.get(0, 0)),
            )

        return await self._run(lambda: self._transaction(work, write=False))

    async def retire_campaign(self, campaign_id: str) -> int:
        """Forget the campaign's report ids and mark it retired (see ``AggregatorStore``)."""

        def work(db: sqlite3.Connection) -> int:
            seq = self._seq(db, campaign_id)
            db.execute("INSERT OR IGNORE INTO retired (campaign) VALUES (?)", (seq,))
            return db.execute("DELETE FROM seen_reports WHERE campaign = ?", (seq,)).rowcount

        return await self._run(lambda: self._transaction(work, write=True))

    async def report_id_count(self, campaign_id: str) -> int:
        """How many report ids the store keeps for the campaign."""

        def work(db: sqlite3.Connection) -> int:
            seq = self._seq(db, campaign_id)
            row = db.execute("SELECT count(*) FROM seen_reports WHERE campaign = ?", (seq,)).fetchone()
            return int(row[0])

        return await self._run(lambda: self._transaction(work, write=False))

    async def retired(self) -> set[str]:
        """Ids of the retired campaigns."""

        def work() -> set[str]:
            rows = self._db.execute("SELECT c.id FROM retired r JOIN campaigns c ON c.seq = r.campaign")
            return {str(r[0]) for r in rows}

        return await self._run(work)

    async def ping(self) -> None:
        """One trivial read on the store's thread."""
        await self._run(lambda: self._db.execute("SELECT 1").fetchone())

    async def close(self) -> None:
        """Wait for running work, then close the connection (idempotent)."""
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(None, self._thread.shutdown, True)
        self._db.close()


def _sqlite_release(
    db: sqlite3.Connection,
    seq: int,
    chunk: ReleaseChunk,
    tally: npt.NDArray[np.int64],
    counted: int,
    size: int,
    check: ReleaseCheck | None,
) -> tuple[npt.NDArray[np.int64], int, int] | None:
    """Hold one chunk's counts with its release; the complete release's (counts, counted, size)."""
    row = db.execute(
        "SELECT done, state FROM releases WHERE campaign = ? AND release_id = ?", (seq, chunk.release_id)
    ).fetchone()
    if row is not None and int(row[0]):
        raise ReleaseConflict(f"release {chunk.release_id[:80]!r} is already complete")
    state = ReleaseState.loads(str(row[1])) if row is not None else ReleaseState(chunk.count, chunk.messages)
    complete = state.add(chunk, [int(c) for c in tally], counted, size)
    if complete and check is not None and (problem := check(state.counts, state.counted)):
        raise ReleaseConflict(f"release {chunk.release_id[:80]!r} is refused: {problem}")
    db.execute(
        "INSERT INTO releases (campaign, release_id, done, state) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (campaign, release_id) DO UPDATE SET done = excluded.done, state = excluded.state",
        (seq, chunk.release_id, int(complete), state.dumps()),
    )
    if not complete:
        return None
    return np.asarray(state.counts, dtype=np.int64), state.counted, state.size
