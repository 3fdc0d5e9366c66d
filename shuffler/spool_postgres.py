"""The shuffler's spool on PostgreSQL: the ``SegmentSpool`` layout, shared by several shufflers.

Same contract as the SQLite ``SegmentSpool`` (tests/shuffler/test_spool_contract.py runs on both).
Several shufflers may share one database: forming batches of a campaign takes a transaction-scoped
advisory lock on that campaign, moves exactly the segments it read (by sequence number, never by
range: a segment whose number is lower may commit later) and takes all its batch sizes or none,
so no report enters two batches and no batch is smaller than planned. Appends take no lock.

The SpoolStore interface is synchronous (the shuffler calls it through ``asyncio.to_thread``);
asyncpg runs here on a private event loop in one daemon thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Coroutine
from typing import Any, Final, TypeAlias, TypeVar

import asyncpg

from deniable.core.errors import ConfigurationError
from deniable.core.plumbing.dsn import describe_dsn, is_postgres_dsn, one_line
from deniable.shuffler.columns import Columns, batch_wire, release_slices
from deniable.shuffler.spool import (
    CampaignSpoolStats,
    FormedBatch,
    SpoolUnavailable,
    new_batch_id,
)
from deniable.shuffler.spool_common import ChunkGather, FormRequest, SegmentStoreBase
from deniable.v1 import deniable_pb2 as pb

T = TypeVar("T")

LOCK_NAMESPACE: Final = 0x5348_5546
"""First key of every advisory lock this spool takes ('SHUF'): keeps clear of other users' locks."""
_SCHEMA_LOCK: Final = 0

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS shuffler_pending (
    seq BIGSERIAL PRIMARY KEY,
    campaign_id TEXT NOT NULL,
    report_count INTEGER NOT NULL CHECK (report_count > 0),
    key_ids BYTEA NOT NULL,
    lengths BYTEA NOT NULL,
    ciphertexts BYTEA NOT NULL
);
CREATE INDEX IF NOT EXISTS shuffler_pending_by_campaign ON shuffler_pending (campaign_id, seq);
CREATE TABLE IF NOT EXISTS shuffler_batches (
    seq BIGSERIAL PRIMARY KEY,
    batch_id TEXT NOT NULL UNIQUE,
    campaign_id TEXT NOT NULL,
    report_count INTEGER NOT NULL,
    digest BYTEA NOT NULL,
    wire BYTEA NOT NULL
);
CREATE INDEX IF NOT EXISTS shuffler_batches_by_campaign ON shuffler_batches (campaign_id, seq);
CREATE TABLE IF NOT EXISTS shuffler_campaigns (
    campaign_id TEXT PRIMARY KEY,
    campaign BYTEA NOT NULL
);
"""

_OLDEST_SEGMENTS: Final = """
SELECT seq, report_count FROM (
    SELECT seq, report_count, SUM(report_count) OVER (ORDER BY seq) - report_count AS before
    FROM shuffler_pending WHERE campaign_id = $1
) AS running WHERE before < $2 ORDER BY seq
"""
"""The oldest segments of a campaign up to the first that reaches ``$2`` reports in total."""

_CONNECT_ERRORS: Final = (OSError, TimeoutError, ValueError, asyncpg.PostgresError, asyncpg.InterfaceError)


class PostgresSpool(SegmentStoreBase):
    """SpoolStore on PostgreSQL (asyncpg pool), reports in segments; thread safe, multi-shuffler.

    ``scrub`` is a no-op here: dead tuples and WAL keep pre-permutation rows until vacuum and WAL recycling
    (docs/scaling.md says what that means for operators).
    """

    def __init__(self, dsn: str, *, pool_size: int = 4, timeout_s: float = 10.0) -> None:
        """Connect and create the tables if needed; ConfigurationError (password hidden) if not."""
        self._label = describe_dsn(dsn)
        if not is_postgres_dsn(dsn):
            raise ConfigurationError(f"spool store must be a postgresql:// DSN, got {self._label}")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pg-spool", daemon=True)
        self._thread.start()
        self._closed = False
        try:
            self._pool: asyncpg.Pool[asyncpg.Record] = self._run(self._connect(dsn, pool_size, timeout_s))
        except BaseException:
            self._stop_loop()
            raise

    async def _connect(self, dsn: str, pool_size: int, timeout_s: float) -> asyncpg.Pool[asyncpg.Record]:
        try:
            pool = await asyncpg.create_pool(dsn, min_size=1, max_size=pool_size, timeout=timeout_s)
        except _CONNECT_ERRORS as exc:
            raise ConfigurationError(f"cannot use spool store {self._label}: {one_line(exc)}") from exc
        try:
            async with pool.acquire() as db, db.transaction():
                await db.execute("SELECT pg_advisory_xact_lock($1, $2)", LOCK_NAMESPACE, _SCHEMA_LOCK)
                await db.execute(_SCHEMA)
        except _CONNECT_ERRORS as exc:
            await pool.close()
            raise ConfigurationError(f"cannot use spool store {self._label}: {one_line(exc)}") from exc
        return pool

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the private loop and wait for it (from any thread but that loop's)."""
        if self._closed:
            work.close()
            raise RuntimeError("the spool is closed")
        try:
            return asyncio.run_coroutine_threadsafe(work, self._loop).result()
        except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as exc:
            raise SpoolUnavailable(f"spool store {self._label}: {one_line(exc)}") from exc

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    # -- writing -----------------------------------------------------------------------------

    def _append_segments(self, segments: list[tuple[str, Columns]]) -> None:
        """Insert the segments durably in one transaction (no lock: appends never conflict)."""
        rows = [(c, cols.count, *(bytes(b) for b in cols.blobs())) for c, cols in segments]
        self._run(self._append(rows))

    async def _append(self, rows: list[tuple[Any, ...]]) -> None:
        async with self._pool.acquire() as db, db.transaction():
            await db.executemany(
                "INSERT INTO shuffler_pending (campaign_id, report_count, key_ids, lengths, ciphertexts)"
                " VALUES ($1, $2, $3, $4, $5)",
                rows,
            )

    # -- reading -----------------------------------------------------------------------------

    def pending_count(self, campaign_id: str) -> int:
        """Reports of the campaign not yet in a batch."""
        value = self._run(
            self._pool.fetchval(
                "SELECT COALESCE(SUM(report_count), 0) FROM shuffler_pending WHERE campaign_id = $1",
                campaign_id,
            )
        )
        return int(value)

    def stats(self) -> list[CampaignSpoolStats]:
        """Pending and in-flight report counts per campaign (of every shuffler on this database)."""
        rows = self._run(
            self._pool.fetch(
                "SELECT campaign_id, SUM(pending)::bigint, SUM(in_flight)::bigint FROM ("
                " SELECT campaign_id, report_count AS pending, 0 AS in_flight FROM shuffler_pending"
                " UNION ALL SELECT campaign_id, 0, report_count FROM shuffler_batches"
                ") AS spool GROUP BY campaign_id ORDER BY campaign_id"
            )
        )
        return [CampaignSpoolStats(str(r[0]), int(r[1]), int(r[2])) for r in rows]

    # -- batches -----------------------------------------------------------------------------

    def _form(self, ask: FormRequest) -> list[FormedBatch]:
        """``_form_locked`` on the private loop."""
        return self._run(self._form_locked(ask))

    async def _form_locked(self, ask: FormRequest) -> list[FormedBatch]:
        """Under the campaign's advisory lock: take up to ``limit`` oldest reports, permute, store.

        ``whole``: the release must end on a request (segment) boundary;
        if the oldest segments no longer fit the sizes (another shuffler formed batches since they
        were planned), nothing is formed. ONE permutation of the whole release, cut into chunks
        (ADR 0023); each chunk is gathered by one pass over the segments, a bounded run of them per
        round trip (ADR 0042), so memory is a chunk and one run, never the release.
        """
        async with self._pool.acquire() as db, db.transaction():
            await db.execute(
                "SELECT pg_advisory_xact_lock($1, hashtext($2))", LOCK_NAMESPACE, ask.campaign_id
            )
            heads = await db.fetch(_OLDEST_SEGMENTS, ask.campaign_id, ask.limit)
            total = sum(int(h[1]) for h in heads)
            if not heads or total < ask.at_least:
                return []
            if ask.whole and not _on_boundaries(
                [int(h[1]) for h in heads], [sum(ask.sizes)] if ask.sizes else [total]
            ):
                return []
            whole = [(int(h[0]), int(h[1])) for h in heads]
            take = min(ask.limit, total)
            tail = await _split_newest(db, whole.pop()[0], total - take) if total > take else None
            seqs = [seq for seq, _ in whole]
            formed: list[FormedBatch] = []
            for own, chunk in release_slices(take, ask.sizes or [take], ask.permutation):
                gather = ChunkGather(own)
                async for segment in _segments(db, whole, tail):
                    gather.feed(segment)
                rows, order = gather.finish()
                batch_id = new_batch_id()
                wire, digest = batch_wire(batch_id, ask.campaign_id, rows, order, release=chunk)
                del rows
                await db.execute(
                    "INSERT INTO shuffler_batches (batch_id, campaign_id, report_count, digest, wire)"
                    " VALUES ($1, $2, $3, $4, $5)",
                    batch_id,
                    ask.campaign_id,
                    int(own.size),
                    digest,
                    bytes(wire),
                )
                del wire
                formed.append(FormedBatch(batch_id, ask.campaign_id, int(own.size), digest, b""))
            if seqs:
                await db.execute("DELETE FROM shuffler_pending WHERE seq = ANY($1::bigint[])", seqs)
            return formed

    def pending_segment_counts(self, campaign_id: str) -> list[int]:
        """Reports per pending segment (one per request), oldest first."""
        rows = self._run(
            self._pool.fetch(
                "SELECT report_count FROM shuffler_pending WHERE campaign_id = $1 ORDER BY seq", campaign_id
            )
        )
        return [int(r[0]) for r in rows]

    def batch_ids(self, campaign_id: str | None = None) -> list[str]:
        """Ids of unacknowledged batches in the order they were formed."""
        if campaign_id is None:
            work = self._pool.fetch("SELECT batch_id FROM shuffler_batches ORDER BY seq")
        else:
            work = self._pool.fetch(
                "SELECT batch_id FROM shuffler_batches WHERE campaign_id = $1 ORDER BY seq", campaign_id
            )
        return [str(r[0]) for r in self._run(work)]

    def load_wire(self, batch_id: str) -> tuple[bytes, int] | None:
        """The batch as serialised ``ShuffledBatch`` bytes and its report count, or None."""
        row = self._run(
            self._pool.fetchrow(
                "SELECT wire, report_count FROM shuffler_batches WHERE batch_id = $1", batch_id
            )
        )
        return None if row is None else (bytes(row[0]), int(row[1]))

    def delete_batch(self, batch_id: str) -> bool:
        """Forget an acknowledged batch; False if it was not there (or another shuffler did)."""
        status = self._run(self._pool.execute("DELETE FROM shuffler_batches WHERE batch_id = $1", batch_id))
        return str(status) != "DELETE 0"

    # -- campaigns and upkeep ----------------------------------------------------------------

    def cache_campaign(self, campaign: pb.Campaign) -> None:
        """Insert or replace the serialized campaign."""
        blob = campaign.SerializeToString(deterministic=True)
        self._run(
            self._pool.execute(
                "INSERT INTO shuffler_campaigns (campaign_id, campaign) VALUES ($1, $2)"
                " ON CONFLICT (campaign_id) DO UPDATE SET campaign = EXCLUDED.campaign",
                campaign.id,
                blob,
            )
        )

    def cached_campaign(self, campaign_id: str) -> pb.Campaign | None:
        """The cached campaign, or None."""
        blob = self._run(
            self._pool.fetchval("SELECT campaign FROM shuffler_campaigns WHERE campaign_id = $1", campaign_id)
        )
        return None if blob is None else pb.Campaign.FromString(bytes(blob))

    def cached_campaigns(self) -> list[pb.Campaign]:
        """Every cached campaign, sorted by id."""
        rows = self._run(self._pool.fetch("SELECT campaign FROM shuffler_campaigns ORDER BY campaign_id"))
        return [pb.Campaign.FromString(bytes(r[0])) for r in rows]

    def scrub(self) -> None:
        """Nothing to do that would help: PostgreSQL has no secure delete (see the class docstring)."""

    def ping(self) -> None:
        """Raise unless the database answers (health checks)."""
        self._run(self._pool.fetchval("SELECT 1"))

    def close(self) -> None:
        """Close the pool and the private loop (closing twice is allowed)."""
        if self._closed:
            return
        self._run(self._pool.close())
        self._closed = True
        self._stop_loop()


_Db: TypeAlias = "asyncpg.Connection[asyncpg.Record] | asyncpg.pool.PoolConnectionProxy[asyncpg.Record]"
"""A connection of the pool (the forming transaction's); a string: asyncpg's classes are not generic
at run time, only in its stubs."""

REPORTS_PER_FETCH: Final = 20_000
"""Reports one round trip brings over while a chunk is gathered (a run of whole segments; a single
larger segment comes alone): about 3-5 MB of ciphertexts, whatever the release size."""


def fetch_runs(heads: list[tuple[int, int]], limit: int = REPORTS_PER_FETCH) -> list[list[int]]:
    """The segments' sequence numbers (``heads``: (seq, reports), oldest first) cut into runs of at
    most ``limit`` reports each, in order; a segment above ``limit`` is a run of its own."""
    runs: list[list[int]] = []
    held = limit
    for seq, count in heads:
        if held + count > limit:
            runs.append([])
            held = 0
        runs[-1].append(seq)
        held += count
    return runs


async def _segments(db: _Db, heads: list[tuple[int, int]], tail: Columns | None) -> AsyncIterator[Columns]:
    """The release's segments in stored order, a bounded run of them per round trip (then ``tail``).

    Runs inside the forming transaction, under the campaign's lock: the rows cannot change.
    """
    for run in fetch_runs(heads, REPORTS_PER_FETCH):
        rows = await db.fetch(
            "SELECT key_ids, lengths, ciphertexts FROM shuffler_pending WHERE seq = ANY($1::bigint[])"
            " ORDER BY seq",
            run,
        )
        if len(rows) != len(run):
            raise RuntimeError("pending segments changed while a release was formed")
        for row in rows:
            yield Columns.load(row[0], row[1], row[2])
        del rows
    if tail is not None:
        yield tail


async def _split_newest(db: _Db, seq: int, keep_pending: int) -> Columns:
    """Leave the last ``keep_pending`` reports of segment ``seq`` pending; return the others (a copy)."""
    row = await db.fetchrow("SELECT key_ids, lengths, ciphertexts FROM shuffler_pending WHERE seq = $1", seq)
    if row is None:
        raise RuntimeError("pending segments changed while a release was formed")
    stored = Columns.load(row[0], row[1], row[2])
    head, rest = stored.split(stored.count - keep_pending)
    await db.execute(
        "UPDATE shuffler_pending SET report_count = $1, key_ids = $2, lengths = $3,"
        " ciphertexts = $4 WHERE seq = $5",
        rest.count,
        *(bytes(b) for b in rest.blobs()),
        seq,
    )
    return Columns(head.key_ids.copy(), head.lengths.copy(), head.data.copy())


def _on_boundaries(segments: list[int], sizes: list[int]) -> bool:
    """Whether every batch of ``sizes`` ends where one of ``segments`` (oldest first) ends."""
    ends, running = set(), 0
    for count in segments:
        running += count
        ends.add(running)
    running = 0
    for size in sizes:
        running += size
        if running not in ends:
            return False
    return True
