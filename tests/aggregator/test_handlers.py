"""Handlers over a real SQLite store and real sealed reports: campaigns, ingestion, queries."""

from __future__ import annotations

import math
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from deniable.aggregator.handlers import AggregatorHandlers
from deniable.aggregator.keys import Keyring
from deniable.aggregator.metrics import AggregatorMetrics
from deniable.aggregator.store import SqliteAggregatorStore
from deniable.core.accounting import central_guarantee
from deniable.core.campaigns import randomiser_for
from deniable.core.crypto import SUITE_NAME, KeyPair
from deniable.core.errors import AlreadyExists, FailedPrecondition, InvalidRequest, NotFound
from deniable.core.rng import Csprng
from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:  # the kit fixture's type only
    from support.aggregator_kit import Kit


# ---------------------------------------------------------------- create_campaign


async def test_binary_campaign_defaults(handlers: AggregatorHandlers, kit: Kit) -> None:
    campaign = await handlers.create_campaign(kit.binary_request(n_min=0))  # 0: the default
    assert list(campaign.labels) == ["no", "yes"]
    assert campaign.mechanism == pb.BINARY_RR
    assert campaign.delta == 1e-6 and campaign.n_min == 1000
    assert campaign.batch_target == 1000  # the floor, without a plan or an explicit target
    assert campaign.window_end_unix == campaign.created_unix + 7 * 24 * 3600  # the default window
    assert campaign.device_budget_epsilon == 1.0
    assert campaign.key_id == handlers.keyring.active.key_id
    assert campaign.public_key == handlers.keyring.active.public.raw
    assert campaign.hpke_suite == SUITE_NAME
    assert (campaign.payload_length, campaign.plaintext_length, campaign.ciphertext_length) == (1, 128, 176)
    assert campaign.created_unix > 0
    assert await handlers.get_campaign(pb.GetCampaignRequest(campaign_id="smoke")) == campaign


async def test_categorical_campaign_defaults(handlers: AggregatorHandlers, kit: Kit) -> None:
    campaign = await handlers.create_campaign(
        kit.categorical_request(delta=1e-8, n_min=50, device_budget_epsilon=3.0, window_start_unix=10)
    )
    assert list(campaign.labels) == ["red", "green", "blue"]
    assert campaign.mechanism == pb.GRR
    assert (campaign.delta, campaign.n_min, campaign.device_budget_epsilon) == (1e-8, 50, 3.0)
    assert campaign.window_start_unix == 10
    listed = await handlers.list_campaigns()
    assert [c.id for c in listed.campaigns] == ["colour"]


async def test_multi_message_sum_n_min_counts_devices_not_messages(
    handlers: AggregatorHandlers, kit: Kit
) -> None:
    """The shuffler counts messages: n_min = 500 devices becomes 500 x (m + 1) messages, so a
    released round holds 500 devices (fewer would weaken the Polya noise). A variable count is
    converted with its most messages per device (issue 15: Balcer-Cheu's d + 2, so a round of
    n_min messages can no longer hold n_min / (d + 2) devices); single messages are left as given."""
    params = {"expected_n": 500.0, "delta": 1e-6}
    campaign = await handlers.create_campaign(
        kit.binary_request("sum", mechanism=pb.MULTI_MESSAGE_SUM, n_min=500, params=params)
    )
    messages = randomiser_for(campaign).messages_per_device
    assert messages == int(campaign.params["messages"]) + 1 > 2
    assert campaign.n_min == 500 * messages
    single = await handlers.create_campaign(kit.binary_request("rr", n_min=500))
    assert single.n_min == 500 and randomiser_for(single).messages_per_device == 1
    histogram = await handlers.create_campaign(
        kit.categorical_request(
            "bc", mechanism=pb.BALCER_CHEU_HISTOGRAM, epsilon0=2.0, n_min=500, params={"expected_n": 20_000.0}
        )
    )
    assert histogram.n_min == 500 * (3 + 2) and randomiser_for(histogram).messages_per_device is None


async def test_campaigns_carry_both_guarantees_and_name_the_smallest_n(
    handlers: AggregatorHandlers, kit: Kit
) -> None:
    """Local randomisers: local_guarantee and local_epsilon = epsilon0; shuffle-only: none. Too
    few expected devices for Balcer-Cheu: one InvalidRequest naming the smallest n that works."""
    local = await handlers.create_campaign(kit.categorical_request("grr-c"))
    assert local.local_guarantee and local.local_epsilon == local.epsilon0
    shuffled = await handlers.create_campaign(
        kit.categorical_request("mmh", mechanism=pb.MULTI_MESSAGE_HISTOGRAM, params={"expected_n": 2000.0})
    )
    assert not shuffled.local_guarantee and shuffled.local_epsilon == 0.0
    with pytest.raises(InvalidRequest, match="smallest n that can is 148"):
        await handlers.create_campaign(
            kit.categorical_request(
                "bc-small", mechanism=pb.BALCER_CHEU_HISTOGRAM, params={"expected_n": 100.0}
            )
        )


async def test_binary_campaign_may_use_grr(handlers: AggregatorHandlers, kit: Kit) -> None:
    campaign = await handlers.create_campaign(kit.binary_request(mechanism=pb.GRR))
    assert campaign.mechanism == pb.GRR and list(campaign.labels) == ["no", "yes"]


BAD_REQUESTS: dict[str, tuple[dict[str, Any], str]] = {
    "empty id": ({"id": ""}, "required"),
    "bad id": ({"id": "Bad Id"}, "invalid campaign id"),
    "no kind": ({"kind": pb.DOMAIN_KIND_UNSPECIFIED}, "kind"),
    "one label": ({"labels": ["only"]}, "at least 2"),
    "blank label": ({"labels": ["a", " "]}, "empty"),
    "repeated label": ({"labels": ["a", "b", "a"]}, "distinct"),
    "too many labels": ({"labels": [f"l{i}" for i in range(4097)]}, "at most 4096"),
    "binary rr for categories": (
        {"mechanism": pb.BINARY_RR},
        "binary_rr cannot serve this 3-category campaign",
    ),
    "unknown mechanism": ({"mechanism": 99}, "not a known mechanism"),
    "zero epsilon": ({"epsilon0": 0.0}, "epsilon0"),
    "negative epsilon": ({"epsilon0": -1.0}, "epsilon0"),
    "nan epsilon": ({"epsilon0": math.nan}, "epsilon0"),
    "inf epsilon": ({"epsilon0": math.inf}, "epsilon0"),
    "huge epsilon": ({"epsilon0": 25.0}, "epsilon0"),
    "delta one": ({"delta": 1.0}, "delta"),
    "negative delta": ({"delta": -1e-6}, "delta"),
    "window reversed": ({"window_start_unix": 200, "window_end_unix": 100}, "window_end_unix"),
    "negative window": ({"window_start_unix": -5}, "window"),
    "budget below epsilon0": ({"device_budget_epsilon": 0.5}, "device_budget_epsilon"),
    "nan budget": ({"device_budget_epsilon": math.nan}, "device_budget_epsilon"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
async def test_bad_campaign_fields_are_refused(handlers: AggregatorHandlers, kit: Kit, case: str) -> None:
    fields, message = BAD_REQUESTS[case]
    with pytest.raises(InvalidRequest, match=message):
        await handlers.create_campaign(kit.categorical_request(**fields))
    assert (await handlers.list_campaigns()).campaigns == []


async def test_duplicate_campaign_is_refused(handlers: AggregatorHandlers, kit: Kit) -> None:
    await handlers.create_campaign(kit.binary_request())
    with pytest.raises(AlreadyExists):
        await handlers.create_campaign(kit.binary_request(question="again"))


async def test_unknown_or_missing_campaign(handlers: AggregatorHandlers) -> None:
    with pytest.raises(NotFound):
        await handlers.get_campaign(pb.GetCampaignRequest(campaign_id="nope"))
    with pytest.raises(InvalidRequest):
        await handlers.get_campaign(pb.GetCampaignRequest(campaign_id=""))


# ---------------------------------------------------------------- ingest_batch


async def counts_of(handlers: AggregatorHandlers, campaign_id: str) -> tuple[list[int], int, int]:
    answer = await handlers.query(pb.QueryRequest(campaign_id=campaign_id), binary=False)
    return [b.raw_count for b in answer.buckets], answer.n, answer.rejected


async def test_ingest_counts_payloads(handlers: AggregatorHandlers, kit: Kit) -> None:
    campaign = await handlers.create_campaign(kit.categorical_request())
    sealed = [kit.seal(campaign, i % 3) for i in range(30)]
    truth = [0, 0, 0]
    for s in sealed:
        truth[s.payload[0]] += 1
    response = await handlers.ingest_batch(kit.batch_of(campaign.id, [s.report for s in sealed], "b1"))
    assert (response.batch_id, response.duplicate_batch, response.counted) == ("b1", False, 30)
    assert list(response.rejected) == []
    assert await counts_of(handlers, campaign.id) == (truth, 30, 0)
    assert "deniable_aggregator_reports_counted_total 30.0" in handlers.metrics.exposition().decode()


async def test_same_batch_twice_is_counted_once(handlers: AggregatorHandlers, kit: Kit) -> None:
    campaign = await handlers.create_campaign(kit.binary_request())
    batch = kit.batch_of(campaign.id, [kit.seal(campaign, 1).report for _ in range(5)], "b1")
    first = await handlers.ingest_batch(batch)
    second = await handlers.ingest_batch(batch)
    assert (first.duplicate_batch, first.counted) == (False, 5)
    assert (second.duplicate_batch, second.counted) == (True, 0)
    assert (await counts_of(handlers, campaign.id))[1:] == (5, 0)
    reused = kit.batch_of(campaign.id, [kit.seal(campaign, 1).report], "b1")
    with pytest.raises(AlreadyExists):
        await handlers.ingest_batch(reused)


async def test_each_bad_report_rejected_with_its_reason(handlers: AggregatorHandlers, kit: Kit) -> None:
    campaign = await handlers.create_campaign(kit.binary_request())
    other = await handlers.create_campaign(kit.binary_request("other"))
    good = kit.seal(campaign, payload=bytes([1]))  # fixed payload: the count asserted below must not be noise

    wrong_envelope_campaign = kit.seal(campaign, 1).report
    wrong_envelope_campaign.campaign_id = other.id
    unknown_key = kit.seal(campaign, 1).report
    unknown_key.key_id = 77
    short = kit.seal(campaign, 1).report
    short.ciphertext = short.ciphertext[:-1]
    tampered = kit.seal(campaign, 1).report
    tampered.ciphertext = tampered.ciphertext[:-1] + bytes([tampered.ciphertext[-1] ^ 1])
    malformed = kit.seal(campaign, plaintext=bytes([9]) + bytes(campaign.plaintext_length - 1)).report
    plaintext_other_campaign = kit.seal(campaign, 1, plaintext_campaign=other.id).report
    plaintext_other_key = kit.seal(campaign, 1, plaintext_key_id=5).report
    out_of_domain = kit.seal(campaign, payload=bytes([7])).report
    duplicate = kit.seal(campaign, 0, report_id=good.report_id).report
    # A key the aggregator never had, under a known key id: does not open.
    stranger = KeyPair.generate(campaign.key_id).public
    foreign = kit.seal(campaign, 1, public_key=stranger).report

    batch = kit.batch_of(
        campaign.id,
        [
            good.report,
            wrong_envelope_campaign,
            unknown_key,
            short,
            tampered,
            malformed,
            plaintext_other_campaign,
            plaintext_other_key,
            out_of_domain,
            duplicate,
            foreign,
        ],
    )
    response = await handlers.ingest_batch(batch)
    assert response.counted == 1
    assert kit.rejected_map(response) == {
        pb.CAMPAIGN_MISMATCH: 3,
        pb.UNKNOWN_KEY_ID: 1,
        pb.WRONG_CIPHERTEXT_LENGTH: 1,
        pb.UNDECRYPTABLE: 2,
        pb.MALFORMED_PLAINTEXT: 1,
        pb.PAYLOAD_OUT_OF_DOMAIN: 1,
        pb.DUPLICATE_REPORT: 1,
    }
    assert await counts_of(handlers, campaign.id) == ([0, 1], 1, 10)
    assert await counts_of(handlers, other.id) == ([0, 0], 0, 0)
    # Replaying the good report in a later batch is a duplicate too.
    again = await handlers.ingest_batch(kit.batch_of(campaign.id, [good.report]))
    assert (again.counted, kit.rejected_map(again)) == (0, {pb.DUPLICATE_REPORT: 1})
    exposition = handlers.metrics.exposition().decode()
    assert 'deniable_aggregator_reports_rejected_total{reason="duplicate_report"} 2.0' in exposition


async def test_bad_digest_refuses_whole_batch(handlers: AggregatorHandlers, kit: Kit) -> None:
    campaign = await handlers.create_campaign(kit.binary_request())
    reports = [kit.seal(campaign, 1).report for _ in range(4)]
    batch = kit.batch_of(campaign.id, reports, "b1")
    dropped = pb.ShuffledBatch()
    dropped.CopyFrom(batch)
    del dropped.reports[0]
    with pytest.raises(InvalidRequest, match="digest"):
        await handlers.ingest_batch(dropped)
    assert await counts_of(handlers, campaign.id) == ([0, 0], 0, 0)
    # The refused batch id was not consumed: the intact batch still counts.
    assert (await handlers.ingest_batch(batch)).counted == 4
    exposition = handlers.metrics.exposition().decode()
    assert 'deniable_aggregator_batches_total{outcome="refused"} 1.0' in exposition


async def test_batch_needs_id_and_known_campaign(handlers: AggregatorHandlers, kit: Kit) -> None:
    campaign = await handlers.create_campaign(kit.binary_request())
    report = kit.seal(campaign, 1).report
    with pytest.raises(InvalidRequest, match="batch_id"):
        await handlers.ingest_batch(pb.ShuffledBatch(campaign_id=campaign.id, reports=[report]))
    with pytest.raises(NotFound):
        await handlers.ingest_batch(kit.batch_of("missing", [report]))


async def test_empty_batch_is_recorded(handlers: AggregatorHandlers, kit: Kit) -> None:
    campaign = await handlers.create_campaign(kit.binary_request())
    response = await handlers.ingest_batch(kit.batch_of(campaign.id, [], "empty"))
    assert (response.counted, response.duplicate_batch) == (0, False)
    assert (await handlers.ingest_batch(kit.batch_of(campaign.id, [], "empty"))).duplicate_batch


async def test_rotation_keeps_old_campaigns_counting(handlers: AggregatorHandlers, kit: Kit) -> None:
    old = await handlers.create_campaign(kit.binary_request("before"))
    handlers.keyring.rotate()
    new = await handlers.create_campaign(kit.binary_request("after"))
    assert (old.key_id, new.key_id) == (1, 2)
    assert (await handlers.ingest_batch(kit.batch_of(old.id, [kit.seal(old, 1).report]))).counted == 1
    assert (await handlers.ingest_batch(kit.batch_of(new.id, [kit.seal(new, 1).report]))).counted == 1
    keys = await handlers.list_keys()
    assert [(k.key_id, k.active) for k in keys.keys] == [(1, False), (2, True)]


async def test_process_pool_decryption_matches(tmp_path: Path, keyring: Keyring, kit: Kit) -> None:
    store = SqliteAggregatorStore(tmp_path / "pool.sqlite3")
    pool = ProcessPoolExecutor(max_workers=2, mp_context=get_context("spawn"))
    try:
        handlers = AggregatorHandlers(store, keyring, AggregatorMetrics(), pool, decrypt_workers=2)
        campaign = await handlers.create_campaign(kit.categorical_request())
        sealed = [kit.seal(campaign, i % 3) for i in range(1500)]
        reports = [s.report for s in sealed]
        reports[700].ciphertext = reports[700].ciphertext[::-1]
        response = await handlers.ingest_batch(kit.batch_of(campaign.id, reports))
        assert response.counted == 1499
        assert kit.rejected_map(response) == {pb.UNDECRYPTABLE: 1}
        expected = np.bincount([s.payload[0] for i, s in enumerate(sealed) if i != 700], minlength=3)
        assert (await counts_of(handlers, campaign.id))[0] == expected.tolist()
    finally:
        pool.shutdown()
        await store.close()


# ---------------------------------------------------------------- query


async def test_query_kinds_and_confidence(handlers: AggregatorHandlers, kit: Kit) -> None:
    binary = await handlers.create_campaign(kit.binary_request())
    categorical = await handlers.create_campaign(kit.categorical_request())
    with pytest.raises(FailedPrecondition):
        await handlers.query(pb.QueryRequest(campaign_id=categorical.id), binary=True)
    with pytest.raises(NotFound):
        await handlers.query(pb.QueryRequest(campaign_id="missing"), binary=False)
    for bad in (1.0, -0.5, 1.5, math.nan):
        with pytest.raises(InvalidRequest, match="confidence"):
            await handlers.query(pb.QueryRequest(campaign_id=binary.id, confidence=bad), binary=True)
    answer = await handlers.query(pb.QueryRequest(campaign_id=binary.id), binary=True)
    assert answer.confidence == 0.95 and answer.mechanism == pb.BINARY_RR
    assert [b.label for b in answer.buckets] == ["no", "yes"]
    histogram = await handlers.query(pb.QueryRequest(campaign_id=binary.id, confidence=0.9), binary=False)
    assert histogram.confidence == 0.9


async def test_privacy_statement_before_anything_is_counted(handlers: AggregatorHandlers, kit: Kit) -> None:
    campaign = await handlers.create_campaign(kit.binary_request(epsilon0=2.0))
    privacy = (await handlers.query(pb.QueryRequest(campaign_id=campaign.id), binary=True)).privacy
    assert (privacy.epsilon0, privacy.central_epsilon, privacy.amplified, privacy.smallest_batch) == (
        2.0,
        2.0,
        False,
        0,
    )
    assert "nothing counted" in privacy.note


async def test_statistical_grr_estimates_cover_truth(handlers: AggregatorHandlers, kit: Kit) -> None:
    """12,000 GRR reports of a known distribution through the whole path: CIs cover the truth."""
    labels = [f"c{i}" for i in range(6)]
    campaign = await handlers.create_campaign(kit.categorical_request("stats", labels=labels, epsilon0=1.0))
    rng = Csprng(key=bytes(range(32)))  # reproducible noise: the test cannot flake
    shares = [0.4, 0.25, 0.15, 0.1, 0.07, 0.03]
    total = 12_000
    truth = [int(total * s) for s in shares]
    values = [v for v, count in enumerate(truth) for _ in range(count)]
    reports = [kit.seal(campaign, v, rng=rng).report for v in values]
    for start in range(0, total, 4_000):
        await handlers.ingest_batch(kit.batch_of(campaign.id, reports[start : start + 4_000]))
    answer = await handlers.query(pb.QueryRequest(campaign_id=campaign.id), binary=False)
    assert answer.n == total
    inside = sum(b.ci_low <= t <= b.ci_high for b, t in zip(answer.buckets, truth, strict=True))
    assert inside >= 5, [(b.ci_low, t, b.ci_high) for b, t in zip(answer.buckets, truth, strict=True)]
    assert abs(sum(b.estimate for b in answer.buckets) - total) < 1e-6 * total
    expected = randomiser_for(campaign).central_guarantee(4_000, campaign.delta)
    assert expected.epsilon <= central_guarantee(1.0, 4_000, campaign.delta).epsilon  # GRR's own analyses
    assert answer.privacy.smallest_batch == 4_000
    assert answer.privacy.amplified and expected.amplified
    assert answer.privacy.central_epsilon == pytest.approx(expected.epsilon)
    assert answer.privacy.analysis == expected.analysis
    se = math.sqrt(float(randomiser_for(campaign).variance([truth[0]], total)[0]))
    assert answer.buckets[0].std_error == pytest.approx(se, rel=0.05)
