"""Durable queue of sealed reports waiting for the shuffler's acknowledgement.

A report enters in the same transaction as its siblings and leaves only when the shuffler has
accepted it (durably spooled) or rejected it permanently, so a crash or an outage loses nothing.
The messages of one answer share an ``answer`` number (local, never sent) so that they always
travel in one request: the shuffler never splits a request over batches (ADR 0014).
Delivery is at-least-once: a crash between an acknowledgement and ``remove`` resends the report,
and the aggregator drops the duplicate by its report id.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from deniable.core.plumbing.sqlite import open_database
from deniable.v1 import deniable_pb2 as pb

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    campaign_id TEXT NOT NULL,
    key_id INTEGER NOT NULL,
    ciphertext BLOB NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    answer INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS outbox_by_campaign ON outbox (campaign_id, id);
"""
_ADD_ANSWER = "ALTER TABLE outbox ADD COLUMN answer INTEGER NOT NULL DEFAULT 0"
"""Outboxes written before answers were numbered: their rows become answer 0 (sent as before)."""


@dataclass(frozen=True)
class OutboxRow:
    """One stored report; ``attempts`` counts how often it was handed to the transport."""

    id: int
    campaign_id: str
    key_id: int
    ciphertext: bytes
    attempts: int

    def to_proto(self) -> pb.EncryptedReport:
        """The envelope as it goes on the wire (the outbox id never leaves the device)."""
        return pb.EncryptedReport(
            campaign_id=self.campaign_id, key_id=self.key_id, ciphertext=self.ciphertext
        )


class Outbox:
    """SQLite-backed (WAL, fsync on commit) store of reports not yet acknowledged; thread safe."""

    def __init__(self, path: Path | str) -> None:
        """Open or create the outbox file at ``path``."""
        self.path = Path(path)
        self._db: sqlite3.Connection | None = open_database(self.path)
        self._lock = threading.Lock()
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(outbox)")}
        if "answer" not in columns:
            self._db.execute(_ADD_ANSWER)

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise RuntimeError("outbox is closed")
        return self._db

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction under the lock: all of it commits or none of it."""
        with self._lock:
            db = self._conn()
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def add_many(self, reports: Iterable[pb.EncryptedReport]) -> int:
        """Store every report in one durable transaction, as independent reports (answer 0: never
        grouped); returns how many were stored. Multi-message answers go through ``add_answers``."""
        rows = [(r.campaign_id, r.key_id, bytes(r.ciphertext)) for r in reports]
        if not rows:
            return 0
        with self._transaction() as db:
            db.executemany("INSERT INTO outbox (campaign_id, key_id, ciphertext) VALUES (?, ?, ?)", rows)
        return len(rows)

    def add_answers(self, answers: Iterable[Sequence[pb.EncryptedReport]]) -> int:
        """Store several answers (each its messages) in one durable transaction; returns messages stored."""
        with self._transaction() as db:
            row = db.execute("SELECT COALESCE(MAX(answer), 0) FROM outbox").fetchone()
            rows = [
                (r.campaign_id, r.key_id, bytes(r.ciphertext), int(row[0]) + number)
                for number, answer in enumerate(answers, start=1)
                for r in answer
            ]
            db.executemany(
                "INSERT INTO outbox (campaign_id, key_id, ciphertext, answer) VALUES (?, ?, ?, ?)", rows
            )
        return len(rows)

    def pending(self, limit: int, campaign_id: str | None = None) -> list[OutboxRow]:
        """About ``limit`` oldest reports, of one campaign if given: the last answer is completed,
        so an answer's messages are never split over two requests."""
        if limit <= 0:
            return []
        sql = "SELECT id, campaign_id, key_id, ciphertext, attempts, answer FROM outbox"
        where = "" if campaign_id is None else " WHERE campaign_id = ?"
        scope: tuple[object, ...] = () if campaign_id is None else (campaign_id,)
        with self._lock:
            db = self._conn()
            rows = db.execute(sql + where + " ORDER BY id LIMIT ?", (*scope, limit)).fetchall()
            if len(rows) == limit and rows[-1][5]:
                rest = " AND answer = ? AND id > ?" if where else " WHERE answer = ? AND id > ?"
                rows += db.execute(
                    sql + where + rest + " ORDER BY id", (*scope, rows[-1][5], rows[-1][0])
                ).fetchall()
        return [OutboxRow(int(i), str(c), int(k), bytes(ct), int(a)) for i, c, k, ct, a, _ in rows]

    def remove(self, ids: Sequence[int]) -> int:
        """Delete the given reports in one transaction; returns how many existed."""
        if not ids:
            return 0
        with self._transaction() as db:
            before = db.total_changes
            db.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i in ids])
            return db.total_changes - before

    def mark_attempt(self, ids: Sequence[int]) -> None:
        """Count one more delivery attempt for each given report."""
        if not ids:
            return
        with self._transaction() as db:
            db.executemany("UPDATE outbox SET attempts = attempts + 1 WHERE id = ?", [(i,) for i in ids])

    def count(self, campaign_id: str | None = None) -> int:
        """Reports waiting, of one campaign if given."""
        with self._lock:
            db = self._conn()
            if campaign_id is None:
                row = db.execute("SELECT COUNT(*) FROM outbox").fetchone()
            else:
                row = db.execute(
                    "SELECT COUNT(*) FROM outbox WHERE campaign_id = ?", (campaign_id,)
                ).fetchone()
            return int(row[0])

    def close(self) -> None:
        """Close the database; further use raises RuntimeError."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    def __enter__(self) -> Outbox:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
