"""Aggregator storage: campaigns, per-campaign count cells, seen batch and report ids.

``AggregatorStore`` is the interface (async, so the PostgreSQL store fits it); the SQLite store
runs every statement on one dedicated thread, each ingestion in one transaction.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol, TypeVar

from deniable.aggregator.ingest_plan import IngestOutcome, IngestPlan
from deniable.aggregator.store_pipeline import (
    BatchConflict,
    StoreError,
    UnknownCampaign,
    apply_plan,
    finish_now,
)
from deniable.core.errors import ConfigurationError
from deniable.core.plumbing.sqlite import open_database
from deniable.v1 import deniable_pb2 as pb

T = TypeVar("T")

SCHEMA_VERSION: Final = 2  # 2: tombstones of deleted campaign ids
PAGE_CACHE_KIB: Final = 64 * 1024
__all__ = [  # the store's errors and outcome are defined with the pipeline, re-exported here
    "DELETED_WITH_CAMPAIGN",
    "SCHEMA_VERSION",
    "AggregatorStore",
    "BatchConflict",
    "BatchRecord",
    "CampaignCounts",
    "CampaignExists",
    "CampaignIdTombstoned",
    "IngestOutcome",
    "SqliteAggregatorStore",
    "StoreError",
    "UnknownCampaign",
]


class CampaignExists(StoreError):
    """A campaign with this id already exists."""


class CampaignIdTombstoned(CampaignExists):
    """A campaign with this id existed and was deleted: ids are never reused (ADR 0031)."""


@dataclass(frozen=True)
class BatchRecord:
    """What the store remembers about an ingested batch."""

    batch_id: str
    campaign_id: str
    digest: bytes
    counted: int


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
        """Store a new campaign; CampaignExists if its id is taken, CampaignIdTombstoned if a
        campaign of that id was ever deleted."""
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
        transaction, leaving a tombstone of its id: (reports counted, batches) it had;
        UnknownCampaign if there is none."""
        ...

    async def apply(self, plan: IngestPlan) -> IngestOutcome:
        """Count one planned batch atomically and idempotently (``store_pipeline.apply_plan``).

        Report ids seen before in this campaign become DUPLICATE_REPORT rejections; a release
        chunk is held apart until its release is complete (ReleaseConflict, ADR 0023). Returns
        ``duplicate_batch=True`` and changes nothing for a known batch id with the same campaign
        and digest; BatchConflict if they differ; UnknownCampaign.
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
CREATE TABLE IF NOT EXISTS tombstones (
    id TEXT PRIMARY KEY,
    deleted_unix INTEGER NOT NULL
) WITHOUT ROWID;
"""


_INSERT_IDS_FROM_BLOB: Final = (
    "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < ?1)"
    " INSERT OR IGNORE INTO seen_reports (campaign, report_id)"
    " SELECT ?2, substr(?4, i * ?3 + 1, ?3) FROM n"
)
"""Insert report ids packed in one blob; parameters: count, campaign, width of an id, blob."""


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
            if db.execute("SELECT 1 FROM tombstones WHERE id = ?", (campaign.id,)).fetchone():
                raise CampaignIdTombstoned(campaign.id)
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
            db.execute(
                "INSERT OR IGNORE INTO tombstones (id, deleted_unix) VALUES (?, ?)",
                (campaign_id, int(time.time())),
            )
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

    async def apply(self, plan: IngestPlan) -> IngestOutcome:
        """Count one planned batch atomically and idempotently (see ``AggregatorStore.apply``)."""

        def work(db: sqlite3.Connection) -> IngestOutcome:
            return finish_now(apply_plan(_SqliteIngest(db), plan))

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


class _SqliteIngest:
    """SQLite's statements for ``apply_plan``: plain calls on the open transaction, never suspending."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    async def lock_campaign(self, campaign_id: str) -> int | None:
        """The campaign's seq (BEGIN IMMEDIATE already holds the only write lock)."""
        row = self._db.execute("SELECT seq FROM campaigns WHERE id = ?", (campaign_id,)).fetchone()
        return None if row is None else int(row[0])

    async def batch_record(self, batch_id: str) -> tuple[int, bytes] | None:
        """(campaign seq, digest) of a known batch id."""
        row = self._db.execute(
            "SELECT campaign, digest FROM batches WHERE batch_id = ?", (batch_id,)
        ).fetchone()
        return None if row is None else (int(row[0]), bytes(row[1]))

    async def is_retired(self, seq: int) -> bool:
        """Whether the campaign is retired."""
        return self._db.execute("SELECT 1 FROM retired WHERE campaign = ?", (seq,)).fetchone() is not None

    async def record_report_ids(self, seq: int, report_ids: list[bytes]) -> list[bytes]:
        """Usually every id is new: insert them all and check; only if some were not, undo and
        find them through a temp table."""
        db = self._db
        db.execute("SAVEPOINT fresh_ids")
        before = db.total_changes
        width = len(report_ids[0])
        if all(len(rid) == width for rid in report_ids):  # one statement over one blob of sorted ids
            db.execute(_INSERT_IDS_FROM_BLOB, (len(report_ids), seq, width, b"".join(report_ids)))
        else:
            db.executemany(
                "INSERT OR IGNORE INTO seen_reports (campaign, report_id) VALUES (?, ?)",
                ((seq, rid) for rid in report_ids),
            )
        known: list[bytes] = []
        if db.total_changes - before != len(report_ids):
            db.execute("ROLLBACK TO fresh_ids")
            known = self._insert_through_incoming(seq, report_ids)
        db.execute("RELEASE fresh_ids")
        return known

    def _insert_through_incoming(self, seq: int, report_ids: list[bytes]) -> list[bytes]:
        """Find the ids seen before with a join on the temp table, then record the rest."""
        db = self._db
        db.execute("DELETE FROM incoming")
        db.executemany("INSERT INTO incoming (report_id) VALUES (?)", ((rid,) for rid in report_ids))
        known = db.execute(
            "SELECT i.report_id FROM incoming i JOIN seen_reports s"
            " ON s.campaign = ? AND s.report_id = i.report_id",
            (seq,),
        ).fetchall()
        db.execute(
            "INSERT OR IGNORE INTO seen_reports (campaign, report_id) SELECT ?, report_id FROM incoming",
            (seq,),
        )
        db.execute("DELETE FROM incoming")
        return [bytes(row[0]) for row in known]

    async def release_state(self, seq: int, release_id: str) -> tuple[bool, str] | None:
        """(done, state) of a release (the write lock is already held)."""
        row = self._db.execute(
            "SELECT done, state FROM releases WHERE campaign = ? AND release_id = ?", (seq, release_id)
        ).fetchone()
        return None if row is None else (bool(row[0]), str(row[1]))

    async def save_release(self, seq: int, release_id: str, done: bool, state: str) -> None:
        """Insert or replace a release's state."""
        self._db.execute(
            "INSERT INTO releases (campaign, release_id, done, state) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (campaign, release_id) DO UPDATE SET done = excluded.done, state = excluded.state",
            (seq, release_id, int(done), state),
        )

    async def add_counts(self, seq: int, cells: list[int], counts: list[int]) -> None:
        """Add to the count cells."""
        self._db.executemany(
            "INSERT INTO counts (campaign, cell, count) VALUES (?, ?, ?)"
            " ON CONFLICT (campaign, cell) DO UPDATE SET count = count + excluded.count",
            ((seq, cell, count) for cell, count in zip(cells, counts, strict=True)),
        )

    async def add_rejections(self, seq: int, rejected: Mapping[int, int]) -> None:
        """Add rejection counts by reason."""
        self._db.executemany(
            "INSERT INTO rejections (campaign, reason, count) VALUES (?, ?, ?)"
            " ON CONFLICT (campaign, reason) DO UPDATE SET count = count + excluded.count",
            ((seq, reason, count) for reason, count in rejected.items()),
        )

    async def add_to_campaign(self, seq: int, counted: int, effective: int, batches: int) -> None:
        """Add to n and batches; lower smallest_batch to ``effective`` unless that is 0."""
        self._db.execute(
            "UPDATE campaigns SET n = n + ?, batches = batches + ?,"
            " smallest_batch = CASE WHEN ? = 0 THEN smallest_batch"
            " WHEN smallest_batch = 0 OR ? < smallest_batch THEN ? ELSE smallest_batch END"
            " WHERE seq = ?",
            (counted, batches, effective, effective, effective, seq),
        )

    async def insert_batch(self, plan: IngestPlan, seq: int, counted: int) -> None:
        """Remember the batch id (the write lock rules out a concurrent insert)."""
        self._db.execute(
            "INSERT INTO batches (batch_id, campaign, digest, size, counted, rejected)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (plan.batch_id, seq, plan.digest, plan.batch_size, counted, plan.rejected_json()),
        )
