"""The production aggregator store: PostgreSQL through an asyncpg connection pool.

Same semantics as ``SqliteAggregatorStore`` (tests/aggregator's contract suite runs on both).

Concurrency: several stores (aggregator replicas) may ingest into one database at once. Every
ingestion is one READ COMMITTED transaction (set explicitly, whatever the server's default) that
first locks its campaign's row with ``SELECT ... FOR NO KEY UPDATE``. Ingestions into the same
campaign therefore run one after the other; because READ COMMITTED gives each later statement a
fresh snapshot, the transaction that gets the lock second sees everything the first committed
(its batch id, its report ids), so a batch is counted once and a report id once, and the count
cells, n and smallest batch are read-modify-written by one transaction at a time: nothing is
double counted or lost. Different campaigns ingest in parallel. A transaction locks exactly one
campaign row, and the only rows two campaigns share are batch ids (globally unique): a second
use of a batch id waits for the first transaction and then fails its insert, which becomes
``BatchConflict``; with one campaign lock per transaction no lock cycle (deadlock) can form.
A snapshot is one SQL statement, hence one consistent snapshot of the campaign.

Schema: created on open (``CREATE TABLE IF NOT EXISTS``) under a transaction-scoped advisory lock,
so replicas starting together do not race; ``schema_version`` holds one row, and a database
with a newer version than this code knows is refused (ConfigurationError).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, TypeAlias

import asyncpg

from deniable.aggregator.ingest_plan import IngestOutcome, IngestPlan
from deniable.aggregator.store import (
    DELETED_WITH_CAMPAIGN,
    BatchConflict,
    BatchRecord,
    CampaignCounts,
    CampaignExists,
    CampaignIdTombstoned,
    StoreError,
    UnknownCampaign,
)
from deniable.aggregator.store_pipeline import apply_plan
from deniable.core.errors import ConfigurationError
from deniable.core.plumbing.dsn import describe_dsn, is_postgres_dsn, one_line
from deniable.v1 import deniable_pb2 as pb

SCHEMA_VERSION: Final = 2  # 2: tombstones of deleted campaign ids
"""Version of the PostgreSQL schema below (independent of the SQLite one)."""
PING_TIMEOUT_S: Final = 2.0
DEFAULT_POOL_SIZE: Final = 8
CONNECT_TIMEOUT_S: Final = 10.0
SCHEMA_LOCK: Final = 0x64656E6961626C65  # pg_advisory_xact_lock key: b"deniable" as an integer

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS schema_version (
    only_row BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (only_row),
    version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS campaigns (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    body BYTEA NOT NULL,
    n BIGINT NOT NULL DEFAULT 0,
    smallest_batch BIGINT NOT NULL DEFAULT 0,
    batches BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS counts (
    campaign BIGINT NOT NULL REFERENCES campaigns(seq),
    cell INTEGER NOT NULL,
    count BIGINT NOT NULL,
    PRIMARY KEY (campaign, cell)
);
CREATE TABLE IF NOT EXISTS rejections (
    campaign BIGINT NOT NULL REFERENCES campaigns(seq),
    reason INTEGER NOT NULL,
    count BIGINT NOT NULL,
    PRIMARY KEY (campaign, reason)
);
CREATE TABLE IF NOT EXISTS batches (
    batch_id TEXT PRIMARY KEY,
    campaign BIGINT NOT NULL REFERENCES campaigns(seq),
    digest BYTEA NOT NULL,
    size BIGINT NOT NULL,
    counted BIGINT NOT NULL,
    rejected JSONB NOT NULL
);
CREATE TABLE IF NOT EXISTS seen_reports (
    campaign BIGINT NOT NULL,
    report_id BYTEA NOT NULL,
    PRIMARY KEY (campaign, report_id)
);
CREATE TABLE IF NOT EXISTS retired (
    campaign BIGINT PRIMARY KEY REFERENCES campaigns(seq)
);
CREATE TABLE IF NOT EXISTS releases (
    campaign BIGINT NOT NULL REFERENCES campaigns(seq),
    release_id TEXT NOT NULL,
    done BOOLEAN NOT NULL DEFAULT FALSE,
    state TEXT NOT NULL,
    PRIMARY KEY (campaign, release_id)
);
CREATE TABLE IF NOT EXISTS tombstones (
    id TEXT PRIMARY KEY,
    deleted_unix BIGINT NOT NULL
);
"""
"""No foreign key on seen_reports (as in SQLite): one check per report id would cost more than it guards."""

_INSERT_REPORT_IDS: Final = """
WITH inserted AS (
    INSERT INTO seen_reports (campaign, report_id)
    SELECT $1, r FROM unnest($2::bytea[]) AS u(r)
    ON CONFLICT DO NOTHING
    RETURNING report_id
)
SELECT u.r FROM unnest($2::bytea[]) AS u(r)
WHERE NOT EXISTS (SELECT 1 FROM inserted i WHERE i.report_id = u.r)
"""
"""Insert a batch's (distinct, sorted) report ids in one statement; returns those seen before."""

_ADD_COUNTS: Final = """
INSERT INTO counts (campaign, cell, count)
SELECT $1, c, k FROM unnest($2::integer[], $3::bigint[]) AS t(c, k)
ON CONFLICT (campaign, cell) DO UPDATE SET count = counts.count + excluded.count
"""

_ADD_REJECTIONS: Final = """
INSERT INTO rejections (campaign, reason, count)
SELECT $1, r, k FROM unnest($2::integer[], $3::bigint[]) AS t(r, k)
ON CONFLICT (campaign, reason) DO UPDATE SET count = rejections.count + excluded.count
"""

_ADD_BATCH_TO_CAMPAIGN: Final = """
UPDATE campaigns SET n = n + $2, batches = batches + $4,
    smallest_batch = CASE WHEN $3::bigint = 0 THEN smallest_batch
        WHEN smallest_batch = 0 OR $3::bigint < smallest_batch THEN $3::bigint
        ELSE smallest_batch END
WHERE seq = $1
"""

_SNAPSHOT: Final = """
SELECT c.n, c.smallest_batch, c.batches,
    ARRAY(SELECT cell FROM counts WHERE campaign = c.seq ORDER BY cell) AS cells,
    ARRAY(SELECT count FROM counts WHERE campaign = c.seq ORDER BY cell) AS cell_counts,
    ARRAY(SELECT reason FROM rejections WHERE campaign = c.seq ORDER BY reason) AS reasons,
    ARRAY(SELECT count FROM rejections WHERE campaign = c.seq ORDER BY reason) AS reason_counts,
    (SELECT COUNT(*) FROM releases WHERE campaign = c.seq AND done) AS releases,
    (SELECT COUNT(*) FROM releases WHERE campaign = c.seq AND NOT done) AS incomplete_releases
FROM campaigns c WHERE c.id = $1
"""
"""One statement, so one snapshot: counts, n and rejections always belong together."""


class PostgresAggregatorStore:
    """Campaigns, counts and seen ids in PostgreSQL; safe for several replicas on one database."""

    def __init__(self, pool: asyncpg.Pool[asyncpg.Record], label: str) -> None:
        """Wrap an open pool whose database has the schema (use ``connect``)."""
        self._pool = pool
        self.label = label
        self._closed = False

    @classmethod
    async def connect(
        cls, dsn: str, *, pool_size: int = DEFAULT_POOL_SIZE, timeout: float = CONNECT_TIMEOUT_S
    ) -> PostgresAggregatorStore:
        """Open a pool and create or check the schema; ConfigurationError (one line) if unusable."""
        label = describe_dsn(dsn)
        if not is_postgres_dsn(dsn):
            raise ConfigurationError(f"not a PostgreSQL DSN: {label} (expected postgresql://...)")
        try:
            pool = await asyncpg.create_pool(dsn, min_size=1, max_size=pool_size, timeout=timeout)
        except (OSError, TimeoutError, ValueError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise ConfigurationError(f"cannot connect to PostgreSQL at {label}: {one_line(exc)}") from exc
        try:
            async with pool.acquire() as connection:
                await _prepare_schema(connection, label)
        except ConfigurationError:
            await pool.close()
            raise
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            await pool.close()
            raise ConfigurationError(f"cannot prepare PostgreSQL database {label}: {one_line(exc)}") from exc
        return cls(pool, label)

    def _open_pool(self) -> asyncpg.Pool[asyncpg.Record]:
        """The pool, or StoreError once the store is closed."""
        if self._closed:
            raise StoreError("the store is closed")
        return self._pool

    async def create_campaign(self, campaign: pb.Campaign) -> None:
        """Store a new campaign; CampaignExists if its id is taken."""
        body = campaign.SerializeToString(deterministic=True)
        try:
            inserted = await self._open_pool().execute(
                "INSERT INTO campaigns (id, body) SELECT $1, $2"
                " WHERE NOT EXISTS (SELECT 1 FROM tombstones WHERE id = $1)",
                campaign.id,
                body,
            )
        except asyncpg.UniqueViolationError as exc:
            raise CampaignExists(campaign.id) from exc
        if inserted != "INSERT 0 1":
            raise CampaignIdTombstoned(campaign.id)

    async def get_campaign(self, campaign_id: str) -> pb.Campaign | None:
        """The campaign, or None."""
        body = await self._open_pool().fetchval("SELECT body FROM campaigns WHERE id = $1", campaign_id)
        return None if body is None else pb.Campaign.FromString(bytes(body))

    async def list_campaigns(self) -> list[pb.Campaign]:
        """Every campaign, oldest first."""
        rows = await self._open_pool().fetch("SELECT body FROM campaigns ORDER BY seq")
        return [pb.Campaign.FromString(bytes(row[0])) for row in rows]

    async def update_campaign(self, campaign: pb.Campaign) -> None:
        """Replace the description of an existing campaign (same id); UnknownCampaign otherwise."""
        body = campaign.SerializeToString(deterministic=True)
        status = await self._open_pool().execute(
            "UPDATE campaigns SET body = $2 WHERE id = $1", campaign.id, body
        )
        if status != "UPDATE 1":
            raise UnknownCampaign(campaign.id)

    async def delete_campaign(self, campaign_id: str) -> tuple[int, int]:
        """Remove a campaign and everything counted for it, atomically: (counted, batches)."""
        async with self._open_pool().acquire() as connection, connection.transaction():
            row = await connection.fetchrow(
                "SELECT seq, n, batches FROM campaigns WHERE id = $1 FOR UPDATE", campaign_id
            )
            if row is None:
                raise UnknownCampaign(campaign_id)
            for table in DELETED_WITH_CAMPAIGN:
                await connection.execute(f"DELETE FROM {table} WHERE campaign = $1", row[0])  # noqa: S608
            await connection.execute("DELETE FROM campaigns WHERE seq = $1", row[0])
            await connection.execute(
                "INSERT INTO tombstones (id, deleted_unix) VALUES ($1, EXTRACT(EPOCH FROM now())::BIGINT)"
                " ON CONFLICT (id) DO NOTHING",
                campaign_id,
            )
        return int(row[1]), int(row[2])

    async def find_batch(self, batch_id: str) -> BatchRecord | None:
        """The record of an already ingested batch, or None."""
        row = await self._open_pool().fetchrow(
            "SELECT c.id, b.digest, b.counted FROM batches b JOIN campaigns c ON c.seq = b.campaign"
            " WHERE b.batch_id = $1",
            batch_id,
        )
        return None if row is None else BatchRecord(batch_id, str(row[0]), bytes(row[1]), int(row[2]))

    async def apply(self, plan: IngestPlan) -> IngestOutcome:
        """Count one planned batch atomically and idempotently (see ``AggregatorStore.apply``)."""
        async with self._open_pool().acquire() as db, db.transaction(isolation="read_committed"):
            return await apply_plan(_PostgresIngest(db), plan)

    async def snapshot(self, campaign_id: str, cells: int) -> CampaignCounts:
        """Counts (``cells`` long), n, smallest batch, rejections and batches of one campaign."""
        row = await self._open_pool().fetchrow(_SNAPSHOT, campaign_id)
        if row is None:
            raise UnknownCampaign(campaign_id)
        counts = [0] * cells
        for cell, count in zip(row["cells"], row["cell_counts"], strict=True):
            if not 0 <= cell < cells:
                raise ValueError(f"campaign {campaign_id} has count cell {cell} outside 0..{cells - 1}")
            counts[cell] = int(count)
        return CampaignCounts(
            counts=counts,
            n=int(row["n"]),
            smallest_batch=int(row["smallest_batch"]),
            rejected={int(r): int(k) for r, k in zip(row["reasons"], row["reason_counts"], strict=True)},
            batches=int(row["batches"]),
            releases=int(row["releases"]),
            incomplete_releases=int(row["incomplete_releases"]),
        )

    async def retire_campaign(self, campaign_id: str) -> int:
        """Forget the campaign's report ids and mark it retired (see ``AggregatorStore``)."""
        async with self._open_pool().acquire() as db, db.transaction():
            seq = await db.fetchval("SELECT seq FROM campaigns WHERE id = $1 FOR NO KEY UPDATE", campaign_id)
            if seq is None:
                raise UnknownCampaign(campaign_id)
            await db.execute("INSERT INTO retired (campaign) VALUES ($1) ON CONFLICT DO NOTHING", seq)
            status = await db.execute("DELETE FROM seen_reports WHERE campaign = $1", seq)
        return int(status.split()[-1])

    async def report_id_count(self, campaign_id: str) -> int:
        """How many report ids the store keeps for the campaign."""
        pool = self._open_pool()
        seq = await pool.fetchval("SELECT seq FROM campaigns WHERE id = $1", campaign_id)
        if seq is None:
            raise UnknownCampaign(campaign_id)
        return int(await pool.fetchval("SELECT count(*) FROM seen_reports WHERE campaign = $1", seq))

    async def retired(self) -> set[str]:
        """Ids of the retired campaigns."""
        rows = await self._open_pool().fetch(
            "SELECT c.id FROM retired r JOIN campaigns c ON c.seq = r.campaign"
        )
        return {str(r[0]) for r in rows}

    async def ping(self) -> None:
        """``SELECT 1`` on a pooled connection (raises while the server is down)."""
        await self._open_pool().fetchval("SELECT 1", timeout=PING_TIMEOUT_S)

    async def close(self) -> None:
        """Wait for running work, then close the pool (idempotent)."""
        if self._closed:
            return
        self._closed = True
        await self._pool.close()


Connection: TypeAlias = "asyncpg.pool.PoolConnectionProxy[asyncpg.Record]"


class _PostgresIngest:
    """PostgreSQL's statements for ``apply_plan`` on one connection inside its transaction."""

    def __init__(self, db: Connection) -> None:
        self._db = db

    async def lock_campaign(self, campaign_id: str) -> int | None:
        """The campaign's seq, its row locked: ingestions into one campaign run one at a time."""
        seq = await self._db.fetchval(
            "SELECT seq FROM campaigns WHERE id = $1 FOR NO KEY UPDATE", campaign_id
        )
        return None if seq is None else int(seq)

    async def batch_record(self, batch_id: str) -> tuple[int, bytes] | None:
        """(campaign seq, digest) of a known batch id."""
        row = await self._db.fetchrow("SELECT campaign, digest FROM batches WHERE batch_id = $1", batch_id)
        return None if row is None else (int(row[0]), bytes(row[1]))

    async def is_retired(self, seq: int) -> bool:
        """Whether the campaign is retired."""
        return await self._db.fetchval("SELECT 1 FROM retired WHERE campaign = $1", seq) is not None

    async def record_report_ids(self, seq: int, report_ids: list[bytes]) -> list[bytes]:
        """Insert every id in one statement; it returns those seen before."""
        return [bytes(row[0]) for row in await self._db.fetch(_INSERT_REPORT_IDS, seq, report_ids)]

    async def release_state(self, seq: int, release_id: str) -> tuple[bool, str] | None:
        """(done, state) of a release, its row locked for update."""
        row = await self._db.fetchrow(
            "SELECT done, state FROM releases WHERE campaign = $1 AND release_id = $2 FOR UPDATE",
            seq,
            release_id,
        )
        return None if row is None else (bool(row[0]), str(row[1]))

    async def save_release(self, seq: int, release_id: str, done: bool, state: str) -> None:
        """Insert or replace a release's state."""
        await self._db.execute(
            "INSERT INTO releases (campaign, release_id, done, state) VALUES ($1, $2, $3, $4)"
            " ON CONFLICT (campaign, release_id) DO UPDATE SET done = excluded.done, state = excluded.state",
            seq,
            release_id,
            done,
            state,
        )

    async def add_counts(self, seq: int, cells: list[int], counts: list[int]) -> None:
        """Add to the count cells in one statement."""
        await self._db.execute(_ADD_COUNTS, seq, cells, counts)

    async def add_rejections(self, seq: int, rejected: Mapping[int, int]) -> None:
        """Add rejection counts by reason in one statement."""
        reasons = sorted(rejected)
        await self._db.execute(_ADD_REJECTIONS, seq, reasons, [rejected[r] for r in reasons])

    async def add_to_campaign(self, seq: int, counted: int, effective: int, batches: int) -> None:
        """Add to n and batches; lower smallest_batch to ``effective`` unless that is 0."""
        await self._db.execute(_ADD_BATCH_TO_CAMPAIGN, seq, counted, effective, batches)

    async def insert_batch(self, plan: IngestPlan, seq: int, counted: int) -> None:
        """Remember the batch id; a unique violation means another campaign's ingestion took it."""
        try:
            await self._db.execute(
                "INSERT INTO batches (batch_id, campaign, digest, size, counted, rejected)"
                " VALUES ($1, $2, $3, $4, $5, $6::jsonb)",
                plan.batch_id,
                seq,
                plan.digest,
                plan.batch_size,
                counted,
                plan.rejected_json(),
            )
        except asyncpg.UniqueViolationError as exc:
            raise BatchConflict(f"batch id {plan.batch_id!r} was already used for a different batch") from exc


async def _prepare_schema(db: Connection, label: str) -> None:
    """Create the tables if missing and record the version; refuse a newer schema."""
    async with db.transaction():
        await db.execute("SELECT pg_advisory_xact_lock($1)", SCHEMA_LOCK)
        version: int | None = None
        if await db.fetchval("SELECT to_regclass('schema_version') IS NOT NULL"):
            version = await db.fetchval("SELECT version FROM schema_version")
        if version is not None and version > SCHEMA_VERSION:
            raise ConfigurationError(
                f"database {label} has schema version {version}; this aggregator knows {SCHEMA_VERSION}"
            )
        if version == SCHEMA_VERSION:
            return  # nothing to create: a role without CREATE rights can run an up-to-date database
        await db.execute(_SCHEMA)
        await db.execute(
            "INSERT INTO schema_version (version) VALUES ($1)"
            " ON CONFLICT (only_row) DO UPDATE SET version = excluded.version",
            SCHEMA_VERSION,
        )
