"""Batch policy end to end: n_min hold, batch target, window close, flush override, whole requests,
manifest, exactly once."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace

from deniable.core.batches import batch_digest
from deniable.shuffler.batcher import chunk_sizes
from deniable.v1 import deniable_pb2 as pb


async def submit(shuffler, kit: SimpleNamespace, campaign: pb.Campaign, count: int, start: int = 0):
    reports = kit.make_reports(campaign, count, start=start)
    response = await shuffler.handlers.submit(pb.SubmitReportsRequest(reports=reports))
    assert response.accepted == count
    return reports


def test_chunk_sizes() -> None:
    grid = [(10, 5), (10, 3), (7, 1), (10, 8), (3, 5), (50_000, 1000), (1, 1)]
    for max_batch, n_min in grid:
        for pending in [*range(1, 120), 999, 1000, 1001, 12_345, 123_457]:
            sizes = chunk_sizes(pending, max_batch, n_min)
            context = (pending, max_batch, n_min, sizes)
            assert sum(sizes) == pending, context
            assert max(sizes) - min(sizes) <= 1, context
            if pending >= n_min:
                assert min(sizes) >= n_min, context  # privacy first, even when max_batch < 2·n_min
                if max_batch >= 2 * n_min:
                    assert max(sizes) <= max_batch, context
                    assert len(sizes) == -(-pending // max_batch), context
            else:
                assert max(sizes) <= max_batch, context


def test_chunk_sizes_of_nothing() -> None:
    assert chunk_sizes(0, 10, 5) == []


async def test_holds_below_the_batch_target_however_long_then_releases_at_it(
    upstream, start, kit: SimpleNamespace
) -> None:
    """No quiet-period release: 6 ≥ n_min reports wait through many ticks until the target (8)."""
    campaign = upstream.fake.add(kit.make_campaign("c1", n_min=5, batch_target=8))
    shuffler = await start()
    await submit(shuffler, kit, campaign, 6)
    await asyncio.sleep(0.8)  # 16 batching ticks with no arrival: the old quiet period (0.2 s) released here
    assert upstream.fake.calls == []
    await submit(shuffler, kit, campaign, 2, start=6)
    await kit.eventually(lambda: len(upstream.fake.acked) == 1)
    assert len(upstream.fake.acked[0].reports) == 8
    # The shuffler deletes a batch after the ack reaches it: under I/O load that fsync can trail the
    # fake's record of the ack, so wait for it (the assertion is unchanged).
    await kit.eventually(lambda: shuffler.handlers.store.stats() == [])
    stats = await shuffler.handlers.stats()
    assert list(stats.campaigns) == []


async def test_no_batch_below_the_target_without_flush_or_window_close(
    upstream, start, kit: SimpleNamespace
) -> None:
    """Reports trickle in by requests of random sizes: every batch formed on its own holds ≥ the target.

    Fails if any release path other than the target (e.g. a quiet period or the size cap) cuts a
    smaller batch. The operator's flush then releases the rest, and it is counted as such.
    """
    campaign = upstream.fake.add(kit.make_campaign("c1", n_min=5, batch_target=20))
    shuffler = await start(max_batch_reports=7)  # a cap below the target never cuts below it
    sent = 0
    for size in (3, 1, 9, 4, 2, 11, 6, 1, 8, 5, 13, 2, 7):
        await submit(shuffler, kit, campaign, size, start=sent)
        sent += size
        await asyncio.sleep(0.07)  # let the background loop (50 ms ticks) see every intermediate state
        if sent == 13:  # ≥ n_min held, no arrival for 0.5 s: the old quiet-period rule released here
            await asyncio.sleep(0.5)

    async def settled() -> bool:
        spool = (await shuffler.handlers.stats()).campaigns
        return all(c.pending < 20 and c.in_flight == 0 for c in spool)

    while not await settled():
        await asyncio.sleep(0.05)
    formed = [len(b.reports) for b in upstream.fake.acked]
    assert formed and min(formed) >= 20, formed
    assert shuffler.metrics.releases.labels(cause="operator")._value.get() == 0
    rest = sent - sum(formed)
    await shuffler.handlers.flush()  # the operator releases the rest (below the target, recorded)
    held = rest if rest < 5 else 0  # below n_min: even the operator's flush holds them
    assert sum(len(b.reports) for b in upstream.fake.acked) == sent - held
    assert shuffler.metrics.releases.labels(cause="operator")._value.get() == (1 if rest >= 5 else 0)


async def test_window_close_releases_what_is_held_at_or_above_n_min(
    upstream, start, kit: SimpleNamespace
) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1", n_min=5, batch_target=100))
    shuffler = await start(campaign_ttl_s=0.1)
    await submit(shuffler, kit, campaign, 6)
    await asyncio.sleep(0.3)
    assert upstream.fake.calls == []
    closed = kit.make_campaign("c1", n_min=5, batch_target=100, closed=True)
    upstream.fake.add(closed)  # the aggregator closed it; the shuffler learns it on a refresh
    await kit.eventually(lambda: len(upstream.fake.acked) == 1)
    assert len(upstream.fake.acked[0].reports) == 6
    assert shuffler.metrics.releases.labels(cause="window")._value.get() == 1


async def test_window_close_below_n_min_holds_and_tells_the_operator(
    upstream, start, kit: SimpleNamespace, caplog
) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1", n_min=5, batch_target=100))
    shuffler = await start()
    await submit(shuffler, kit, campaign, 3)
    upstream.fake.add(kit.make_campaign("c1", n_min=5, batch_target=100, closed=True))
    with caplog.at_level("WARNING", logger="deniable.shuffler.batcher"):
        response = await shuffler.flush("c1")
    assert (response.batches_forwarded, response.reports_held) == (0, 3)
    assert [(h.campaign_id, h.pending, h.n_min) for h in response.window_held] == [("c1", 3, 5)]
    assert "fewer than n_min" in caplog.text
    await shuffler.handlers._pipeline.tick()
    assert shuffler.metrics.window_held._value.get() == 3
    assert upstream.fake.calls == []


async def test_a_requests_messages_always_land_in_one_release(upstream, start, kit: SimpleNamespace) -> None:
    """Multi-message campaigns: a release holds whole requests; since ADR 0023 it is ONE permutation
    cut into chunks (a device's messages may span chunks; the aggregator counts the release whole).
    Before ADR 0023 this test asserted every device whole in each batch."""
    campaign = upstream.fake.add(kit.make_campaign("mm", n_min=18, batch_target=30, keep_requests_whole=True))
    shuffler = await start(max_batch_reports=40, batch_interval_s=3600.0)  # released by the flush below
    for device in range(30):  # a device's 9 messages in one request; the first byte names the device
        reports = kit.make_reports(campaign, 9, start=device * 9)
        for index, report in enumerate(reports):
            report.ciphertext = bytes([device, index]) + report.ciphertext[2:]
        assert (await shuffler.handlers.submit(pb.SubmitReportsRequest(reports=reports))).accepted == 9
    response = await shuffler.flush()
    assert response.reports_forwarded == 270
    batches = sorted(upstream.fake.acked, key=lambda b: b.chunk_index)
    assert len(batches) > 1
    assert len({b.release_id for b in batches}) == 1 and batches[0].release_id
    assert [b.chunk_index for b in batches] == list(range(len(batches)))
    assert {(b.chunk_count, b.release_messages) for b in batches} == {(len(batches), 270)}
    devices = Counter(r.ciphertext[0] for b in batches for r in b.reports)
    assert set(devices.values()) == {9}, devices  # every device whole in the release
    assert all(len(b.reports) >= 30 for b in batches)  # the target, though not a multiple of 9
    spans = [
        len({b.chunk_index for b in batches if any(r.ciphertext[0] == d for r in b.reports)})
        for d in range(30)
    ]
    assert max(spans) > 1  # one permutation across chunks, not one per chunk (P(all within one) negligible)


async def test_flush_without_override_batches_at_or_above_n_min_only(
    upstream, start, channel_to, kit: SimpleNamespace
) -> None:
    enough = upstream.fake.add(kit.make_campaign("enough", n_min=3))
    few = upstream.fake.add(kit.make_campaign("few", n_min=10))
    shuffler = await start()
    await submit(shuffler, kit, enough, 3)
    await submit(shuffler, kit, few, 4)
    stub = channel_to(shuffler)
    response = await stub.Flush(pb.FlushRequest())
    assert (response.batches_forwarded, response.reports_forwarded, response.reports_held) == (1, 3, 4)
    assert {b.campaign_id for b in upstream.fake.acked} == {"enough"}
    override = await stub.Flush(pb.FlushRequest(campaign_id="few", below_n_min=True))
    assert (override.batches_forwarded, override.reports_forwarded, override.reports_held) == (1, 4, 0)
    assert sorted(len(b.reports) for b in upstream.fake.acked) == [3, 4]


async def test_flush_of_one_campaign_leaves_the_others(upstream, start, kit: SimpleNamespace) -> None:
    a = upstream.fake.add(kit.make_campaign("a", n_min=2))
    b = upstream.fake.add(kit.make_campaign("b", n_min=2))
    shuffler = await start()
    await submit(shuffler, kit, a, 2)
    await submit(shuffler, kit, b, 2)
    response = await shuffler.flush("a")
    assert (response.batches_forwarded, response.reports_forwarded, response.reports_held) == (1, 2, 0)
    assert [c.campaign_id for c in (await shuffler.handlers.stats()).campaigns] == ["b"]


async def test_batches_have_correct_digests_and_carry_every_report_exactly_once(
    upstream, start, kit: SimpleNamespace
) -> None:
    a = upstream.fake.add(kit.make_campaign("a", n_min=5, batch_target=20))
    b = upstream.fake.add(kit.make_campaign("b", n_min=5))
    shuffler = await start(max_batch_reports=20)
    # 105 ≥ the target: the background loop may batch "a" at once; "b" waits for the flush.
    sent = [r.ciphertext for r in await submit(shuffler, kit, a, 105)]
    sent += [r.ciphertext for r in await submit(shuffler, kit, b, 7)]
    response = await shuffler.flush()
    assert response.reports_held == 0
    batches = upstream.fake.acked
    assert len(batches) == 6
    for batch in batches:
        assert batch.digest == batch_digest(r.ciphertext for r in batch.reports)
        assert {r.campaign_id for r in batch.reports} == {batch.campaign_id}
    # Past the target a release is split by max_batch_reports, but never below the target (20).
    assert sorted(len(x.reports) for x in batches if x.campaign_id == "a") == [21] * 5
    assert [len(x.reports) for x in batches if x.campaign_id == "b"] == [7]  # the operator's flush
    assert Counter(upstream.fake.forwarded_ciphertexts()) == Counter(sent)
    assert len(upstream.fake.calls) == len(batches)  # nothing sent twice


async def test_forwarded_order_is_not_the_arrival_order(upstream, start, kit: SimpleNamespace) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1", n_min=2))
    shuffler = await start()
    sent = [r.ciphertext for r in await submit(shuffler, kit, campaign, 64)]
    await shuffler.flush()
    forwarded = upstream.fake.forwarded_ciphertexts()
    assert sorted(forwarded) == sorted(sent)
    # Under a uniform permutation the arrival order comes back with probability 1/64! (≈ 8e-90).
    assert forwarded != sent
    # And not merely reversed or rotated: far fewer than half keep their arrival position
    # (expected 1 fixed point; P(≥ 16) < 1e-13).
    assert sum(f == s for f, s in zip(forwarded, sent, strict=True)) < 16
