"""The shuffle-only protocols end to end: registry, Reporter, sealing apart, the aggregator.

Devices record through ``deniable.client.Reporter`` over ``InMemoryTransport``; every message
of a multi-message payload must become its own sealed report (own report id, same ciphertext
size, nothing in common). The submitted envelopes are then shuffled into one batch and run
through the real aggregator handlers (SQLite store): devices are counted by the presence
messages, the estimates come from the protocol's analyser and the privacy statement from the
protocol's own analysis.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from deniable.aggregator.handlers import AggregatorHandlers
from deniable.aggregator.keys import Keyring
from deniable.aggregator.metrics import AggregatorMetrics
from deniable.aggregator.store import SqliteAggregatorStore
from deniable.client.outbox import Outbox
from deniable.client.reporter import Reporter
from deniable.client.transport import InMemoryTransport
from deniable.core import mechanisms
from deniable.core.batches import batch_digest
from deniable.core.campaigns import BINARY_LABELS, layout_for, randomiser_for
from deniable.core.crypto import SUITE_NAME, KeyPair, PublicKey, open_report
from deniable.core.rng import default_rng
from deniable.core.wire import decode
from deniable.v1 import deniable_pb2 as pb

PROTOCOLS: dict[str, tuple[int, dict[str, float]]] = {
    "cheu_binary_sum": (2, {"expected_n": 400.0, "delta": 1e-6}),
    "balcer_cheu_histogram": (3, {"expected_n": 400.0, "delta": 0.2}),
    "multi_message_sum": (2, {"expected_n": 400.0, "delta": 1e-6}),
    "sample_and_threshold": (3, {"sample_rate": 0.5, "threshold": 4.0, "delta": 0.1}),
    "multi_message_histogram": (3, {"expected_n": 400.0, "delta": 1e-6}),
}
EPSILON0 = {
    "cheu_binary_sum": 1.0,
    "balcer_cheu_histogram": 2.0,
    "multi_message_sum": 1.0,
    "multi_message_histogram": 1.0,
}


def campaign_for(name: str, public: PublicKey, campaign_id: str) -> pb.Campaign:
    """A consistent campaign: parameters from the randomiser, as Campaign.params carries them."""
    k, params = PROTOCOLS[name]
    epsilon0 = EPSILON0.get(name, 5.0)
    randomiser = mechanisms.create(name, epsilon0=epsilon0, domain_size=k, **params)
    layout = layout_for(randomiser)
    binary = k == 2
    return pb.Campaign(
        id=campaign_id,
        question="?",
        kind=pb.BINARY if binary else pb.CATEGORICAL,
        labels=list(BINARY_LABELS) if binary else [f"l{i}" for i in range(k)],
        mechanism=mechanisms.proto_for_name(name),  # type: ignore[arg-type]
        epsilon0=epsilon0,
        delta=params.get("delta", 1e-6),
        n_min=1,
        key_id=public.key_id,
        public_key=public.raw,
        hpke_suite=SUITE_NAME,
        payload_length=layout.payload_length,
        plaintext_length=layout.plaintext_length,
        ciphertext_length=layout.ciphertext_length,
        device_budget_epsilon=epsilon0,
        params=randomiser.parameters(),
    )


@pytest.mark.parametrize("name", sorted(PROTOCOLS))
def test_registry_rebuilds_the_identical_randomiser_from_campaign_params(name: str) -> None:
    campaign = campaign_for(name, KeyPair.generate(1).public, "c")
    a, b = randomiser_for(campaign), randomiser_for(campaign)
    assert type(a).name == name and mechanisms.name_for_proto(campaign.mechanism) == name
    assert a.parameters() == b.parameters() == dict(campaign.params)
    assert not a.local_privacy
    assert name in mechanisms.summaries()


@pytest.mark.parametrize("name", ["balcer_cheu_histogram", "multi_message_sum", "multi_message_histogram"])
async def test_multi_message_payloads_are_sealed_apart(name: str, tmp_path: Path) -> None:
    keys = KeyPair.generate(1)
    campaign = campaign_for(name, keys.public, "multi")
    transport = InMemoryTransport([campaign])
    outbox = Outbox(tmp_path / "outbox.db")
    try:
        reporter = Reporter(campaign, outbox, transport)
        first_ids = [reporter.record(v) for v in (0, 1, 1)]
        queued = outbox.count()
        result = await reporter.send_pending()
    finally:
        outbox.close()
    randomiser = reporter.randomiser
    assert randomiser.multi_message
    assert result.acknowledged == queued == len(transport.submitted) > 3
    plaintexts = [
        decode(open_report(r.ciphertext, keys, campaign.id, campaign.incarnation), campaign.plaintext_length)
        for r in transport.submitted
    ]
    assert {len(r.ciphertext) for r in transport.submitted} == {campaign.ciphertext_length}
    ids = [p.report_id for p in plaintexts]
    assert len(set(ids)) == len(ids) and set(first_ids) <= set(ids)  # every message its own id
    assert all(len(p.payload) == campaign.payload_length for p in plaintexts)
    tally = randomiser.tally([p.payload for p in plaintexts])
    assert not tally.invalid.any()
    assert randomiser.devices(tally.counts.tolist(), len(plaintexts)) == 3


@pytest.fixture
async def handlers(tmp_path: Path) -> AsyncIterator[tuple[AggregatorHandlers, Keyring]]:
    keyring = Keyring.load_or_create(tmp_path / "data")
    store = SqliteAggregatorStore(tmp_path / "agg.sqlite3")
    yield AggregatorHandlers(store, keyring, AggregatorMetrics()), keyring
    await store.close()


@pytest.mark.parametrize("name", sorted(PROTOCOLS))
async def test_devices_to_aggregator_query(
    name: str, tmp_path: Path, handlers: tuple[AggregatorHandlers, Keyring]
) -> None:
    """400 devices record through Reporter; one shuffled batch is ingested and queried."""
    agg, keyring = handlers
    campaign = campaign_for(name, keyring.active.public, f"e2e-{name.replace('_', '-')}")
    await agg.store.create_campaign(campaign)  # the planner/validation path is not under test here
    k = len(campaign.labels)
    values = [i % k if k > 2 else int(i % 4 == 0) for i in range(400)]
    transport = InMemoryTransport([campaign])
    outbox = Outbox(tmp_path / "outbox.db")
    try:
        reporter = Reporter(campaign, outbox, transport)
        reporter.record_many(values)
        await reporter.send_pending(batch_size=5000)
    finally:
        outbox.close()
    reports: list[Any] = list(transport.submitted)
    order = default_rng().permutation(len(reports))
    shuffled = [reports[i] for i in order]
    batch = pb.ShuffledBatch(
        batch_id=uuid.uuid4().hex,
        campaign_id=campaign.id,
        reports=shuffled,
        digest=batch_digest(r.ciphertext for r in shuffled),
    )
    ingested = await agg.ingest_batch(batch)
    assert ingested.counted == len(reports) and not ingested.rejected
    answer = await agg.query(pb.QueryRequest(campaign_id=campaign.id), binary=k == 2)
    assert answer.n == 400 and answer.messages == len(reports)
    assert answer.privacy.smallest_batch == 400
    assert not answer.privacy.local_guarantee and answer.privacy.local_epsilon == 0.0
    randomiser = randomiser_for(campaign)
    bound = randomiser.central_guarantee(400, campaign.delta)
    assert answer.privacy.central_epsilon == pytest.approx(bound.epsilon)
    assert answer.privacy.analysis == bound.analysis and answer.privacy.amplified == bound.amplified
    assert bound.amplified and math.isfinite(bound.epsilon)
    truth = [values.count(j) for j in range(k)]
    for bucket, true_count in zip(answer.buckets, truth, strict=True):
        assert abs(bucket.estimate - true_count) <= 6 * max(bucket.std_error, 1.0) + (
            true_count if bucket.estimate == 0 else 0
        )
