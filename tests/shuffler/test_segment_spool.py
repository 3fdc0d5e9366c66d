"""``SegmentSpool`` (the shuffler's default spool): the whole SpoolStore contract suite, plus its own
fast paths, on-disk forgetting, migration from the per-report layout, and the wire bytes it builds.

The contract tests are those of ``test_spool_contract.py``, loaded from that file and run here
against ``SegmentSpool`` (this module's ``open_spool`` fixture replaces the original's).
"""

from __future__ import annotations

import importlib.util
import itertools
import sqlite3
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scipy import stats

from deniable.core.batches import batch_digest
from deniable.core.rng import default_rng
from deniable.shuffler.forwarder import shuffled_batch
from deniable.shuffler.segments import (
    ColumnReports,
    Columns,
    SegmentSpool,
    checked_order,
    shuffled_batch_wire,
)
from deniable.shuffler.spool import Envelope, SpoolStore, SqliteSpool
from deniable.v1 import deniable_pb2 as pb

_spec = importlib.util.spec_from_file_location(
    "_spool_contract_for_segments", Path(__file__).with_name("test_spool_contract.py")
)
assert _spec is not None and _spec.loader is not None
_contract = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_contract)

# Every contract test (and the ``spool`` fixture), collected again in this module.
for _name in dir(_contract):
    if (_name.startswith("test_") and "sqlite" not in _name) or _name == "spool":
        globals()[_name] = getattr(_contract, _name)

envelopes = _contract.envelopes


@pytest.fixture
def open_spool(tmp_path: Path) -> Iterator[Any]:
    opened: list[SpoolStore] = []

    def opener() -> SpoolStore:
        store = SegmentSpool(tmp_path / "spool.sqlite3")
        opened.append(store)
        return store

    yield opener
    for store in opened:
        store.close()


def test_the_contract_suite_was_loaded() -> None:
    loaded = [name for name in globals() if name.startswith("test_") and hasattr(_contract, name)]
    assert len(loaded) >= 12


def test_column_reports_append_like_envelopes(tmp_path: Path) -> None:
    store = SegmentSpool(tmp_path / "s.sqlite3")
    try:
        reports = ColumnReports([("a", [1, 1], [b"x1", b"x2"]), ("b", [2], [b"y1"]), ("c", [], [])])
        assert len(reports) == 3 and list(reports) == [
            Envelope("a", 1, b"x1"),
            Envelope("a", 1, b"x2"),
            Envelope("b", 2, b"y1"),
        ]
        assert reports[2] == Envelope("b", 2, b"y1")
        store.append(reports)
        assert store.pending_count("a") == 2 and store.pending_count("b") == 1
        formed = store.form_batch_sizes("a", [2], lambda n: [1, 0])
        assert [b.report_count for b in formed] == [2]
        record = store.load_batch(formed[0].batch_id)
        assert record is not None and [r.ciphertext for r in record.reports] == [b"x2", b"x1"]
        wire = store.load_wire(formed[0].batch_id)
        assert wire is not None and wire[1] == 2
    finally:
        store.close()


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
        from deniable.shuffler.spool import BatchRecord

        record = BatchRecord("batch-1", "camp", record_reports, columns.digest())
        wire = shuffled_batch_wire("batch-1", "camp", columns.digest(), columns)
        assert pb.ShuffledBatch.FromString(wire) == shuffled_batch(record)


def test_checked_order_refuses_what_is_not_a_permutation() -> None:
    assert checked_order([2, 0, 1], 3).tolist() == [2, 0, 1]
    assert checked_order([], 0).tolist() == []
    for bad in ([0, 0, 1], [0, 1], [1, 2, 3], [-1, 0, 1]):
        with pytest.raises(ValueError):
            checked_order(bad, 3)


def test_batch_orders_are_uniform_over_all_24_permutations(tmp_path: Path) -> None:
    """As test_permutation.py, on this store; fails by chance with probability 1e-6."""
    store = SegmentSpool(tmp_path / "spool.sqlite3")
    ciphertexts = [b"report-%d" % i for i in range(4)]
    formations = 2400
    store.append([Envelope(f"c{j}", 1, c) for j in range(formations) for c in ciphertexts])
    orders: Counter[tuple[int, ...]] = Counter()
    for j in range(formations):
        record = store.form_batch(f"c{j}", 4, default_rng().permutation)
        assert record is not None
        orders[tuple(ciphertexts.index(r.ciphertext) for r in record.reports)] += 1
    store.close()
    observed = [orders[p] for p in itertools.permutations(range(4))]
    assert sum(observed) == formations
    assert stats.chisquare(observed).pvalue > 1e-6, observed


def test_segment_tables_hold_nothing_about_the_sender(tmp_path: Path) -> None:
    SegmentSpool(tmp_path / "s.sqlite3").close()
    db = sqlite3.connect(tmp_path / "s.sqlite3")
    columns = {
        table: [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
        for (table,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }
    db.close()
    assert columns["pending_segments"] == [
        "seq",
        "campaign_id",
        "report_count",
        "key_ids",
        "lengths",
        "ciphertexts",
    ]
    every_column = {c for cols in columns.values() for c in cols}
    assert not every_column & {"peer", "address", "ip", "received_at", "ts", "timestamp", "created_at"}


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


def test_a_per_report_spool_is_migrated_on_open(tmp_path: Path) -> None:
    path = tmp_path / "spool.sqlite3"
    old = SqliteSpool(path)
    reports = envelopes("a", 5) + envelopes("b", 2)
    old.append(reports)
    batch = old.form_batch("a", 3, default_rng().permutation)
    assert batch is not None
    old.cache_campaign(pb.Campaign(id="a", n_min=3))
    old.close()
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
