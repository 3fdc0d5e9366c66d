"""Batch rules the aggregator enforces: n_min at ingest, operator close and release, batch targets,
whole devices in multi-message batches, and what the privacy statement says about them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from support.clock import Clock

from deniable.aggregator import AggregatorConfig, start_aggregator
from deniable.aggregator.handlers import AggregatorHandlers
from deniable.aggregator.server import RunningAggregator
from deniable.core.campaigns import randomiser_for
from deniable.core.errors import FailedPrecondition, InvalidRequest
from deniable.core.plumbing.service import insecure_channel
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc

MMS_PARAMS = {"expected_n": 500.0, "delta": 1e-6}


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[RunningAggregator]:
    aggregator = await start_aggregator(
        AggregatorConfig(
            data_dir=tmp_path / "agg", listen="127.0.0.1:0", insecure=True
        )  # about n_min, not TLS
    )
    yield aggregator
    await aggregator.stop(grace=1.0)


async def test_direct_ingest_below_n_min_is_refused_and_nothing_counted(
    running: RunningAggregator, kit
) -> None:
    """The attack of issue 8: a 3-report batch straight to IngestBatch for a campaign with n_min 1000.

    Refused with FAILED_PRECONDITION and nothing counted; once the operator authorises a release
    below n_min, the very same batch is counted (so the refusal is the check, not the batch) and
    the privacy statement says so.
    """
    async with insecure_channel(running.address) as channel:
        stub = pb_grpc.AggregatorStub(channel)
        campaign = await stub.CreateCampaign(kit.binary_request("small", n_min=1000))
        batch = kit.batch_of(campaign.id, [kit.seal(campaign, 1).report for _ in range(3)], "b1")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.IngestBatch(batch)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "n_min" in (refused.value.details() or "")
        answer = await stub.BinarySum(pb.QueryRequest(campaign_id=campaign.id))
        assert (answer.n, answer.privacy.smallest_batch) == (0, 0)
        assert not answer.privacy.below_n_min_authorised

        authorised = await stub.ReleaseBelowNMin(pb.ReleaseBelowNMinRequest(campaign_id=campaign.id))
        assert authorised.below_n_min_until_unix > 0
        counted = await stub.IngestBatch(batch)
        assert counted.counted == 3
        answer = await stub.BinarySum(pb.QueryRequest(campaign_id=campaign.id))
        assert answer.n == 3 and answer.privacy.smallest_batch == 3
        assert answer.privacy.below_n_min_authorised
        assert "authorised batches below n_min" in answer.privacy.note
        metrics = running.handlers.metrics.exposition().decode()
        assert 'deniable_aggregator_batches_total{outcome="below_n_min"} 1.0' in metrics


async def test_release_authorisation_lapses(tmp_path: Path, keyring, kit) -> None:
    from deniable.aggregator.metrics import AggregatorMetrics
    from deniable.aggregator.store import SqliteAggregatorStore

    clock = Clock()
    store = SqliteAggregatorStore(tmp_path / "a.sqlite3")
    handlers = AggregatorHandlers(store, keyring, AggregatorMetrics(), clock=clock)
    try:
        campaign = await handlers.create_campaign(kit.binary_request("c", n_min=10))
        await handlers.release_below_n_min(pb.ReleaseBelowNMinRequest(campaign_id="c", valid_s=60))
        clock.now += 61
        with pytest.raises(FailedPrecondition):
            await handlers.ingest_batch(kit.batch_of(campaign.id, [kit.seal(campaign, 0).report]))
        with pytest.raises(InvalidRequest):
            await handlers.release_below_n_min(pb.ReleaseBelowNMinRequest(campaign_id="c", valid_s=10**6))
    finally:
        await store.close()


async def test_close_campaign_ends_the_window_now_and_is_recorded(tmp_path: Path, keyring, kit) -> None:
    from deniable.aggregator.metrics import AggregatorMetrics
    from deniable.aggregator.store import SqliteAggregatorStore

    clock = Clock()
    store = SqliteAggregatorStore(tmp_path / "a.sqlite3")
    handlers = AggregatorHandlers(store, keyring, AggregatorMetrics(), clock=clock)
    try:
        created = await handlers.create_campaign(kit.binary_request("c", window_s=3600))
        assert created.window_end_unix == int(clock.now) + 3600 and not created.closed
        clock.now += 100
        closed = await handlers.close_campaign(pb.KeyCloseCampaignRequest(campaign_id="c"))
        assert closed.closed and closed.window_end_unix == int(clock.now)
        assert await handlers.get_campaign(pb.GetCampaignRequest(campaign_id="c")) == closed
        clock.now += 100
        again = await handlers.close_campaign(pb.KeyCloseCampaignRequest(campaign_id="c"))
        assert again == closed  # idempotent: the first close time stays
        assert 'action="close_campaign"} 1.0' in handlers.metrics.exposition().decode()
    finally:
        await store.close()


async def test_batch_target_counts_devices_in_the_shufflers_messages(
    handlers: AggregatorHandlers, kit
) -> None:
    """A batch reaching the target in messages holds at least the target in devices."""
    mms = await handlers.create_campaign(
        kit.binary_request(
            "sum", mechanism=pb.MULTI_MESSAGE_SUM, n_min=500, batch_target=800, params=MMS_PARAMS
        )
    )
    per_device = randomiser_for(mms).messages_per_device
    assert per_device is not None and mms.batch_target == 800 * per_device and mms.keep_requests_whole
    bc = await handlers.create_campaign(
        kit.categorical_request(
            "bc",
            labels=[str(i) for i in range(8)],
            mechanism=pb.BALCER_CHEU_HISTOGRAM,
            epsilon0=2.0,
            n_min=500,
            batch_target=2000,
            params={"expected_n": 20_000.0},
        )
    )
    assert bc.batch_target == 2000 * (8 + 2) and bc.n_min == 500 * (8 + 2) and bc.keep_requests_whole
    rr = await handlers.create_campaign(kit.binary_request("rr", n_min=50))
    assert rr.batch_target == 50 and not rr.keep_requests_whole
    planned = await handlers.create_campaign(
        kit.binary_request("planned", epsilon0=0.0, n_min=0, target_epsilon=1.0, expected_n=5000)
    )
    assert planned.batch_target == 5000 * (randomiser_for(planned).max_messages_per_device or 1)
    with pytest.raises(InvalidRequest, match="below n_min"):
        await handlers.create_campaign(kit.binary_request("low", n_min=100, batch_target=10))


async def test_statement_names_the_target_the_batches_and_a_batch_below_target(
    handlers: AggregatorHandlers, kit
) -> None:
    campaign = await handlers.create_campaign(kit.binary_request("c", n_min=4, batch_target=6))
    for name, size in (("b1", 6), ("b2", 4)):
        reports = [kit.seal(campaign, 1).report for _ in range(size)]
        await handlers.ingest_batch(kit.batch_of(campaign.id, reports, name))
    privacy = (await handlers.query(pb.QueryRequest(campaign_id="c"), binary=True)).privacy
    assert (privacy.batch_target, privacy.batches, privacy.smallest_batch) == (6, 2, 4)
    assert "below the campaign's batch target" in privacy.note


async def test_a_batch_splitting_a_devices_shares_is_refused_and_queries_stay_answerable(
    handlers: AggregatorHandlers, kit
) -> None:
    """Reproduces issue 9's ``multi_message_sum_binomial`` INTERNAL: counts holding part of a device
    cannot be decoded (``estimate`` raises). Such a batch is now refused whole, so the counts only
    ever hold complete devices and the query answers."""
    campaign = await handlers.create_campaign(
        kit.binary_request(
            "sum",
            mechanism=pb.MULTI_MESSAGE_SUM_BINOMIAL,
            n_min=1,
            params={"expected_n": 500.0, "delta": 1e-6},
        )
    )
    randomiser = randomiser_for(campaign)
    devices = [randomiser.split_messages(randomiser.randomise(v)) for v in (0, 1, 1)]
    whole = [m for device in devices[:2] for m in device]
    split = whole + devices[2][:2]  # the third device's first two messages only
    counts = randomiser.tally(split).counts
    with pytest.raises(ValueError, match="missing or extra"):  # what the old query hit (INTERNAL)
        randomiser.estimate([int(c) for c in counts], randomiser.devices(counts, len(split)))  # type: ignore[arg-type]

    def sealed(payloads: list[bytes]) -> list[pb.EncryptedReport]:
        return [kit.seal(campaign, payload=p).report for p in payloads]

    with pytest.raises(FailedPrecondition, match="split"):
        await handlers.ingest_batch(kit.batch_of(campaign.id, sealed(split), "split"))
    await handlers.ingest_batch(kit.batch_of(campaign.id, sealed(whole), "whole"))
    answer = await handlers.query(pb.QueryRequest(campaign_id="sum"), binary=True)
    assert answer.n == 2 and answer.privacy.smallest_batch == 2


async def test_a_multi_message_batch_with_too_few_devices_is_refused(
    handlers: AggregatorHandlers, kit
) -> None:
    """Enough messages but too few devices (the rest junk that does not decrypt): refused whole.

    The message count alone (n_min x the most messages per device) would let this batch through;
    the device count the aggregator reads from the presence messages does not.
    """
    from deniable.core.rng import default_rng

    campaign = await handlers.create_campaign(
        kit.categorical_request(
            "bc", mechanism=pb.BALCER_CHEU_HISTOGRAM, epsilon0=2.0, n_min=2, params={"expected_n": 20_000.0}
        )
    )
    randomiser = randomiser_for(campaign)
    device = [
        kit.seal(campaign, payload=m).report for m in randomiser.split_messages(randomiser.randomise(1))
    ]
    junk = [
        pb.EncryptedReport(
            campaign_id=campaign.id,
            key_id=campaign.key_id,
            ciphertext=default_rng().bytes(campaign.ciphertext_length),
        )
        for _ in range(campaign.n_min)
    ]
    with pytest.raises(FailedPrecondition, match="holds 1 devices"):
        await handlers.ingest_batch(kit.batch_of(campaign.id, device + junk, "few"))
    answer = await handlers.query(pb.QueryRequest(campaign_id="bc"), binary=False)
    assert answer.n == 0 and answer.rejected == 0  # nothing counted, not even the rejections


def _chunk(batch: pb.ShuffledBatch, release: str, index: int, count: int, messages: int) -> pb.ShuffledBatch:
    """The batch as chunk ``index`` of ``count`` of a release of ``messages`` (ADR 0023)."""
    batch.release_id, batch.chunk_index, batch.chunk_count, batch.release_messages = (
        release,
        index,
        count,
        messages,
    )
    return batch


async def test_a_release_spanning_chunks_is_counted_whole_and_stated_once_complete(
    handlers: AggregatorHandlers, kit
) -> None:
    """Multi-message: devices' shares span chunks of one release. Each chunk alone would be refused
    as a split batch; as chunks they are held, a query meanwhile answers from complete releases
    (zero here, never INTERNAL), and the release is stated at its total once its last chunk is in.
    A chunk claiming another total is FAILED_PRECONDITION and counts nothing."""
    campaign = await handlers.create_campaign(
        kit.binary_request("sum", mechanism=pb.MULTI_MESSAGE_SUM_BINOMIAL, n_min=1, params=MMS_PARAMS)
    )
    randomiser = randomiser_for(campaign)
    messages = [m for v in (0, 1, 1, 0) for m in randomiser.split_messages(randomiser.randomise(v))]
    sealed = [kit.seal(campaign, payload=p).report for p in messages]
    cut = len(sealed) // 2 + 1  # inside a device: each half alone is not whole devices
    first = _chunk(kit.batch_of(campaign.id, sealed[:cut], "c0"), "R", 0, 2, len(sealed))
    second = _chunk(kit.batch_of(campaign.id, sealed[cut:], "c1"), "R", 1, 2, len(sealed))
    with pytest.raises(FailedPrecondition, match="split"):  # the same half as a batch of its own
        await handlers.ingest_batch(kit.batch_of(campaign.id, sealed[:cut], "alone"))
    await handlers.ingest_batch(first)
    answer = await handlers.query(pb.QueryRequest(campaign_id="sum"), binary=True)
    assert (answer.n, answer.privacy.smallest_batch, answer.privacy.releases) == (0, 0, 0)
    assert answer.privacy.incomplete_releases == 1
    liar = _chunk(kit.batch_of(campaign.id, sealed[cut:], "liar"), "R", 1, 2, 10 * len(sealed))
    with pytest.raises(FailedPrecondition, match="claims"):
        await handlers.ingest_batch(liar)
    await handlers.ingest_batch(second)
    answer = await handlers.query(pb.QueryRequest(campaign_id="sum"), binary=True)
    assert (answer.n, answer.messages, answer.privacy.smallest_batch) == (4, len(sealed), 4)
    assert (answer.privacy.batches, answer.privacy.releases, answer.privacy.incomplete_releases) == (1, 1, 0)


async def test_n_min_applies_to_the_release_and_a_short_release_is_refused_at_its_end(
    handlers: AggregatorHandlers, kit
) -> None:
    """A chunk below n_min is accepted when its release's total is not; a complete multi-message
    release with a device missing shares is refused at its last chunk, and nothing is counted."""
    campaign = await handlers.create_campaign(
        kit.binary_request("sum", mechanism=pb.MULTI_MESSAGE_SUM_BINOMIAL, n_min=3, params=MMS_PARAMS)
    )
    randomiser = randomiser_for(campaign)
    messages = [m for v in (0, 1, 1, 0) for m in randomiser.split_messages(randomiser.randomise(v))]
    sealed = [kit.seal(campaign, payload=p).report for p in messages]
    with pytest.raises(FailedPrecondition, match="n_min"):  # a release claiming fewer than n_min
        await handlers.ingest_batch(_chunk(kit.batch_of(campaign.id, sealed[:2], "s0"), "S", 0, 2, 4))
    await handlers.ingest_batch(
        _chunk(kit.batch_of(campaign.id, sealed[:2], "t0"), "T", 0, 2, len(sealed) - 1)
    )
    with pytest.raises(FailedPrecondition, match="refused"):
        await handlers.ingest_batch(
            _chunk(kit.batch_of(campaign.id, sealed[2:-1], "t1"), "T", 1, 2, len(sealed) - 1)
        )
    answer = await handlers.query(pb.QueryRequest(campaign_id="sum"), binary=True)
    assert (answer.n, answer.privacy.incomplete_releases) == (0, 1)
    for bad in ((0, 0, 5), (2, 2, 5), (0, 2, 1)):  # no chunks, index out of range, total below the chunk
        with pytest.raises(InvalidRequest):
            await handlers.ingest_batch(_chunk(kit.batch_of(campaign.id, sealed[:2], "bad"), "B", *bad))
