"""The shuffler's durable spool: pending envelopes, permuted batches awaiting acknowledgement, campaigns.

Nothing here identifies a sender: a pending row is (seq, campaign id, key id, ciphertext) and the
row order exists only until ``form_batch``/``form_batches`` move the rows, permuted, into batches.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from deniable.core.batches import batch_digest
from deniable.core.errors import ConfigurationError
from deniable.core.plumbing.sqlite import open_database
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


def check_permutation(order: npt.NDArray[np.int64] | Sequence[int], count: int) -> list[int]:
    """The order as a list of ints; ValueError unless it is a permutation of range(count)."""
    positions = [int(i) for i in order]
    if len(positions) != count or sorted(positions) != list(range(count)):
        raise ValueError(f"not a permutation of range({count})")
    return positions


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

    def batch_ids(self, campaign_id: str | None = None) -> list[str]:
        """Ids of unacknowledged batches, oldest first."""

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


_SCHEMA = """
CREATE TABLE IF NOT EXISTS pending (
    seq INTEGER PRIMARY KEY,
    campaign_id TEXT NOT NULL,
    key_id INTEGER NOT NULL,
    ciphertext BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS pending_by_campaign ON pending (campaign_id, seq);
CREATE TABLE IF NOT EXISTS batches (
    batch_id TEXT PRIMARY KEY,
    campaign_id TEXT NOT NULL,
    report_count INTEGER NOT NULL,
    digest BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS batch_reports (
    batch_id TEXT NOT NULL REFERENCES batches (batch_id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    key_id INTEGER NOT NULL,
    ciphertext BLOB NOT NULL,
    PRIMARY KEY (batch_id, position)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS campaigns (
    campaign_id TEXT PRIMARY KEY,
    campaign BLOB NOT NULL
) WITHOUT ROWID;
"""


def open_spool_database(
    path: Path, schema: str, setup: Callable[[sqlite3.Connection], None] | None = None
) -> sqlite3.Connection:
    """Open a spool file with secure_delete and ``schema`` (then ``setup``); ConfigurationError."""
    db = open_database(path)
    try:
        db.execute("PRAGMA secure_delete=ON")
        db.executescript(schema)
        if setup is not None:
            setup(db)
    except sqlite3.Error as exc:
        db.close()
        raise ConfigurationError(f"cannot use spool {path}: {exc}") from exc
    return db


def write_transaction(
    db: sqlite3.Connection, lock: threading.Lock, work: Callable[[sqlite3.Connection], object]
) -> None:
    """Run ``work`` in one IMMEDIATE transaction under ``lock``; rolled back on any error."""
    with lock:
        db.execute("BEGIN IMMEDIATE")
        try:
            work(db)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise


class SpoolDatabase:
    """What both SQLite spools share: one connection under one lock, the campaign cache, WAL upkeep."""

    _db: sqlite3.Connection
    _lock: threading.Lock

    def _write(self, work: Callable[[sqlite3.Connection], object]) -> None:
        write_transaction(self._db, self._lock, work)

    def cache_campaign(self, campaign: pb.Campaign) -> None:
        """Insert or replace the serialized campaign."""
        blob = campaign.SerializeToString(deterministic=True)
        self._write(
            lambda db: db.execute(
                "INSERT OR REPLACE INTO campaigns (campaign_id, campaign) VALUES (?, ?)", (campaign.id, blob)
            )
        )

    def cached_campaign(self, campaign_id: str) -> pb.Campaign | None:
        """The cached campaign, or None."""
        with self._lock:
            row = self._db.execute(
                "SELECT campaign FROM campaigns WHERE campaign_id = ?", (campaign_id,)
            ).fetchone()
        return None if row is None else pb.Campaign.FromString(bytes(row[0]))

    def cached_campaigns(self) -> list[pb.Campaign]:
        """Every cached campaign, sorted by id."""
        with self._lock:
            rows = self._db.execute("SELECT campaign FROM campaigns ORDER BY campaign_id").fetchall()
        return [pb.Campaign.FromString(bytes(row[0])) for row in rows]

    def scrub(self) -> None:
        """Checkpoint and truncate the WAL, whose frames still hold pending pages in arrival order."""
        with self._lock:
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        """Close the connection once no call is running (closing twice is allowed)."""
        with self._lock:
            self._db.close()


class SqliteSpool(SpoolDatabase):
    """SpoolStore on one SQLite file (WAL, synchronous=FULL, secure_delete); thread safe."""

    def __init__(self, path: Path) -> None:
        """Open or create the spool at ``path``; ConfigurationError if the place is unusable."""
        self._lock = threading.Lock()
        self._db = open_spool_database(path, _SCHEMA)

    def append(self, reports: Sequence[Envelope]) -> None:
        """Insert every report in one durable transaction (nothing if ``reports`` is empty)."""
        if not reports:
            return
        rows = [(r.campaign_id, int(r.key_id), bytes(r.ciphertext)) for r in reports]
        self._write(
            lambda db: db.executemany(
                "INSERT INTO pending (campaign_id, key_id, ciphertext) VALUES (?, ?, ?)", rows
            )
        )

    def pending_count(self, campaign_id: str) -> int:
        """Reports of the campaign not yet in a batch."""
        with self._lock:
            row = self._db.execute("SELECT COUNT(*) FROM pending WHERE campaign_id = ?", (campaign_id,))
            return int(row.fetchone()[0])

    def form_batch(
        self, campaign_id: str, max_reports: int, permutation: Permutation, min_reports: int = 1
    ) -> BatchRecord | None:
        """Move the oldest ``max_reports`` pending reports into a permuted batch in one transaction."""
        if max_reports < 1:
            raise ValueError("max_reports must be at least 1")
        formed = self._form(campaign_id, None, max_reports, max(1, min_reports), permutation)
        return formed[0] if formed else None

    def form_batches(
        self, campaign_id: str, sizes: Sequence[int], permutation: Permutation
    ) -> list[BatchRecord]:
        """Several batches from one permutation of the oldest sum(sizes) pending reports."""
        if not sizes or min(sizes) < 1:
            raise ValueError("batch sizes must be at least 1")
        total = sum(sizes)
        return self._form(campaign_id, list(sizes), total, total, permutation)

    def _form(
        self,
        campaign_id: str,
        sizes: list[int] | None,
        limit: int,
        at_least: int,
        permutation: Permutation,
    ) -> list[BatchRecord]:
        """Take up to ``limit`` oldest rows (none if fewer than ``at_least``), permute, slice, store."""
        result: list[BatchRecord] = []

        def work(db: sqlite3.Connection) -> None:
            rows: list[tuple[int, int, bytes]] = db.execute(
                "SELECT seq, key_id, ciphertext FROM pending WHERE campaign_id = ? ORDER BY seq LIMIT ?",
                (campaign_id, limit),
            ).fetchall()
            if not rows or len(rows) < at_least:
                return
            order = check_permutation(permutation(len(rows)), len(rows))
            shuffled = [Envelope(campaign_id, rows[i][1], rows[i][2]) for i in order]
            start = 0
            for size in sizes or [len(rows)]:
                reports = tuple(shuffled[start : start + size])
                start += size
                record = BatchRecord(
                    batch_id=new_batch_id(),
                    campaign_id=campaign_id,
                    reports=reports,
                    digest=batch_digest(r.ciphertext for r in reports),
                )
                db.execute(
                    "INSERT INTO batches (batch_id, campaign_id, report_count, digest) VALUES (?, ?, ?, ?)",
                    (record.batch_id, campaign_id, len(reports), record.digest),
                )
                db.executemany(
                    "INSERT INTO batch_reports (batch_id, position, key_id, ciphertext) VALUES (?, ?, ?, ?)",
                    ((record.batch_id, pos, r.key_id, r.ciphertext) for pos, r in enumerate(reports)),
                )
                result.append(record)
            db.execute("DELETE FROM pending WHERE campaign_id = ? AND seq <= ?", (campaign_id, rows[-1][0]))

        try:
            self._write(work)
        except BaseException:
            result.clear()
            raise
        return result

    def batch_ids(self, campaign_id: str | None = None) -> list[str]:
        """Ids of unacknowledged batches in the order they were formed."""
        with self._lock:
            if campaign_id is None:
                cursor = self._db.execute("SELECT batch_id FROM batches ORDER BY rowid")
            else:
                cursor = self._db.execute(
                    "SELECT batch_id FROM batches WHERE campaign_id = ? ORDER BY rowid", (campaign_id,)
                )
            return [str(row[0]) for row in cursor]

    def load_batch(self, batch_id: str) -> BatchRecord | None:
        """One unacknowledged batch with its reports in the stored (permuted) order."""
        with self._lock:
            head = self._db.execute(
                "SELECT campaign_id, digest FROM batches WHERE batch_id = ?", (batch_id,)
            ).fetchone()
            if head is None:
                return None
            campaign_id = str(head[0])
            rows = self._db.execute(
                "SELECT key_id, ciphertext FROM batch_reports WHERE batch_id = ? ORDER BY position",
                (batch_id,),
            ).fetchall()
        return BatchRecord(
            batch_id=batch_id,
            campaign_id=campaign_id,
            reports=tuple(Envelope(campaign_id, int(k), bytes(c)) for k, c in rows),
            digest=bytes(head[1]),
        )

    def unacknowledged_batches(self, campaign_id: str | None = None) -> list[BatchRecord]:
        """Every unacknowledged batch, oldest first."""
        batches = (self.load_batch(batch_id) for batch_id in self.batch_ids(campaign_id))
        return [b for b in batches if b is not None]

    def delete_batch(self, batch_id: str) -> bool:
        """Delete an acknowledged batch and its reports in one transaction."""
        deleted: list[int] = []

        def work(db: sqlite3.Connection) -> None:
            db.execute("DELETE FROM batch_reports WHERE batch_id = ?", (batch_id,))
            deleted.append(db.execute("DELETE FROM batches WHERE batch_id = ?", (batch_id,)).rowcount)

        self._write(work)
        return deleted[0] > 0

    def stats(self) -> list[CampaignSpoolStats]:
        """Pending and in-flight report counts per campaign."""
        with self._lock:
            pending = dict(
                self._db.execute("SELECT campaign_id, COUNT(*) FROM pending GROUP BY campaign_id").fetchall()
            )
            in_flight = dict(
                self._db.execute(
                    "SELECT campaign_id, SUM(report_count) FROM batches GROUP BY campaign_id"
                ).fetchall()
            )
        return [
            CampaignSpoolStats(str(c), int(pending.get(c, 0)), int(in_flight.get(c, 0)))
            for c in sorted(set(pending) | set(in_flight))
        ]


def envelopes_of(reports: Iterable[pb.EncryptedReport]) -> list[Envelope]:
    """Protobuf reports as envelopes (copies the three fields, nothing else)."""
    return [Envelope(r.campaign_id, r.key_id, r.ciphertext) for r in reports]
