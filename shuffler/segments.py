"""The shuffler's default spool: the same contract as ``SqliteSpool``, stored in segments.

``SqliteSpool`` keeps one SQLite row per report, written three times (pending, batch, delete) at
about 2 µs each: more CPU than everything else the shuffler does. Here a row is a *segment*:
the reports of one campaign from one SubmitReports request (pending) or one whole permuted
batch, as three column blobs (uint32 key ids, uint32 lengths, ciphertexts back to back). Batch
formation reads the oldest segments, permutes with numpy by the CSPRNG's permutation, and writes
one row per batch; forwarding turns that row straight into the ShuffledBatch wire bytes.

What is on disk says no more than the row layout did: a pending segment groups the reports of
one request, exactly what consecutive row numbers showed before; batches hold permuted reports
only. Pending segments are deleted (``secure_delete``) when their reports enter a batch, and
``scrub`` truncates the WAL. An older file with per-report tables is migrated on open.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol, overload, runtime_checkable

import numpy as np
import numpy.typing as npt

from deniable.core.batches import batch_digest, rows_digest
from deniable.core.protowire import length_delimited, report_prefix, varint
from deniable.shuffler.spool import (
    BatchRecord,
    CampaignSpoolStats,
    Envelope,
    Permutation,
    SpoolDatabase,
    new_batch_id,
    open_spool_database,
    write_transaction,
)
from deniable.v1 import deniable_pb2 as pb

U32: Final = np.dtype("<u4")
PAGE_SIZE: Final = 65536
BATCH_REPORTS_FIELD: Final = 3  # ShuffledBatch.reports

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


Bytes = npt.NDArray[np.uint8]


class CorruptSegment(ValueError):
    """A stored segment whose blobs do not describe whole reports (damaged spool file)."""


@dataclass
class Columns:
    """Reports of one campaign as columns: key ids, lengths, and the ciphertexts back to back.

    ``data`` is a uint8 array (often a view of a stored blob), so permuting, slicing, hashing and
    storing copy the ciphertexts as few times as possible.
    """

    key_ids: npt.NDArray[np.uint32]
    lengths: npt.NDArray[np.uint32]
    data: Bytes

    @property
    def count(self) -> int:
        """Number of reports."""
        return int(self.key_ids.size)

    @classmethod
    def of(cls, key_ids: Sequence[int], ciphertexts: Sequence[bytes]) -> Columns:
        """Columns from per-report key ids and ciphertexts."""
        widths = set(map(len, ciphertexts))
        lengths = (
            np.full(len(ciphertexts), widths.pop(), dtype=U32)
            if len(widths) == 1
            else np.fromiter(map(len, ciphertexts), dtype=U32, count=len(ciphertexts))
        )
        return cls(
            np.asarray(key_ids, dtype=U32).reshape(-1),
            lengths,
            np.frombuffer(b"".join(ciphertexts), dtype=np.uint8),
        )

    @classmethod
    def load(cls, key_ids: bytes, lengths: bytes, data: bytes) -> Columns:
        """Columns over the three stored blobs (no copy); CorruptSegment if they do not fit together."""
        if len(key_ids) % 4 or len(lengths) != len(key_ids):
            raise CorruptSegment(f"segment has {len(key_ids)} bytes of key ids and {len(lengths)} of lengths")
        columns = cls(
            np.frombuffer(key_ids, dtype=U32),
            np.frombuffer(lengths, dtype=U32),
            np.frombuffer(data, dtype=np.uint8),
        )
        if int(columns.lengths.sum(dtype=np.int64)) != len(data):
            raise CorruptSegment(f"segment lengths add up to more or less than its {len(data)} bytes")
        return columns

    def width(self) -> int | None:
        """The common ciphertext length, or None if lengths differ (or there are no reports)."""
        if not self.count:
            return None
        first = int(self.lengths[0])
        return first if bool(np.all(self.lengths == first)) else None

    def ciphertexts(self) -> list[bytes]:
        """Each ciphertext as bytes."""
        width = self.width()
        data = self.data.tobytes()
        if width:  # equal, non-empty ciphertexts: fixed slices
            return [data[i : i + width] for i in range(0, width * self.count, width)]
        ends = np.cumsum(self.lengths, dtype=np.int64).tolist()
        starts = [0, *ends][:-1]  # no reports: no starts
        return [data[s:e] for s, e in zip(starts, ends, strict=True)]

    def envelopes(self, campaign_id: str) -> tuple[Envelope, ...]:
        """The reports as envelopes (for the SpoolStore interface; the fast paths avoid this)."""
        return tuple(
            Envelope(campaign_id, key, ciphertext)
            for key, ciphertext in zip(self.key_ids.tolist(), self.ciphertexts(), strict=True)
        )

    def take(self, order: npt.NDArray[np.int64]) -> Columns:
        """The reports at positions ``order``, in that order."""
        width = self.width()
        if width is not None:
            data = self.data.reshape(self.count, width)[order].reshape(-1)
        else:
            pieces = self.ciphertexts()
            data = np.frombuffer(b"".join(pieces[i] for i in order.tolist()), dtype=np.uint8)
        return Columns(self.key_ids[order], self.lengths[order], data)

    def split(self, count: int) -> tuple[Columns, Columns]:
        """The first ``count`` reports and the rest (views, no copy)."""
        cut = int(self.lengths[:count].sum(dtype=np.int64))
        return (
            Columns(self.key_ids[:count], self.lengths[:count], self.data[:cut]),
            Columns(self.key_ids[count:], self.lengths[count:], self.data[cut:]),
        )

    @staticmethod
    def concat(parts: Sequence[Columns]) -> Columns:
        """All reports of ``parts``, in order."""
        if len(parts) == 1:
            return parts[0]
        return Columns(
            np.concatenate([p.key_ids for p in parts]).astype(U32, copy=False),
            np.concatenate([p.lengths for p in parts]).astype(U32, copy=False),
            np.concatenate([p.data for p in parts]),
        )

    def digest(self) -> bytes:
        """``core.batches.batch_digest`` of the ciphertexts, in one pass when lengths are equal."""
        width = self.width()
        if width is None:
            return batch_digest(list(self.ciphertexts()))
        return rows_digest(self.data.reshape(self.count, width))

    def blobs(self) -> tuple[Bytes, Bytes, Bytes]:
        """The three blobs to store (contiguous arrays, which SQLite binds as BLOBs)."""
        return (
            np.ascontiguousarray(self.key_ids, dtype=U32).view(np.uint8),
            np.ascontiguousarray(self.lengths, dtype=U32).view(np.uint8),
            np.ascontiguousarray(self.data),
        )


class ColumnReports(Sequence[Envelope]):
    """A request's accepted reports as one ``Columns`` segment per campaign.

    It is a sequence of envelopes, so any SpoolStore can ``append`` it; ``SegmentSpool`` takes
    the columns as they are, without an envelope per report.
    """

    def __init__(self, segments: Sequence[tuple[str, Sequence[int], Sequence[bytes]]] = ()) -> None:
        """From (campaign id, key ids, ciphertexts) triples (empty ones are dropped)."""
        self.columns = [(c, Columns.of(k, t)) for c, k, t in segments if len(t)]

    @classmethod
    def of(cls, campaign_id: str, columns: Columns) -> ColumnReports:
        """One campaign's reports, already as columns."""
        made = cls()
        if columns.count:
            made.columns.append((campaign_id, columns))
        return made

    def __len__(self) -> int:
        return sum(columns.count for _, columns in self.columns)

    def __iter__(self) -> Iterator[Envelope]:
        for campaign_id, columns in self.columns:
            yield from columns.envelopes(campaign_id)

    @overload
    def __getitem__(self, index: int) -> Envelope: ...

    @overload
    def __getitem__(self, index: slice) -> list[Envelope]: ...

    def __getitem__(self, index: int | slice) -> Envelope | list[Envelope]:
        everything = list(self)
        return everything[index]


_DIGEST_FIELD_TAG: Final = bytes([4 << 3 | 2, 32])  # ShuffledBatch.digest, 32 bytes


def shuffled_batch_wire(batch_id: str, campaign_id: str, digest: bytes, columns: Columns) -> bytes:
    """The serialised ``ShuffledBatch`` for these reports (in this order), without protobuf.

    Uniform key id and length (the normal case): one prefix and one numpy copy; otherwise one
    element per report. The result parses to the same message as ``forwarder.shuffled_batch``.
    """
    wire, _ = batch_wire(batch_id, campaign_id, columns, np.arange(columns.count, dtype=np.int64), digest)
    return bytes(wire)


@dataclass(frozen=True)
class ReleaseChunk:
    """Where a chunk sits in its release (ADR 0023): one permutation cut into ``count`` chunks."""

    release_id: str
    index: int
    count: int
    messages: int

    def wire(self) -> bytes:
        """ShuffledBatch fields 9-12 (release id, chunk index, chunk count, release messages)."""
        out = length_delimited(9, self.release_id.encode("utf-8"))
        for number, value in ((10, self.index), (11, self.count), (12, self.messages)):
            out += varint(number << 3) + varint(value) if value else b""
        return out


def release_slices(
    take: int, sizes: Sequence[int], permutation: Permutation
) -> list[tuple[npt.NDArray[np.int64], ReleaseChunk | None]]:
    """ONE permutation of ``take`` reports cut into consecutive chunks of ``sizes``, each with its
    place in the release (None when the release is a single batch, the pre-release wire form)."""
    order = checked_order(permutation(take), take)
    release_id = new_batch_id() if len(sizes) > 1 else ""
    out: list[tuple[npt.NDArray[np.int64], ReleaseChunk | None]] = []
    start = 0
    for index, size in enumerate(sizes):
        chunk = ReleaseChunk(release_id, index, len(sizes), take) if release_id else None
        out.append((order[start : start + size], chunk))
        start += size
    return out


def batch_wire(
    batch_id: str,
    campaign_id: str,
    columns: Columns,
    order: npt.NDArray[np.int64],
    digest: bytes | None = None,
    release: ReleaseChunk | None = None,
) -> tuple[bytearray, bytes]:
    """(serialised ShuffledBatch, digest) of the reports ``columns[order]``, with its release place.

    The permuted ciphertexts are copied once, straight into the message; the manifest digest is
    computed over them (``digest`` given: trusted and used as is). The digest field is written
    last: protobuf fields may come in any order, so the message is built before it is known.
    """
    campaign = campaign_id.encode("utf-8")
    head = length_delimited(1, batch_id.encode("utf-8")) + length_delimited(2, campaign)
    head += release.wire() if release is not None else b""
    width = columns.width()
    count = int(order.size)
    keys = columns.key_ids[order] if count else columns.key_ids[:0]
    if count and width is not None and bool(np.all(keys == keys[0])):
        prefix = report_prefix(campaign, int(keys[0]), width, BATCH_REPORTS_FIELD)
        element = len(prefix) + width
        wire = bytearray(len(head) + count * element + len(_DIGEST_FIELD_TAG) + 32)
        wire[: len(head)] = head
        rows = np.frombuffer(wire, dtype=np.uint8, count=count * element, offset=len(head)).reshape(
            count, element
        )
        rows[:, : len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
        np.take(
            columns.data.reshape(columns.count, width), order, axis=0, out=rows[:, len(prefix) :], mode="clip"
        )
        if digest is None:
            digest = rows_digest(rows[:, len(prefix) :])
    else:
        chunk = columns.take(order)
        digest = chunk.digest() if digest is None else digest
        parts = [head]
        for key_id, ciphertext in zip(chunk.key_ids.tolist(), chunk.ciphertexts(), strict=True):
            parts.append(report_prefix(campaign, key_id, len(ciphertext), BATCH_REPORTS_FIELD) + ciphertext)
        wire = bytearray(b"".join(parts) + bytes(len(_DIGEST_FIELD_TAG) + 32))
    if len(digest) != 32:
        raise ValueError("a batch digest is 32 bytes")
    wire[-32 - len(_DIGEST_FIELD_TAG) :] = _DIGEST_FIELD_TAG + digest
    return wire, digest


def parse_batch_wire(wire: bytes | bytearray) -> BatchRecord:
    """The batch record a stored ShuffledBatch message describes (the slow path, for the API)."""
    message = pb.ShuffledBatch.FromString(bytes(wire))
    return BatchRecord(
        batch_id=message.batch_id,
        campaign_id=message.campaign_id,
        reports=tuple(Envelope(r.campaign_id, r.key_id, r.ciphertext) for r in message.reports),
        digest=message.digest,
        release_id=message.release_id,
        chunk_index=message.chunk_index,
        chunk_count=message.chunk_count,
        release_messages=message.release_messages,
    )


def checked_order(order: npt.NDArray[np.int64] | Sequence[int], count: int) -> npt.NDArray[np.int64]:
    """The order as an int64 array; ValueError unless it is a permutation of range(count)."""
    positions = np.asarray(order, dtype=np.int64).reshape(-1)
    if positions.size != count:
        raise ValueError(f"not a permutation of range({count})")
    if count and (int(positions.min()) < 0 or int(positions.max()) >= count):
        raise ValueError(f"not a permutation of range({count})")
    if count and not bool(np.all(np.bincount(positions, minlength=count) == 1)):
        raise ValueError(f"not a permutation of range({count})")
    return positions


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
    by_position = np.argsort(own, kind="stable")
    wanted = own[by_position]
    pieces: list[Columns] = []
    base = 0
    for segment in _segments(db, campaign_id, last, tail):
        low, high = np.searchsorted(wanted, [base, base + segment.count])
        if high > low:
            pieces.append(segment.take(wanted[low:high] - base))
        base += segment.count
    rows = (
        Columns.concat(pieces)
        if pieces
        else Columns(own[:0].astype(U32), own[:0].astype(U32), np.empty(0, np.uint8))
    )
    if rows.count != own.size:
        raise RuntimeError("pending segments changed while a release was formed")
    return rows, np.argsort(by_position).astype(np.int64)


@dataclass
class _Append:
    """One caller's segments waiting for a group commit."""

    segments: list[tuple[str, Columns]]
    done: bool = False
    error: BaseException | None = None


@dataclass(frozen=True)
class FormedBatch:
    """A batch just formed: its id and number of reports (what the batcher needs), and its message."""

    batch_id: str
    campaign_id: str
    report_count: int
    digest: bytes
    wire: bytes | bytearray


@runtime_checkable
class SegmentPaths(Protocol):
    """The fast paths of the segment spools (SQLite and PostgreSQL): batch sizes and wire bytes."""

    def form_batch_sizes(
        self, campaign_id: str, sizes: Sequence[int], permutation: Permutation, whole: bool = False
    ) -> list[FormedBatch]:
        """``form_batches`` without building an envelope per report; ``whole``: requests kept whole."""

    def pending_segment_counts(self, campaign_id: str) -> list[int]:
        """Reports per pending segment (one per request), oldest first."""

    def load_wire(self, batch_id: str) -> tuple[bytes, int] | None:
        """The batch as serialised ``ShuffledBatch`` bytes and its report count, or None."""


class SegmentSpool(SpoolDatabase):
    """SpoolStore on one SQLite file (WAL, synchronous=FULL, secure_delete), reports in segments.

    Thread safe. Besides the SpoolStore methods it offers the fast paths the shuffler uses:
    ``append`` of ``ColumnReports`` (a request's accepted reports without an envelope each),
    ``form_batch_sizes`` (ids and sizes only) and ``load_wire`` (the ShuffledBatch bytes).
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

    def append(self, reports: Sequence[Envelope]) -> None:
        """Insert every report durably: one segment per campaign, order kept.

        Group commit: appends that arrive while another one is committing wait for the lock and
        are then written together, in one transaction and one fsync. Each call still returns
        only once its own reports are durable (or raises if that transaction failed).
        """
        if not reports:
            return
        if isinstance(reports, ColumnReports):
            segments = list(reports.columns)
        else:
            by_campaign: dict[str, tuple[list[int], list[bytes]]] = {}
            for report in reports:
                keys, ciphertexts = by_campaign.setdefault(report.campaign_id, ([], []))
                keys.append(int(report.key_id))
                ciphertexts.append(bytes(report.ciphertext))
            segments = [(c, Columns.of(k, t)) for c, (k, t) in by_campaign.items()]
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

    def _form(
        self,
        campaign_id: str,
        sizes: list[int] | None,
        limit: int,
        at_least: int,
        permutation: Permutation,
        whole: bool = False,
    ) -> list[FormedBatch]:
        """Take up to ``limit`` oldest reports (none if fewer than ``at_least``), permute, slice, store.

        ONE permutation of everything taken, cut into chunks of ``sizes`` (ADR 0023). ``whole``: the
        release ends on a segment boundary, so a request's reports all land in one release.
        """
        formed: list[FormedBatch] = []

        def work(db: sqlite3.Connection) -> None:
            seqs, total, _ = _oldest_segments(db, campaign_id, limit)
            if not seqs or total < at_least:
                return
            take = min(limit, total)
            if whole and total > take:
                raise ValueError("batch sizes do not fall on request boundaries")
            tail = None
            if total > take:  # the newest segment stays partly pending: keep its head in memory
                tail = _split_newest(db, seqs.pop(), total - take)
            # ONE permutation of the whole release, cut into chunks (ADR 0023). Each chunk is
            # gathered by one pass over the stored segments, so memory is a chunk, not the release.
            for own, chunk in release_slices(take, sizes or [take], permutation):
                batch_id = new_batch_id()
                rows, order = _gather(db, campaign_id, seqs[-1] if seqs else None, tail, own)
                wire, digest = batch_wire(batch_id, campaign_id, rows, order, release=chunk)
                del rows
                self._insert_batch(db, batch_id, campaign_id, int(own.size), digest, wire)
                formed.append(FormedBatch(batch_id, campaign_id, int(own.size), digest, b""))
                del wire
            if seqs:
                db.execute(
                    "DELETE FROM pending_segments WHERE campaign_id = ? AND seq <= ?", (campaign_id, seqs[-1])
                )

        try:
            self._write(work)
        except BaseException:
            formed.clear()
            raise
        return formed

    def _record(self, batch: FormedBatch) -> BatchRecord:
        """The formed batch as a record (read back: its wire bytes are not kept after storing)."""
        stored = self.load_batch(batch.batch_id) if not batch.wire else None
        return stored if stored is not None else parse_batch_wire(batch.wire)

    def form_batch(
        self, campaign_id: str, max_reports: int, permutation: Permutation, min_reports: int = 1
    ) -> BatchRecord | None:
        """Move the oldest ``max_reports`` pending reports into a permuted batch in one transaction."""
        if max_reports < 1:
            raise ValueError("max_reports must be at least 1")
        formed = self._form(campaign_id, None, max_reports, max(1, min_reports), permutation)
        return self._record(formed[0]) if formed else None

    def form_batches(
        self, campaign_id: str, sizes: Sequence[int], permutation: Permutation
    ) -> list[BatchRecord]:
        """Several batches from one permutation of the oldest sum(sizes) pending reports."""
        return [self._record(b) for b in self.form_batch_sizes(campaign_id, sizes, permutation)]

    def form_batch_sizes(
        self, campaign_id: str, sizes: Sequence[int], permutation: Permutation, whole: bool = False
    ) -> list[FormedBatch]:
        """``form_batches`` without building an envelope per report; ``whole``: see ``_form``."""
        if not sizes or min(sizes) < 1:
            raise ValueError("batch sizes must be at least 1")
        total = sum(sizes)
        return self._form(campaign_id, list(sizes), total, total, permutation, whole)

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

    def _load(self, batch_id: str) -> FormedBatch | None:
        with self._lock:
            row = self._db.execute(
                "SELECT campaign_id, report_count, digest, wire FROM batch_segments WHERE batch_id = ?",
                (batch_id,),
            ).fetchone()
        if row is None:
            return None
        return FormedBatch(batch_id, str(row[0]), int(row[1]), bytes(row[2]), bytes(row[3]))

    def load_batch(self, batch_id: str) -> BatchRecord | None:
        """One unacknowledged batch with its reports in the stored (permuted) order."""
        batch = self._load(batch_id)
        return None if batch is None else self._record(batch)

    def load_wire(self, batch_id: str) -> tuple[bytes, int] | None:
        """The batch as serialised ``ShuffledBatch`` bytes and its report count, or None."""
        batch = self._load(batch_id)
        return None if batch is None else (bytes(batch.wire), batch.report_count)

    def unacknowledged_batches(self, campaign_id: str | None = None) -> list[BatchRecord]:
        """Every unacknowledged batch, oldest first."""
        batches = (self.load_batch(batch_id) for batch_id in self.batch_ids(campaign_id))
        return [b for b in batches if b is not None]

    def delete_batch(self, batch_id: str) -> bool:
        """Delete an acknowledged batch in one transaction."""
        deleted: list[int] = []
        self._write(
            lambda db: deleted.append(
                db.execute("DELETE FROM batch_segments WHERE batch_id = ?", (batch_id,)).rowcount
            )
        )
        return deleted[0] > 0
