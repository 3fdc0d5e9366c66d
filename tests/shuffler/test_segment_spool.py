"""``SegmentSpool`` (the shuffler's SQLite spool) beyond the contract suite of test_spool_contract.py:
segment splitting, on-disk forgetting, migration from the per-report layout, the wire bytes it builds."""

from __future__ import annotations

import importlib.util
import sqlite3
from pathlib import Path

import pytest

from deniable.core.batches import batch_digest
from deniable.core.rng import default_rng
from deniable.shuffler.columns import Columns, checked_order, shuffled_batch_wire
from deniable.shuffler.forwarder import shuffled_batch
from deniable.shuffler.segments import SegmentSpool
from deniable.shuffler.spool import BatchRecord, Envelope, new_batch_id
from deniable.v1 import deniable_pb2 as pb

_spec = importlib.util.spec_from_file_location(
    "_spool_contract_helpers", Path(__file__).with_name("test_spool_contract.py")
)
assert _spec is not None and _spec.loader is not None
_contract = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_contract)
envelopes = _contract.envelopes  # the contract suite's reports, so both files speak of the same ones


def test_a_segment_split_by_a_batch_keeps_its_tail_pending_in_order(tmp_path: Path) -> None:
    store = SegmentSpool(tmp_path / "s.sqlite3")
    try:
        reports = envelopes("a", 10)
        store.append(reports[:6])
        store.append(reports[6:])
        first = store.form_batch("a", 4, lambda n: list(range(n)))
        assert first is not None and list(first.reports) == reports[:4]
        second = store.form_batch("a", 4, lambda n: list(range(n)))
        assert second is not None and list(second.reports) == reports[4:8]
        assert store.pending_count("a") == 2
    finally:
        store.close()


def test_digest_and_wire_bytes_match_the_reference_encoders() -> None:
    for ciphertexts, key_ids in (
        ([default_rng().bytes(144) for _ in range(50)], [7] * 50),  # the fast path
        ([default_rng().bytes(144) for _ in range(5)], [7, 8, 7, 300, 0]),  # mixed key ids
        ([b"a", b"bcd", b"", b"e" * 200], [1, 1, 1, 1]),  # mixed lengths
    ):
        columns = Columns.of(key_ids, ciphertexts)
        assert columns.digest() == batch_digest(ciphertexts)
        record_reports = tuple(Envelope("camp", k, c) for k, c in zip(key_ids, ciphertexts, strict=True))
        record = BatchRecord("batch-1", "camp", record_reports, columns.digest())
        wire = shuffled_batch_wire("batch-1", "camp", columns.digest(), columns)
        assert pb.ShuffledBatch.FromString(wire) == shuffled_batch(record)


def test_checked_order_refuses_what_is_not_a_permutation() -> None:
    assert checked_order([2, 0, 1], 3).tolist() == [2, 0, 1]
    assert checked_order([], 0).tolist() == []
    for bad in ([0, 0, 1], [0, 1], [1, 2, 3], [-1, 0, 1]):
        with pytest.raises(ValueError):
            checked_order(bad, 3)


def test_segment_tables_hold_nothing_about_the_sender(tmp_path: Path) -> None:
    store = SegmentSpool(tmp_path / "s.sqlite3")
    store.close()
    db = sqlite3.connect(tmp_path / "s.sqlite3")
    columns = {
        table: [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
        for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }
    db.close()
    # Ported from the removed per-report spool (tables pending, batch_reports) to the segment spool.
    assert columns["pending_segments"] == [
        "seq",
        "campaign_id",
        "report_count",
        "key_ids",
        "lengths",
        "ciphertexts",
    ]
    assert columns["batch_segments"] == ["seq", "batch_id", "campaign_id", "report_count", "digest", "wire"]
    every_column = {c for cols in columns.values() for c in cols}
    assert not every_column & {"peer", "address", "ip", "received_at", "ts", "timestamp", "created_at"}


def test_forgets_a_whole_acknowledged_batch_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    store = SegmentSpool(path)
    marker = b"UNIQUE-MARKER-" + default_rng().bytes(16).hex().encode()
    store.append([Envelope("a", 1, marker + b"-%d" % i) for i in range(50)])
    record = store.form_batch("a", 100, default_rng().permutation)
    assert record is not None
    store.delete_batch(record.batch_id)
    store.scrub()
    store.close()
    for file in tmp_path.iterdir():
        assert marker not in file.read_bytes(), file.name


def test_forgets_acknowledged_ciphertexts_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "s.sqlite3"
    store = SegmentSpool(path)
    marker = b"UNIQUE-MARKER-" + default_rng().bytes(16).hex().encode()
    store.append([Envelope("a", 1, marker + b"-%03d" % i) for i in range(50)])
    store.append([Envelope("a", 1, marker + b"-%03d" % i) for i in range(50, 60)])
    record = store.form_batch("a", 55, default_rng().permutation)  # splits the second segment
    assert record is not None
    rest = store.form_batch("a", 55, default_rng().permutation)
    assert rest is not None
    for batch in (record, rest):
        store.delete_batch(batch.batch_id)
    store.scrub()
    store.close()
    for file in tmp_path.iterdir():
        assert marker not in file.read_bytes(), file.name


_PER_REPORT_SCHEMA = """
CREATE TABLE pending (seq INTEGER PRIMARY KEY, campaign_id TEXT NOT NULL, key_id INTEGER NOT NULL,
    ciphertext BLOB NOT NULL);
CREATE TABLE batches (batch_id TEXT PRIMARY KEY, campaign_id TEXT NOT NULL,
    report_count INTEGER NOT NULL, digest BLOB NOT NULL);
CREATE TABLE batch_reports (batch_id TEXT NOT NULL, position INTEGER NOT NULL, key_id INTEGER NOT NULL,
    ciphertext BLOB NOT NULL, PRIMARY KEY (batch_id, position)) WITHOUT ROWID;
CREATE TABLE campaigns (campaign_id TEXT PRIMARY KEY, campaign BLOB NOT NULL) WITHOUT ROWID;
"""
"""The tables of the per-report spool (``SqliteSpool``, removed by ADR 0026), as files still hold them."""


def write_per_report_spool(
    path: Path, reports: list[Envelope], batch_of: str, batch_size: int, campaign: pb.Campaign
) -> BatchRecord:
    """An old per-report spool file: ``reports`` pending, the oldest ``batch_size`` of ``batch_of``
    moved into one permuted batch (as SqliteSpool.form_batch did), ``campaign`` cached."""
    taken = [r for r in reports if r.campaign_id == batch_of][:batch_size]
    order = [int(i) for i in default_rng().permutation(len(taken))]
    shuffled = tuple(taken[i] for i in order)
    batch = BatchRecord(new_batch_id(), batch_of, shuffled, batch_digest(r.ciphertext for r in shuffled))
    db = sqlite3.connect(path)
    with db:
        db.executescript(_PER_REPORT_SCHEMA)
        db.executemany(
            "INSERT INTO pending (campaign_id, key_id, ciphertext) VALUES (?, ?, ?)",
            [(r.campaign_id, r.key_id, r.ciphertext) for r in reports if r not in taken],
        )
        db.execute(
            "INSERT INTO batches VALUES (?, ?, ?, ?)", (batch.batch_id, batch_of, len(shuffled), batch.digest)
        )
        db.executemany(
            "INSERT INTO batch_reports VALUES (?, ?, ?, ?)",
            [(batch.batch_id, pos, r.key_id, r.ciphertext) for pos, r in enumerate(shuffled)],
        )
        db.execute("INSERT INTO campaigns VALUES (?, ?)", (campaign.id, campaign.SerializeToString()))
    db.close()
    return batch


def test_a_per_report_spool_is_migrated_on_open(tmp_path: Path) -> None:
    """No report is lost: pending rows, an unacknowledged batch and the campaign cache all survive."""
    path = tmp_path / "spool.sqlite3"
    reports = envelopes("a", 5) + envelopes("b", 2)
    batch = write_per_report_spool(path, reports, "a", 3, pb.Campaign(id="a", n_min=3))
    store = SegmentSpool(path)
    try:
        assert store.pending_count("a") == 2 and store.pending_count("b") == 2
        assert store.unacknowledged_batches() == [batch]
        assert store.cached_campaign("a") == pb.Campaign(id="a", n_min=3)
        rest = store.form_batch("a", 10, lambda n: list(range(n)))
        assert rest is not None and list(rest.reports) == reports[3:5]
    finally:
        store.close()
    again = SegmentSpool(path)  # a second open migrates nothing twice
    try:
        assert again.pending_count("b") == 2 and again.batch_ids() == [batch.batch_id, rest.batch_id]
    finally:
        again.close()
