"""Hostile and broken reports through the real services: each is rejected with its reason and
no count changes; the services keep serving."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from deniable.aggregator import AggregatorConfig, RunningAggregator, start_aggregator
from deniable.client import GrpcTransport, Outbox, Reporter
from deniable.core.campaigns import randomiser_for
from deniable.core.crypto import PublicKey, seal_report
from deniable.core.plumbing.service import insecure_channel
from deniable.core.rng import default_rng
from deniable.core.wire import Plaintext, encode, new_report_id
from deniable.shuffler import RunningShuffler, ShufflerConfig, start_shuffler
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc

HONEST = 30


@dataclass
class Stack:
    aggregator: RunningAggregator
    shuffler: RunningShuffler
    operator: pb_grpc.AggregatorAsyncStub
    devices: pb_grpc.ShufflerAsyncStub
    campaign: pb.Campaign


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    aggregator = await start_aggregator(
        AggregatorConfig(insecure=True, data_dir=tmp_path / "agg", listen="127.0.0.1:0")
    )
    shuffler = await start_shuffler(
        ShufflerConfig(
            insecure=True, data_dir=tmp_path / "shuf", upstream=aggregator.address, listen="127.0.0.1:0"
        )
    )
    agg_channel = insecure_channel(aggregator.address)
    shuf_channel = insecure_channel(shuffler.address)
    operator = pb_grpc.AggregatorStub(agg_channel)
    campaign = await operator.CreateCampaign(
        pb.CreateCampaignRequest(
            id="lang",
            question="Language?",
            kind=pb.CATEGORICAL,
            labels=["a", "b", "c"],
            epsilon0=1.0,
            n_min=5,
        )
    )
    try:
        yield Stack(aggregator, shuffler, operator, pb_grpc.ShufflerStub(shuf_channel), campaign)
    finally:
        await agg_channel.close()
        await shuf_channel.close()
        await shuffler.stop()
        await aggregator.stop()


def _sealed(
    campaign: pb.Campaign,
    payload: bytes,
    *,
    plaintext_campaign: str | None = None,
    report_id: bytes | None = None,
) -> pb.EncryptedReport:
    """A correctly sealed report whose plaintext may lie about its campaign or payload."""
    plaintext = encode(
        Plaintext(report_id or new_report_id(), plaintext_campaign or campaign.id, campaign.key_id, payload),
        campaign.plaintext_length,
    )
    ciphertext = seal_report(
        plaintext, PublicKey(campaign.key_id, campaign.public_key), campaign.id, campaign.incarnation
    )
    return pb.EncryptedReport(campaign_id=campaign.id, key_id=campaign.key_id, ciphertext=ciphertext)


async def test_bad_reports_are_rejected_with_reasons_and_change_no_count(
    stack: Stack, tmp_path: Path
) -> None:
    campaign = stack.campaign
    transport = GrpcTransport(stack.shuffler.address, insecure=True)
    outbox = Outbox(tmp_path / "outbox.db")
    reporter = await Reporter.fetch(
        campaign.id, transport, outbox, aggregator_key=stack.aggregator.handlers.keyring.signing.public_raw
    )
    reporter.record_many([0, 1, 2] * (HONEST // 3))
    sent = await reporter.send_pending()
    assert sent.acknowledged == HONEST

    # Rejected at the shuffler, by envelope alone.
    good_length = campaign.ciphertext_length
    envelope_bad = [
        pb.EncryptedReport(
            campaign_id=campaign.id, key_id=campaign.key_id, ciphertext=b"x" * (good_length - 1)
        ),
        pb.EncryptedReport(
            campaign_id="no-such-campaign", key_id=campaign.key_id, ciphertext=b"x" * good_length
        ),
        pb.EncryptedReport(
            campaign_id=campaign.id, key_id=campaign.key_id + 7, ciphertext=b"x" * good_length
        ),
    ]
    response = await stack.devices.SubmitReports(pb.SubmitReportsRequest(reports=envelope_bad))
    assert response.accepted == 0
    assert [r.reason for r in response.rejected] == [
        pb.WRONG_CIPHERTEXT_LENGTH,
        pb.UNKNOWN_CAMPAIGN,
        pb.UNKNOWN_KEY_ID,
    ]

    # Pass the shuffler (it cannot read them), rejected at the aggregator.
    width = randomiser_for(campaign).payload_length
    duplicate = _sealed(campaign, (0).to_bytes(width, "big"))
    garbage = pb.EncryptedReport(
        campaign_id=campaign.id, key_id=campaign.key_id, ciphertext=default_rng().bytes(good_length)
    )
    inside_bad = [
        garbage,  # UNDECRYPTABLE
        _sealed(campaign, (3).to_bytes(width, "big")),  # PAYLOAD_OUT_OF_DOMAIN (k = 3)
        _sealed(campaign, (0).to_bytes(width, "big"), plaintext_campaign="other"),  # CAMPAIGN_MISMATCH
        duplicate,
        duplicate,  # DUPLICATE_REPORT
    ]
    response = await stack.devices.SubmitReports(pb.SubmitReportsRequest(reports=inside_bad))
    assert response.accepted == len(inside_bad)

    await stack.shuffler.flush()
    answer = await _wait_for(stack, expected_total=HONEST + len(inside_bad))
    assert answer.n == HONEST + 1  # the honest reports and the first copy of the duplicate
    assert answer.rejected == len(inside_bad) - 1
    assert sum(b.raw_count for b in answer.buckets) == HONEST + 1

    # The services are still up and answering.
    listed = await stack.devices.ListCampaigns(pb.ListCampaignsRequest())
    assert [c.id for c in listed.campaigns] == [campaign.id]
    outbox.close()
    await transport.close()


async def test_operator_errors_get_clear_statuses(stack: Stack) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await stack.operator.Histogram(pb.QueryRequest(campaign_id="nope"))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as wrong_kind:
        await stack.operator.BinarySum(pb.QueryRequest(campaign_id=stack.campaign.id))
    assert wrong_kind.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.aio.AioRpcError) as bad_epsilon:
        await stack.operator.CreateCampaign(
            pb.CreateCampaignRequest(id="x", question="?", kind=pb.BINARY, epsilon0=-1.0)
        )
    assert bad_epsilon.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as empty:
        await stack.devices.SubmitReports(pb.SubmitReportsRequest())
    assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def _wait_for(stack: Stack, expected_total: int) -> pb.QueryResponse:
    """Poll until the aggregator has seen every forwarded report."""
    import asyncio

    for _ in range(200):
        answer: pb.QueryResponse = await stack.operator.Histogram(
            pb.QueryRequest(campaign_id=stack.campaign.id)
        )
        if answer.n + answer.rejected >= expected_total:
            return answer
        await asyncio.sleep(0.05)
    raise AssertionError(f"aggregator saw {answer.n + answer.rejected} of {expected_total} reports")
