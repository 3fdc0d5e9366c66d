"""Contract suite of SpoolStore, run on both implementations: ``SegmentSpool`` (SQLite) and
``PostgresSpool`` (a real server from tests/support/postgres_server.py), fast paths included."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from deniable.core.batches import batch_digest
from deniable.core.rng import default_rng
from deniable.shuffler import segments, spool_postgres
from deniable.shuffler.columns import ColumnReports
from deniable.shuffler.segments import SegmentSpool
from deniable.shuffler.spool import Envelope, SpoolStore
from deniable.shuffler.spool_postgres import PostgresSpool
from deniable.v1 import deniable_pb2 as pb

Opener = Callable[[], SpoolStore]


IMPLEMENTATIONS = ["sqlite", "postgresql"]


@pytest.fixture(params=IMPLEMENTATIONS)
def open_spool(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens the implementation under test; every call reopens the same underlying storage."""
    opened: list[SpoolStore] = []
    dsn = request.getfixturevalue("spool_dsn") if request.param == "postgresql" else ""

    def opener() -> SpoolStore:
        if request.param == "sqlite":
            store: SpoolStore = SegmentSpool(tmp_path / "spool.sqlite3")
        elif request.param == "postgresql":
            store = PostgresSpool(dsn)
        else:  # pragma: no cover - a name in the fixture params with no opener here
            raise ValueError(f"no spool implementation called {request.param!r}")
        opened.append(store)
        return store

    yield opener
    for store in opened:
        store.close()  # closing twice is allowed


@pytest.fixture
def spool_dsn(postgres_server: Any) -> Iterator[str]:
    """A fresh database on the session's PostgreSQL server (sync: the spool runs its own loop)."""
    name = asyncio.run(postgres_server.create_database("spool"))
    yield postgres_server.dsn(name)
    asyncio.run(postgres_server.drop_database(name))


@pytest.fixture
def spool(open_spool: Opener) -> SpoolStore:
    return open_spool()


def envelopes(campaign_id: str, count: int, start: int = 0, key_id: int = 7) -> list[Envelope]:
    return [
        Envelope(campaign_id, key_id, b"%s-%06d" % (campaign_id.encode(), start + i)) for i in range(count)
    ]


def fixed(order: list[int]) -> Callable[[int], list[int]]:
    def permutation(n: int) -> list[int]:
        return order

    return permutation


def identity(n: int) -> list[int]:
    return list(range(n))


def test_append_counts_per_campaign(spool: SpoolStore) -> None:
    spool.append(envelopes("a", 3) + envelopes("b", 2))
    spool.append([])
    assert spool.pending_count("a") == 3
    assert spool.pending_count("b") == 2
    assert spool.pending_count("nobody") == 0
    assert [(s.campaign_id, s.pending, s.in_flight) for s in spool.stats()] == [("a", 3, 0), ("b", 2, 0)]


def test_form_batch_applies_the_permutation_and_digest(spool: SpoolStore) -> None:
    reports = envelopes("a", 4)
    spool.append(reports)
    record = spool.form_batch("a", 10, fixed([2, 0, 3, 1]))
    assert record is not None
    assert record.campaign_id == "a"
    assert list(record.reports) == [reports[2], reports[0], reports[3], reports[1]]
    assert record.digest == batch_digest(r.ciphertext for r in record.reports)
    assert re.fullmatch(r"[0-9a-f]{32}", record.batch_id)
    assert spool.pending_count("a") == 0
    assert [(s.campaign_id, s.pending, s.in_flight) for s in spool.stats()] == [("a", 0, 4)]


def test_form_batch_takes_the_oldest_up_to_max(spool: SpoolStore) -> None:
    reports = envelopes("a", 5)
    spool.append(reports[:3])
    spool.append(reports[3:])
    first = spool.form_batch("a", 3, identity)
    assert first is not None and list(first.reports) == reports[:3]
    assert spool.pending_count("a") == 2
    second = spool.form_batch("a", 3, identity)
    assert second is not None and list(second.reports) == reports[3:]
    assert first.batch_id != second.batch_id


def test_form_batch_leaves_other_campaigns_alone(spool: SpoolStore) -> None:
    spool.append(envelopes("a", 2) + envelopes("b", 3) + envelopes("a", 2, start=2))
    record = spool.form_batch("a", 100, identity)
    assert record is not None and {r.campaign_id for r in record.reports} == {"a"}
    assert len(record.reports) == 4
    assert spool.pending_count("b") == 3


def test_form_batch_with_nothing_or_too_little_pending_changes_nothing(spool: SpoolStore) -> None:
    assert spool.form_batch("a", 10, identity) is None
    spool.append(envelopes("a", 3))
    assert spool.form_batch("a", 10, identity, min_reports=4) is None
    assert spool.pending_count("a") == 3
    assert spool.unacknowledged_batches() == []
    assert spool.form_batch("a", 10, identity, min_reports=3) is not None


def test_form_batch_refuses_a_non_permutation_and_rolls_back(spool: SpoolStore) -> None:
    spool.append(envelopes("a", 3))
    for bad in ([0, 0, 1], [0, 1], [1, 2, 3]):
        with pytest.raises(ValueError):
            spool.form_batch("a", 10, fixed(bad))
    assert spool.pending_count("a") == 3
    assert spool.unacknowledged_batches() == []
    with pytest.raises(ValueError):
        spool.form_batch("a", 0, identity)


def test_form_batches_slices_one_permutation(spool: SpoolStore) -> None:
    reports = envelopes("a", 7)
    spool.append(reports)
    first, second = spool.form_batches("a", [2, 3], fixed([4, 3, 2, 1, 0]))
    assert list(first.reports) == [reports[4], reports[3]]
    assert list(second.reports) == [reports[2], reports[1], reports[0]]
    for record in (first, second):
        assert record.digest == batch_digest(r.ciphertext for r in record.reports)
    assert first.batch_id != second.batch_id
    assert spool.pending_count("a") == 2  # the two newest stay pending
    assert spool.unacknowledged_batches() == [first, second]


def test_form_batches_changes_nothing_unless_all_sizes_can_be_filled(spool: SpoolStore) -> None:
    spool.append(envelopes("a", 4))
    assert spool.form_batches("a", [3, 2], identity) == []
    assert spool.pending_count("a") == 4
    for bad_sizes in ([], [2, 0]):
        with pytest.raises(ValueError):
            spool.form_batches("a", bad_sizes, identity)
    with pytest.raises(ValueError):
        spool.form_batches("a", [2, 2], fixed([0, 1, 2, 2]))
    assert spool.pending_count("a") == 4 and spool.batch_ids() == []


def test_batch_membership_does_not_follow_arrival_order(spool: SpoolStore) -> None:
    """Of the 50 earliest of 100 reports, how many land in the first of two batches of 50 is
    hypergeometric (mean 25); outside [11, 39] with probability 2.2e-9 (the false-failure rate)."""
    reports = envelopes("a", 100)
    spool.append(reports)
    first, second = spool.form_batches("a", [50, 50], default_rng().permutation)
    early = {r.ciphertext for r in reports[:50]}
    in_first = sum(r.ciphertext in early for r in first.reports)
    assert 11 <= in_first <= 39
    assert sorted(r.ciphertext for r in first.reports + second.reports) == sorted(
        e.ciphertext for e in reports
    )


def test_unacknowledged_batches_oldest_first_and_by_campaign(spool: SpoolStore) -> None:
    spool.append(envelopes("a", 2) + envelopes("b", 2))
    first = spool.form_batch("b", 10, default_rng().permutation)
    second = spool.form_batch("a", 10, default_rng().permutation)
    assert first is not None and second is not None
    assert spool.unacknowledged_batches() == [first, second]
    assert spool.unacknowledged_batches("a") == [second]
    assert spool.batch_ids() == [first.batch_id, second.batch_id]
    assert spool.batch_ids("b") == [first.batch_id]
    assert spool.load_batch(second.batch_id) == second
    assert spool.load_batch("no-such-batch") is None


def test_delete_batch_only_removes_that_batch(spool: SpoolStore) -> None:
    spool.append(envelopes("a", 4))
    one = spool.form_batch("a", 2, identity)
    two = spool.form_batch("a", 2, identity)
    assert one is not None and two is not None
    assert spool.delete_batch(one.batch_id) is True
    assert spool.delete_batch(one.batch_id) is False
    assert spool.unacknowledged_batches() == [two]
    assert [(s.campaign_id, s.pending, s.in_flight) for s in spool.stats()] == [("a", 0, 2)]
    assert spool.delete_batch(two.batch_id)
    assert spool.stats() == []


def test_everything_survives_a_reopen(open_spool: Opener) -> None:
    store = open_spool()
    store.append(envelopes("a", 3) + envelopes("b", 2))
    batch = store.form_batch("a", 10, default_rng().permutation)
    campaign = pb.Campaign(id="a", n_min=3, key_id=7, ciphertext_length=64)
    store.cache_campaign(campaign)
    store.close()
    again = open_spool()
    assert again.pending_count("b") == 2
    assert again.unacknowledged_batches() == [batch]
    assert again.cached_campaign("a") == campaign


def test_campaign_cache(spool: SpoolStore) -> None:
    assert spool.cached_campaign("a") is None
    assert spool.cached_campaigns() == []
    spool.cache_campaign(pb.Campaign(id="b", n_min=1))
    spool.cache_campaign(pb.Campaign(id="a", n_min=2))
    spool.cache_campaign(pb.Campaign(id="a", n_min=3))
    cached = spool.cached_campaign("a")
    assert cached is not None and cached.n_min == 3
    assert [c.id for c in spool.cached_campaigns()] == ["a", "b"]


def test_concurrent_appends_all_land(spool: SpoolStore) -> None:
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda i: spool.append(envelopes("a", 25, start=25 * i)), range(8)))
    assert spool.pending_count("a") == 200
    record = spool.form_batch("a", 1000, default_rng().permutation)
    assert record is not None
    assert sorted(r.ciphertext for r in record.reports) == sorted(e.ciphertext for e in envelopes("a", 200))


def test_scrub_is_harmless(spool: SpoolStore) -> None:
    spool.append(envelopes("a", 2))
    spool.scrub()
    assert spool.pending_count("a") == 2


def test_column_reports_append_like_envelopes(spool: SpoolStore) -> None:
    reports = ColumnReports([("a", [1, 1], [b"x1", b"x2"]), ("b", [2], [b"y1"]), ("c", [], [])])
    assert len(reports) == 3 and list(reports) == [
        Envelope("a", 1, b"x1"),
        Envelope("a", 1, b"x2"),
        Envelope("b", 2, b"y1"),
    ]
    assert reports[2] == Envelope("b", 2, b"y1")
    spool.append(reports)
    assert spool.pending_count("a") == 2 and spool.pending_count("b") == 1
    formed = spool.form_batch_sizes("a", [2], lambda n: [1, 0])
    assert [b.report_count for b in formed] == [2]
    record = spool.load_batch(formed[0].batch_id)
    assert record is not None and [r.ciphertext for r in record.reports] == [b"x2", b"x1"]
    wire = spool.load_wire(formed[0].batch_id)
    assert wire is not None and wire[1] == 2
    assert pb.ShuffledBatch.FromString(wire[0]).batch_id == formed[0].batch_id


def test_pending_segments_are_one_per_request_and_campaign(spool: SpoolStore) -> None:
    spool.append(envelopes("a", 3) + envelopes("b", 1))
    spool.append(envelopes("a", 2, start=3))
    assert spool.pending_segment_counts("a") == [3, 2]
    assert spool.pending_segment_counts("b") == [1]
    assert spool.load_wire("no-such-batch") is None


def test_a_release_is_formed_a_chunk_at_a_time(spool: SpoolStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Forming a release of 500 in chunks of 100 never materialises more than a chunk of reports.

    Structural, not RSS: every ``batch_wire`` call (where a chunk's reports are copied into its
    message) is recorded; the pre-ADR-0042 PostgreSQL spool passed it the whole release (500)
    and so fails here. Formed batches do not keep their wire bytes in memory either.
    """
    built: list[int] = []
    for module in (segments, spool_postgres):
        original = module.batch_wire

        def recording(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            built.append(args[2].count)
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, "batch_wire", recording)
    reports = [envelopes("a", 25, start=25 * i) for i in range(20)]
    for request in reports:
        spool.append(request)
    order = [int(i) for i in default_rng().permutation(500)]
    formed = spool.form_batch_sizes("a", [100] * 5, fixed(order), whole=True)
    assert built == [100] * 5
    assert [b.report_count for b in formed] == [100] * 5 and all(not b.wire for b in formed)
    flat = [e for request in reports for e in request]
    got = [r for b in formed for r in (spool.load_batch(b.batch_id) or pytest.fail("lost")).reports]
    assert got == [flat[i] for i in order]  # one permutation over the whole release, cut in five
    assert spool.pending_count("a") == 0


def test_the_contract_suite_runs_over_both_spools() -> None:
    contract = [
        name
        for name in globals()
        if name.startswith("test_") and name != "test_the_contract_suite_runs_over_both_spools"
    ]
    assert len(contract) >= 12
    assert IMPLEMENTATIONS == ["sqlite", "postgresql"]
