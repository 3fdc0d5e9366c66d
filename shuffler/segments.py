"""The shuffler's spool on SQLite: the segment layout (``columns``) in one file, WAL, secure_delete.

A row is a *segment*: the reports of one campaign from one SubmitReports request (pending) or one
whole permuted batch, as three column blobs. Batch formation reads the oldest segments, permutes
with numpy by the CSPRNG's permutation, and writes one row per batch; forwarding sends that row's
``ShuffledBatch`` bytes as they are. (One SQLite row per report, the layout before ADR 0026, cost
about 2 µs per report per write, three writes each: more CPU than everything else the shuffler did.)

What is on disk says no more than a row per report did: a pending segment groups the reports of
one request, exactly what consecutive row numbers showed; batches hold permuted reports only.
Pending segments are deleted (``secure_delete``) when their reports enter a batch, and ``scrub``
truncates the WAL. A file in the old per-report layout is migrated on open (``_migrate_rows``).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

from deniable.core.errors import ConfigurationError
from deniable.core.plumbing.sqlite import open_database
from deniable.shuffler.columns import Columns, batch_wire, release_slices, shuffled_batch_wire
from deniable.shuffler.spool import CampaignSpoolStats, FormedBatch, new_batch_id
from deniable.shuffler.spool_common import ChunkGather, FormRequest, SegmentStoreBase
from deniable.v1 import deniable_pb2 as pb

PAGE_SIZE: Final = 65536

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS pending_segments (
    seq INTEGER PRIMARY KEY,
    campaign_id TEXT NOT NULL,
    report_count INTEGER NOT NULL,
    key_ids BLOB NOT NULL,
    lengths BLOB NOT NULL,
    ciphertexts BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS pending_segments_by_campaign ON pending_segments (campaign_id, seq);
CREATE TABLE IF NOT EXISTS batch_segments (
    seq INTEGER PRIMARY KEY,
    batch_id TEXT NOT NULL UNIQUE,
    campaign_id TEXT NOT NULL,
    report_count INTEGER NOT NULL,
    digest BLOB NOT NULL,
    wire BLOB NOT NULL
);
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


def _create_with_large_pages(path: Path) -> None:
    """A new spool file gets 64 KiB pages (a page size is fixed once a file is in WAL mode).

    Segments are large blobs: big pages mean fewer WAL frames, fewer write calls and less
    zeroing overhead per report when ``secure_delete`` wipes a batch. Existing files keep theirs.
    """
    if path.exists():
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(path, isolation_level=None)
    except (OSError, sqlite3.Error):
        return  # open_database reports the problem
    try:
        db.execute(f"PRAGMA page_size={PAGE_SIZE}")
        db.execute("PRAGMA journal_mode=WAL")
    finally:
        db.close()


def _oldest_segments(db: sqlite3.Connection, campaign_id: str, limit: int) -> tuple[list[int], int, int]:
    """(seqs, reports, ciphertext bytes) of the oldest pending segments reaching ``limit`` reports."""
    seqs: list[int] = []
    total = size = 0
    for seq, count, length in db.execute(
        "SELECT seq, report_count, length(ciphertexts) FROM pending_segments"
        " WHERE campaign_id = ? ORDER BY seq",
        (campaign_id,),
    ):
        seqs.append(int(seq))
        total += int(count)
        size += int(length)
        if total >= limit:
            break
    return seqs, total, size


def _split_newest(db: sqlite3.Connection, seq: int, keep_pending: int) -> Columns:
    """Leave the last ``keep_pending`` reports of segment ``seq`` pending; return the others (a copy)."""
    row = db.execute(
        "SELECT key_ids, lengths, ciphertexts FROM pending_segments WHERE seq = ?", (seq,)
    ).fetchone()
    stored = Columns.load(row[0], row[1], row[2])
    head, rest = stored.split(stored.count - keep_pending)
    key_ids, lengths, data = rest.blobs()
    db.execute(
        "UPDATE pending_segments SET report_count = ?, key_ids = ?, lengths = ?, ciphertexts = ?"
        " WHERE seq = ?",
        (rest.count, key_ids, lengths, data, seq),
    )
    return Columns(head.key_ids.copy(), head.lengths.copy(), head.data.copy())


def _segments(
    db: sqlite3.Connection, campaign_id: str, last: int | None, tail: Columns | None
) -> Iterator[Columns]:
    """The release's reports segment by segment, in stored order (rows up to ``last``, then ``tail``)."""
    if last is not None:
        for key_ids, lengths, data in db.execute(
            "SELECT key_ids, lengths, ciphertexts FROM pending_segments"
            " WHERE campaign_id = ? AND seq <= ? ORDER BY seq",
            (campaign_id, last),
        ):
            yield Columns.load(key_ids, lengths, data)
    if tail is not None:
        yield tail


def _gather(
    db: sqlite3.Connection,
    campaign_id: str,
    last: int | None,
    tail: Columns | None,
    own: npt.NDArray[np.int64],
) -> tuple[Columns, npt.NDArray[np.int64]]:
    """The reports at release positions ``own`` (in stored order) and the order that puts them in
    the permuted order ``own``: one pass over the segments, keeping only this chunk's rows."""
    gather = ChunkGather(own)
    for segment in _segments(db, campaign_id, last, tail):
        gather.feed(segment)
    return gather.finish()


@dataclass
class _Append:
    """One caller's segments waiting for a group commit."""

    segments: list[tuple[str, Columns]]
    done: bool = False
    error: BaseException | None = None


class SegmentSpool(SegmentStoreBase):
    """SpoolStore on one SQLite file (WAL, synchronous=FULL, secure_delete), reports in segments.

    Thread safe: one connection under one lock; appends that meet are committed together.
    """

    def __init__(self, path: Path) -> None:
        """Open or create the spool at ``path`` (migrating per-report tables); ConfigurationError."""
        self._lock = threading.Lock()
        self._queue_lock = threading.Lock()
        self._queue: list[_Append] = []
        _create_with_large_pages(path)
        self._db = open_spool_database(path, _SCHEMA, self._migrate_rows)

    # -- writing -----------------------------------------------------------------------------

    def _migrate_rows(self, spool_db: sqlite3.Connection) -> None:
        """Move reports from the per-report layout (``SqliteSpool``) into segments, once."""
        tables = {row[0] for row in spool_db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "pending" not in tables and "batch_reports" not in tables:
            return

        def work(db: sqlite3.Connection) -> None:
            if "pending" in tables:
                rows = db.execute(
                    "SELECT campaign_id, key_id, ciphertext FROM pending ORDER BY seq"
                ).fetchall()
                by_campaign: dict[str, list[tuple[int, bytes]]] = {}
                for campaign_id, key_id, ciphertext in rows:
                    by_campaign.setdefault(str(campaign_id), []).append((int(key_id), bytes(ciphertext)))
                for campaign_id, reports in by_campaign.items():
                    columns = Columns.of([k for k, _ in reports], [c for _, c in reports])
                    self._insert_pending(db, campaign_id, columns)
                db.execute("DELETE FROM pending")
            if "batches" in tables and "batch_reports" in tables:
                heads = db.execute(
                    "SELECT batch_id, campaign_id, digest FROM batches ORDER BY rowid"
                ).fetchall()
                for batch_id, campaign_id, digest in heads:
                    rows = db.execute(
                        "SELECT key_id, ciphertext FROM batch_reports WHERE batch_id = ? ORDER BY position",
                        (batch_id,),
                    ).fetchall()
                    columns = Columns.of([int(k) for k, _ in rows], [bytes(c) for _, c in rows])
                    wire = shuffled_batch_wire(str(batch_id), str(campaign_id), bytes(digest), columns)
                    self._insert_batch(
                        db, str(batch_id), str(campaign_id), columns.count, bytes(digest), wire
                    )
                db.execute("DELETE FROM batch_reports")
                db.execute("DELETE FROM batches")

        write_transaction(spool_db, self._lock, work)

    @staticmethod
    def _insert_pending(db: sqlite3.Connection, campaign_id: str, columns: Columns) -> None:
        db.execute(
            "INSERT INTO pending_segments (campaign_id, report_count, key_ids, lengths, ciphertexts)"
            " VALUES (?, ?, ?, ?, ?)",
            (campaign_id, columns.count, *columns.blobs()),
        )

    @staticmethod
    def _insert_batch(
        db: sqlite3.Connection,
        batch_id: str,
        campaign_id: str,
        count: int,
        digest: bytes,
        wire: bytes | bytearray,
    ) -> None:
        db.execute(
            "INSERT INTO batch_segments (batch_id, campaign_id, report_count, digest, wire)"
            " VALUES (?, ?, ?, ?, ?)",
            (batch_id, campaign_id, count, digest, wire),
        )

    def _append_segments(self, segments: list[tuple[str, Columns]]) -> None:
        """Insert the segments durably (group commit).

        Appends that arrive while another one is committing wait for the lock and are then
        written together, in one transaction and one fsync. Each call still returns only once its
        own reports are durable (or raises if that transaction failed).
        """
        entry = _Append(segments)
        with self._queue_lock:
            self._queue.append(entry)
        with self._lock:
            if not entry.done:
                with self._queue_lock:
                    group, self._queue = self._queue, []
                try:
                    self._db.execute("BEGIN IMMEDIATE")
                    for member in group:
                        for campaign_id, columns in member.segments:
                            self._insert_pending(self._db, campaign_id, columns)
                    self._db.execute("COMMIT")
                except BaseException as exc:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    for member in group:
                        member.error = exc
                finally:
                    for member in group:
                        member.done = True
        if entry.error is not None:
            raise entry.error

    # -- reading -----------------------------------------------------------------------------

    def pending_count(self, campaign_id: str) -> int:
        """Reports of the campaign not yet in a batch."""
        with self._lock:
            row = self._db.execute(
                "SELECT COALESCE(SUM(report_count), 0) FROM pending_segments WHERE campaign_id = ?",
                (campaign_id,),
            ).fetchone()
        return int(row[0])

    def stats(self) -> list[CampaignSpoolStats]:
        """Pending and in-flight report counts per campaign."""
        with self._lock:
            pending = dict(
                self._db.execute(
                    "SELECT campaign_id, SUM(report_count) FROM pending_segments GROUP BY campaign_id"
                ).fetchall()
            )
            in_flight = dict(
                self._db.execute(
                    "SELECT campaign_id, SUM(report_count) FROM batch_segments GROUP BY campaign_id"
                ).fetchall()
            )
        return [
            CampaignSpoolStats(str(c), int(pending.get(c, 0)), int(in_flight.get(c, 0)))
            for c in sorted(set(pending) | set(in_flight))
        ]

    # -- batches -----------------------------------------------------------------------------

    def _form(self, ask: FormRequest) -> list[FormedBatch]:
        """Take up to ``limit`` oldest reports (none if fewer than ``at_least``), permute, slice, store.

        ONE permutation of everything taken, cut into chunks of ``sizes`` (ADR 0023). ``whole``: the
        release ends on a segment boundary, so a request's reports all land in one release.
        """
        formed: list[FormedBatch] = []

        def work(db: sqlite3.Connection) -> None:
            seqs, total, _ = _oldest_segments(db, ask.campaign_id, ask.limit)
            if not seqs or total < ask.at_least:
                return
            take = min(ask.limit, total)
            if ask.whole and total > take:
                raise ValueError("batch sizes do not fall on request boundaries")
            tail = None
            if total > take:  # the newest segment stays partly pending: keep its head in memory
                tail = _split_newest(db, seqs.pop(), total - take)
            # ONE permutation of the whole release, cut into chunks (ADR 0023). Each chunk is
            # gathered by one pass over the stored segments, so memory is a chunk, not the release.
            for own, chunk in release_slices(take, ask.sizes or [take], ask.permutation):
                batch_id = new_batch_id()
                rows, order = _gather(db, ask.campaign_id, seqs[-1] if seqs else None, tail, own)
                wire, digest = batch_wire(batch_id, ask.campaign_id, rows, order, release=chunk)
                del rows
                self._insert_batch(db, batch_id, ask.campaign_id, int(own.size), digest, wire)
                formed.append(FormedBatch(batch_id, ask.campaign_id, int(own.size), digest, b""))
                del wire
            if seqs:
                db.execute(
                    "DELETE FROM pending_segments WHERE campaign_id = ? AND seq <= ?",
                    (ask.campaign_id, seqs[-1]),
                )

        try:
            self._write(work)
        except BaseException:
            formed.clear()
            raise
        return formed

    def pending_segment_counts(self, campaign_id: str) -> list[int]:
        """Reports per pending segment (one per request), oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT report_count FROM pending_segments WHERE campaign_id = ? ORDER BY seq",
                (campaign_id,),
            ).fetchall()
        return [int(row[0]) for row in rows]

    def batch_ids(self, campaign_id: str | None = None) -> list[str]:
        """Ids of unacknowledged batches in the order they were formed."""
        with self._lock:
            if campaign_id is None:
                cursor = self._db.execute("SELECT batch_id FROM batch_segments ORDER BY seq")
            else:
                cursor = self._db.execute(
                    "SELECT batch_id FROM batch_segments WHERE campaign_id = ? ORDER BY seq", (campaign_id,)
                )
            return [str(row[0]) for row in cursor]

    def load_wire(self, batch_id: str) -> tuple[bytes, int] | None:
        """The batch as serialised ``ShuffledBatch`` bytes and its report count, or None."""
        with self._lock:
            row = self._db.execute(
                "SELECT wire, report_count FROM batch_segments WHERE batch_id = ?", (batch_id,)
            ).fetchone()
        return None if row is None else (bytes(row[0]), int(row[1]))

    def delete_batch(self, batch_id: str) -> bool:
        """Delete an acknowledged batch in one transaction."""
        deleted: list[int] = []
        self._write(
            lambda db: deleted.append(
                db.execute("DELETE FROM batch_segments WHERE batch_id = ?", (batch_id,)).rowcount
            )
        )
        return deleted[0] > 0

    # -- campaigns and upkeep ----------------------------------------------------------------

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
