"""Contract suite for AggregatorStore: every implementation in STORE_FACTORIES must pass it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import pytest

from deniable.aggregator.ingest_plan import Counting, plan_ingest
from deniable.aggregator.releases import ReleaseCheck, ReleaseConflict
from deniable.aggregator.store import (
    AggregatorStore,
    BatchConflict,
    CampaignExists,
    CampaignIdTombstoned,
    IngestOutcome,
    UnknownCampaign,
)
from deniable.core.batches import ReleaseChunk
from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:  # the open_store fixture's type only
    from support.aggregator_kit import StoreOpener


CELLS = 3
DUP = int(pb.DUPLICATE_REPORT)
UNDECRYPTABLE = int(pb.UNDECRYPTABLE)


def campaign(campaign_id: str = "c1") -> pb.Campaign:
    return pb.Campaign(
        id=campaign_id,
        question="q",
        kind=pb.CATEGORICAL,
        labels=["a", "b", "c"],
        mechanism=pb.GRR,
        epsilon0=1.0,
        delta=1e-6,
        n_min=10,
        key_id=1,
        public_key=bytes(32),
        created_unix=1_700_000_000,
    )


def count_cells(payloads: Sequence[bytes]) -> np.ndarray:
    return np.bincount([p[0] for p in payloads], minlength=CELLS).astype(np.int64)


def reports(values: Sequence[int]) -> list[tuple[bytes, bytes]]:
    return [(os.urandom(16), bytes([v])) for v in values]


async def ingest(
    store: AggregatorStore,
    batch_id: str,
    valid: Sequence[tuple[bytes, bytes]],
    *,
    campaign_id: str = "c1",
    rejected: dict[int, int] | None = None,
    digest: bytes = b"d",
    batch_size: int | None = None,
) -> IngestOutcome:
    return await store.apply(
        plan_ingest(
            batch_id=batch_id,
            campaign_id=campaign_id,
            digest=digest,
            batch_size=batch_size if batch_size is not None else len(valid) + sum((rejected or {}).values()),
            valid_reports=valid,
            rejected=rejected or {},
            counting=Counting(cells=CELLS, count_cells=count_cells),
        )
    )


async def test_campaign_round_trip_and_listing(store: AggregatorStore) -> None:
    await store.create_campaign(campaign("c1"))
    await store.create_campaign(campaign("c2"))
    assert await store.get_campaign("c1") == campaign("c1")
    assert await store.get_campaign("missing") is None
    assert [c.id for c in await store.list_campaigns()] == ["c1", "c2"]


async def test_ping_answers_while_open_and_raises_once_closed(open_store: StoreOpener) -> None:
    """Health reads ``ping``: it must answer while the store works and fail when it cannot."""
    store = await open_store()
    await store.ping()
    await store.close()
    with pytest.raises(Exception):  # noqa: B017 - any error means "unreachable" to health
        await store.ping()


async def test_duplicate_campaign_id_is_refused(store: AggregatorStore) -> None:
    await store.create_campaign(campaign("c1"))
    changed = campaign("c1")
    changed.question = "other"
    with pytest.raises(CampaignExists):
        await store.create_campaign(changed)
    stored = await store.get_campaign("c1")
    assert stored is not None and stored.question == "q"


async def test_update_campaign_replaces_the_description(store: AggregatorStore) -> None:
    await store.create_campaign(campaign("c1"))
    changed = campaign("c1")
    changed.window_end_unix = 1_700_000_100
    changed.closed = True
    await store.update_campaign(changed)
    assert await store.get_campaign("c1") == changed
    with pytest.raises(UnknownCampaign):
        await store.update_campaign(campaign("missing"))
    assert await store.get_campaign("missing") is None


async def test_fresh_campaign_snapshot_is_empty(store: AggregatorStore) -> None:
    await store.create_campaign(campaign())
    snap = await store.snapshot("c1", CELLS)
    assert (snap.counts, snap.n, snap.smallest_batch, snap.rejected, snap.batches) == ([0, 0, 0], 0, 0, {}, 0)


async def test_unknown_campaign(store: AggregatorStore) -> None:
    with pytest.raises(UnknownCampaign):
        await store.snapshot("nope", CELLS)
    with pytest.raises(UnknownCampaign):
        await ingest(store, "b1", reports([0]), campaign_id="nope")
    assert await store.find_batch("b1") is None


async def test_ingest_counts_and_rejections(store: AggregatorStore) -> None:
    await store.create_campaign(campaign())
    out = await ingest(store, "b1", reports([0, 1, 1, 2, 2, 2]), rejected={UNDECRYPTABLE: 2})
    assert not out.duplicate_batch
    assert out.counted == 6
    assert out.rejected == {UNDECRYPTABLE: 2}
    out = await ingest(store, "b2", reports([2, 2]), rejected={UNDECRYPTABLE: 1, int(pb.UNKNOWN_KEY_ID): 3})
    snap = await store.snapshot("c1", CELLS)
    assert snap.counts == [1, 2, 5]
    assert snap.n == 8
    assert snap.rejected == {UNDECRYPTABLE: 3, int(pb.UNKNOWN_KEY_ID): 3}
    assert snap.batches == 2
    record = await store.find_batch("b1")
    assert record is not None and (record.campaign_id, record.digest, record.counted) == ("c1", b"d", 6)


async def test_same_batch_twice_changes_nothing(store: AggregatorStore) -> None:
    await store.create_campaign(campaign())
    valid = reports([0, 1, 2])
    first = await ingest(store, "b1", valid, rejected={UNDECRYPTABLE: 1})
    before = await store.snapshot("c1", CELLS)
    again = await ingest(store, "b1", valid, rejected={UNDECRYPTABLE: 1})
    assert not first.duplicate_batch and again.duplicate_batch
    assert again.counted == 0
    assert await store.snapshot("c1", CELLS) == before


async def test_reused_batch_id_with_other_content_conflicts(store: AggregatorStore) -> None:
    await store.create_campaign(campaign())
    await ingest(store, "b1", reports([0]), digest=b"first")
    with pytest.raises(BatchConflict):
        await ingest(store, "b1", reports([1]), digest=b"second")
    assert (await store.snapshot("c1", CELLS)).counts == [1, 0, 0]


async def test_duplicate_report_ids_counted_once(store: AggregatorStore) -> None:
    await store.create_campaign(campaign())
    await store.create_campaign(campaign("c2"))
    shared = reports([1, 2])
    inside = (os.urandom(16), bytes([0]))
    out = await ingest(store, "b1", [*shared, inside, (inside[0], bytes([2]))])
    assert out.counted == 3 and out.rejected == {DUP: 1}
    out = await ingest(store, "b2", [*shared, *reports([0])])
    assert out.counted == 1 and out.rejected == {DUP: 2}
    # Report ids are per campaign: the same ids in another campaign count.
    out = await ingest(store, "b3", shared, campaign_id="c2")
    assert out.counted == 2 and out.rejected == {}
    snap = await store.snapshot("c1", CELLS)
    assert snap.counts == [2, 1, 1]  # the first payload of a repeated id wins
    assert snap.n == 4
    assert snap.rejected == {DUP: 3}


async def test_smallest_batch_is_the_smallest_counted_shuffle(store: AggregatorStore) -> None:
    await store.create_campaign(campaign())
    await ingest(store, "b1", reports([0] * 50))
    await ingest(store, "b2", reports([1] * 30), rejected={UNDECRYPTABLE: 5})
    await ingest(store, "b3", [], rejected={UNDECRYPTABLE: 4})  # counted nothing: hides nobody
    await ingest(store, "b4", reports([2] * 40))
    snap = await store.snapshot("c1", CELLS)
    assert snap.smallest_batch == 30
    assert snap.batches == 4
    assert snap.n == 120


async def test_failed_count_rolls_back_everything(store: AggregatorStore) -> None:
    await store.create_campaign(campaign())
    valid = reports([0, 1])

    def broken(payloads: Sequence[bytes]) -> np.ndarray:
        raise RuntimeError("tally failed")

    with pytest.raises(RuntimeError):
        await store.apply(
            plan_ingest(
                batch_id="b1",
                campaign_id="c1",
                digest=b"d",
                batch_size=3,
                valid_reports=valid,
                rejected={UNDECRYPTABLE: 1},
                counting=Counting(cells=CELLS, count_cells=broken),
            )
        )
    assert await store.find_batch("b1") is None
    snap = await store.snapshot("c1", CELLS)
    assert (snap.n, snap.rejected, snap.batches) == (0, {}, 0)
    # The report ids were not burnt: a retry counts them.
    out = await ingest(store, "b1", valid)
    assert out.counted == 2 and out.rejected == {}


async def test_failure_inside_the_transaction_rolls_back_everything(store: AggregatorStore) -> None:
    """A recount that fails after the report ids were recorded (a cross-batch repeat) undoes them."""
    await store.create_campaign(campaign())
    earlier = reports([0])
    await ingest(store, "b0", earlier)
    valid = [*earlier, *reports([1, 2])]
    calls = 0

    def fails_on_recount(payloads: Sequence[bytes]) -> np.ndarray:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise RuntimeError("recount failed")
        return count_cells(payloads)

    plan = plan_ingest(
        batch_id="b1",
        campaign_id="c1",
        digest=b"d",
        batch_size=3,
        valid_reports=valid,
        rejected={},
        counting=Counting(cells=CELLS, count_cells=fails_on_recount),
    )
    with pytest.raises(RuntimeError):
        await store.apply(plan)
    assert await store.find_batch("b1") is None
    assert await store.report_id_count("c1") == 1
    out = await ingest(store, "b1", valid)
    assert (out.counted, out.rejected) == (2, {DUP: 1})


async def test_state_survives_reopen(open_store: StoreOpener) -> None:
    first = await open_store()
    await first.create_campaign(campaign())
    valid = reports([2, 2, 1])
    await ingest(first, "b1", valid, rejected={UNDECRYPTABLE: 1})
    await first.close()
    second = await open_store()
    snap = await second.snapshot("c1", CELLS)
    assert (snap.counts, snap.n, snap.rejected, snap.batches) == ([0, 1, 2], 3, {UNDECRYPTABLE: 1}, 1)
    assert (await ingest(second, "b1", valid)).duplicate_batch
    assert (await ingest(second, "b2", valid)).rejected == {DUP: 3}


async def test_concurrent_ingests_all_counted(store: AggregatorStore) -> None:
    await store.create_campaign(campaign())
    outs = await asyncio.gather(*(ingest(store, f"b{i}", reports([i % CELLS] * 100)) for i in range(12)))
    assert sum(o.counted for o in outs) == 1200
    snap = await store.snapshot("c1", CELLS)
    assert snap.counts == [400, 400, 400] and snap.n == 1200 and snap.batches == 12


async def test_a_large_batch_is_counted_whole_and_deduplicated_whole(store: AggregatorStore) -> None:
    """50,000 reports in one batch, then half of them again: counted once each. Speed is measured by
    bench/store_ingest.py, never asserted here (a wall-clock bound fails on a loaded machine)."""
    await store.create_campaign(campaign())
    valid = [(os.urandom(16), bytes([i % CELLS])) for i in range(50_000)]
    out = await ingest(store, "big", valid)
    assert out.counted == 50_000
    again = await ingest(store, "big-again", valid[:25_000] + reports([0] * 25_000))
    assert again.counted == 25_000 and again.rejected == {DUP: 25_000}


async def test_closed_store_refuses_work(open_store: StoreOpener) -> None:
    store = await open_store()
    await store.close()
    with pytest.raises(Exception):  # noqa: B017 (any error, but never a silent success)
        await store.get_campaign("c1")
    await store.close()  # idempotent


# ---------------------------------------------------------------- several stores on one storage
# Aggregator replicas share one database: each store below is a separate instance (its own
# connection or pool) on the same backing storage, ingesting at the same time.


async def test_same_batch_from_two_stores_counts_once(open_store: StoreOpener) -> None:
    first, second = await open_store(), await open_store()
    await first.create_campaign(campaign())
    rounds = 6
    for i in range(rounds):
        valid = reports([i % CELLS] * 200)
        outs = await asyncio.gather(ingest(first, f"b{i}", valid), ingest(second, f"b{i}", valid))
        assert sorted(o.duplicate_batch for o in outs) == [False, True], outs
        assert sum(o.counted for o in outs) == 200
    for store in (first, second):
        snap = await store.snapshot("c1", CELLS)
        assert (snap.n, snap.batches, snap.rejected) == (200 * rounds, rounds, {})
        assert snap.counts == [400, 400, 400]


async def test_overlapping_batches_from_several_stores_lose_nothing(open_store: StoreOpener) -> None:
    stores = [await open_store() for _ in range(3)]
    await stores[0].create_campaign(campaign())
    # 12 batches of 300 ids; each batch repeats the last 60 ids of the one before it. A report's
    # payload depends only on its id, so whichever batch counts a shared id, the cells agree.
    ids = [os.urandom(16) for _ in range(12 * 240 + 60)]
    payload = {rid: bytes([k % CELLS]) for k, rid in enumerate(ids)}
    batches = [[(rid, payload[rid]) for rid in ids[240 * b : 240 * b + 300]] for b in range(12)]
    outs = await asyncio.gather(
        *(ingest(stores[b % len(stores)], f"b{b}", valid) for b, valid in enumerate(batches))
    )
    assert sum(o.counted for o in outs) == len(ids)
    assert sum(o.rejected.get(DUP, 0) for o in outs) == 11 * 60
    snap = await stores[1].snapshot("c1", CELLS)
    assert snap.counts == [sum(1 for k in range(len(ids)) if k % CELLS == cell) for cell in range(CELLS)]
    assert (snap.n, snap.batches, snap.rejected) == (len(ids), 12, {DUP: 11 * 60})


async def test_one_batch_id_raced_into_two_campaigns(open_store: StoreOpener) -> None:
    first, second = await open_store(), await open_store()
    await first.create_campaign(campaign("c1"))
    await first.create_campaign(campaign("c2"))
    outs = await asyncio.gather(
        ingest(first, "shared", reports([0] * 100), campaign_id="c1"),
        ingest(second, "shared", reports([1] * 100), campaign_id="c2"),
        return_exceptions=True,
    )
    assert sorted(type(o).__name__ for o in outs) == ["BatchConflict", "IngestOutcome"], outs
    won = "c1" if isinstance(outs[0], IngestOutcome) else "c2"
    record = await second.find_batch("shared")
    assert record is not None and record.campaign_id == won
    totals = [(await first.snapshot(c, CELLS)).n for c in ("c1", "c2")]
    assert totals == ([100, 0] if won == "c1" else [0, 100])


async def test_delete_campaign_removes_it_and_everything_counted(store: AggregatorStore) -> None:
    """Deleted: gone from listings, counts, batches and seen report ids; others untouched; the id
    is tombstoned and never reused (issue 20, ADR 0031; ADR 0021 let it be reused from zero)."""
    await store.create_campaign(campaign("c1"))
    await store.create_campaign(campaign("c2"))
    shared = reports([0, 1, 2])
    await ingest(store, "b1", shared, rejected={UNDECRYPTABLE: 1})
    await ingest(store, "b2", reports([1]))
    await ingest(store, "b3", shared, campaign_id="c2")
    assert await store.delete_campaign("c1") == (4, 2)
    assert [c.id for c in await store.list_campaigns()] == ["c2"]
    assert await store.get_campaign("c1") is None
    assert await store.find_batch("b1") is None
    with pytest.raises(UnknownCampaign):
        await store.snapshot("c1", CELLS)
    with pytest.raises(UnknownCampaign):
        await store.delete_campaign("c1")
    other = await store.snapshot("c2", CELLS)
    assert (other.n, other.counts, other.batches) == (3, [1, 1, 1], 1)
    with pytest.raises(CampaignIdTombstoned):
        await store.create_campaign(campaign("c1"))
    with pytest.raises(CampaignExists):  # a tombstone is a kind of "exists" for older callers
        await store.create_campaign(campaign("c1"))
    assert await store.get_campaign("c1") is None
    await store.create_campaign(campaign("c3"))  # other ids are untouched by the tombstone


CLOSED = int(pb.CAMPAIGN_CLOSED)


async def test_retiring_forgets_ids_and_refuses_replays(open_store: StoreOpener) -> None:
    """Retention: after GC the ids are gone (the store shrinks) and a replay is CAMPAIGN_CLOSED, never
    counted, even after a reopen. Without the retired mark the replay would count (ids are gone)."""
    store = await open_store()
    await store.create_campaign(campaign("c1"))
    await store.create_campaign(campaign("c2"))
    first = reports([0, 1, 2, 2])
    await ingest(store, "b1", first)
    await ingest(store, "b2", reports([1]), campaign_id="c2")
    assert await store.report_id_count("c1") == 4
    before = await store.snapshot("c1", CELLS)

    assert await store.retire_campaign("c1") == 4
    assert await store.retire_campaign("c1") == 0  # idempotent
    assert await store.report_id_count("c1") == 0
    assert await store.report_id_count("c2") == 1  # other campaigns keep theirs
    assert await store.retired() == {"c1"}

    await store.close()
    store = await open_store()
    outcome = await ingest(store, "b3", first + reports([0]), rejected={UNDECRYPTABLE: 1})
    assert (outcome.counted, outcome.rejected) == (0, {CLOSED: 5, UNDECRYPTABLE: 1})
    after = await store.snapshot("c1", CELLS)
    assert (after.counts, after.n) == (before.counts, before.n)
    assert after.rejected == {CLOSED: 5, UNDECRYPTABLE: 1}
    assert await store.report_id_count("c1") == 0
    with pytest.raises(UnknownCampaign):
        await store.retire_campaign("missing")


# --- release accounting (ADR 0023) --------------------------------------------------------------


async def ingest_chunk(
    store: AggregatorStore,
    batch_id: str,
    valid: Sequence[tuple[bytes, bytes]],
    chunk: ReleaseChunk,
    check: ReleaseCheck | None = None,
) -> IngestOutcome:
    return await store.apply(
        plan_ingest(
            batch_id=batch_id,
            campaign_id="c1",
            digest=b"d" + batch_id.encode(),
            batch_size=len(valid),
            valid_reports=valid,
            rejected={},
            counting=Counting(cells=CELLS, count_cells=count_cells, check_release=check),
            release=chunk,
        )
    )


async def test_a_release_is_counted_only_once_every_chunk_is_in(store: AggregatorStore) -> None:
    """Chunks are held apart: n, counts and the smallest batch change only at the last chunk, and
    then by the release's total (a chunk below the total is not a shuffle of its own)."""
    await store.create_campaign(campaign())
    await ingest(store, "plain", reports([0] * 20))
    parts = [reports([0] * 4 + [1] * 3), reports([2] * 5), reports([1] * 8)]
    total = sum(map(len, parts))
    for index, part in enumerate(parts[:2]):
        await ingest_chunk(store, f"r{index}", part, ReleaseChunk("R", index, 3, total))
        snap = await store.snapshot("c1", CELLS)
        assert (snap.n, snap.counts, snap.batches, snap.smallest_batch) == (20, [20, 0, 0], 1, 20)
        assert (snap.releases, snap.incomplete_releases) == (0, 1)
    again = await ingest_chunk(store, "r1", parts[1], ReleaseChunk("R", 1, 3, total))
    assert again.duplicate_batch  # a retried chunk is idempotent on its batch id
    await ingest_chunk(store, "r2", parts[2], ReleaseChunk("R", 2, 3, total))
    snap = await store.snapshot("c1", CELLS)
    assert (snap.n, snap.counts, snap.batches, snap.smallest_batch) == (40, [24, 11, 5], 2, 20)
    assert (snap.releases, snap.incomplete_releases) == (1, 0)


async def test_chunks_that_disagree_on_their_release_count_nothing(store: AggregatorStore) -> None:
    """A chunk claiming another total or chunk count, a repeated index, or a release whose chunks do
    not add up to its claimed total: ReleaseConflict, and the offending chunk leaves no trace."""
    await store.create_campaign(campaign())
    await ingest_chunk(store, "a0", reports([0] * 5), ReleaseChunk("R", 0, 2, 10))
    with pytest.raises(ReleaseConflict):
        await ingest_chunk(store, "a1", reports([1] * 5), ReleaseChunk("R", 1, 2, 11))
    with pytest.raises(ReleaseConflict):
        await ingest_chunk(store, "a1", reports([1] * 5), ReleaseChunk("R", 1, 3, 10))
    with pytest.raises(ReleaseConflict):
        await ingest_chunk(store, "a1", reports([1] * 5), ReleaseChunk("R", 0, 2, 10))
    with pytest.raises(ReleaseConflict):  # the last chunk, but 9 messages instead of the 10 claimed
        await ingest_chunk(store, "a1", reports([1] * 4), ReleaseChunk("R", 1, 2, 10))
    assert await store.find_batch("a1") is None
    snap = await store.snapshot("c1", CELLS)
    assert (snap.n, snap.counts, snap.batches, snap.incomplete_releases) == (0, [0, 0, 0], 0, 1)
    await ingest_chunk(store, "a1", reports([1] * 5), ReleaseChunk("R", 1, 2, 10))
    snap = await store.snapshot("c1", CELLS)
    assert (snap.n, snap.counts, snap.smallest_batch, snap.releases) == (10, [5, 5, 0], 10, 1)


async def test_a_claimed_huge_release_is_never_stated(store: AggregatorStore) -> None:
    """A shuffler claiming a million-message release but sending 10 messages states nothing."""
    await store.create_campaign(campaign())
    await ingest_chunk(store, "h0", reports([0] * 10), ReleaseChunk("H", 0, 2, 1_000_000))
    snap = await store.snapshot("c1", CELLS)
    assert (snap.n, snap.smallest_batch, snap.batches, snap.incomplete_releases) == (0, 0, 0, 1)


async def test_a_complete_release_the_check_refuses_counts_nothing(store: AggregatorStore) -> None:
    """``check_release`` sees the whole release's counts; a refusal rolls back the last chunk."""
    await store.create_campaign(campaign())
    seen: list[tuple[list[int], int]] = []

    def refuse(counts: Sequence[int], messages: int) -> str | None:
        seen.append((list(counts), messages))
        return "not whole devices"

    await ingest_chunk(store, "x0", reports([0] * 3), ReleaseChunk("X", 0, 2, 6), refuse)
    assert seen == []  # not complete yet
    with pytest.raises(ReleaseConflict, match="not whole devices"):
        await ingest_chunk(store, "x1", reports([2] * 3), ReleaseChunk("X", 1, 2, 6), refuse)
    assert seen == [([3, 0, 3], 6)]
    snap = await store.snapshot("c1", CELLS)
    assert (snap.n, snap.counts, snap.releases) == (0, [0, 0, 0], 0)
