"""GrpcTransport against a tiny real grpc.aio shuffler on 127.0.0.1: status mapping and retries."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from support.processes import free_port

from deniable.client.outbox import Outbox
from deniable.client.reporter import Reporter
from deniable.client.transport import GrpcTransport, TransportError
from deniable.core.crypto import KeyPair, SigningKey, open_report
from deniable.core.wire import decode
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc


class FlakyShuffler(deniable_pb2_grpc.ShufflerServicer):
    """Answers SubmitReports with ``failures`` errors of ``code`` first, then accepts everything."""

    def __init__(self) -> None:
        self.campaigns: dict[str, pb.Campaign] = {}
        self.failures = 0
        self.code = grpc.StatusCode.UNAVAILABLE
        self.calls = 0
        self.received: list[pb.EncryptedReport] = []

    async def SubmitReports(self, request: pb.SubmitReportsRequest, context: Any) -> pb.SubmitReportsResponse:
        self.calls += 1
        if self.failures > 0:
            self.failures -= 1
            await context.abort(self.code, "injected")
        self.received.extend(request.reports)
        return pb.SubmitReportsResponse(accepted=len(request.reports))

    async def GetCampaign(self, request: pb.GetCampaignRequest, context: Any) -> pb.Campaign:
        campaign = self.campaigns.get(request.campaign_id)
        if campaign is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no campaign {request.campaign_id}")
        assert campaign is not None  # abort raised otherwise
        return campaign


@pytest.fixture
async def shuffler() -> AsyncIterator[tuple[FlakyShuffler, str]]:
    servicer = FlakyShuffler()  # type: ignore[abstract]  # the base answers UNIMPLEMENTED for the rest
    server = grpc.aio.server()
    deniable_pb2_grpc.add_ShufflerServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def test_unavailable_twice_then_accepted(
    shuffler: tuple[FlakyShuffler, str],
    make_campaign: Any,
    outbox: Outbox,
    key_pair: KeyPair,
    sleeps: Any,
    signing_key: SigningKey,
) -> None:
    servicer, address = shuffler
    campaign = make_campaign()
    servicer.campaigns[campaign.id] = campaign
    transport = GrpcTransport(address, timeout_s=5.0, insecure=True)
    try:
        reporter = await Reporter.fetch(
            campaign.id, transport, outbox, aggregator_key=signing_key.public_raw, sleep=sleeps
        )
        for value in range(5):
            reporter.record(value)
        servicer.failures = 2
        result = await reporter.send_pending()
    finally:
        await transport.close()
    assert (result.acknowledged, result.rejected, result.pending) == (5, 0, 0)
    assert servicer.calls == 3 and len(sleeps.delays) == 2
    assert len(servicer.received) == 5 and outbox.count() == 0
    for report in servicer.received:
        plain = decode(
            open_report(report.ciphertext, key_pair, campaign.id, campaign.incarnation),
            campaign.plaintext_length,
        )
        assert plain.campaign_id == campaign.id


RETRYABLE = [
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
]
PERMANENT = [
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.UNIMPLEMENTED,
]


async def test_status_mapping(shuffler: tuple[FlakyShuffler, str]) -> None:
    servicer, address = shuffler
    transport = GrpcTransport(address, insecure=True)
    try:
        for code in RETRYABLE + PERMANENT:
            servicer.failures, servicer.code = 1, code
            with pytest.raises(TransportError) as info:
                await transport.submit([pb.EncryptedReport(campaign_id="c", key_id=1, ciphertext=b"x")])
            assert info.value.retryable == (code in RETRYABLE), code
            assert code.name in info.value.message
        with pytest.raises(TransportError, match="NOT_FOUND") as missing:
            await transport.get_campaign("missing")
        assert not missing.value.retryable
    finally:
        await transport.close()


async def test_non_retryable_status_is_raised_by_send(
    shuffler: tuple[FlakyShuffler, str], make_campaign: Any, outbox: Outbox, sleeps: Any
) -> None:
    servicer, address = shuffler
    campaign = make_campaign()
    transport = GrpcTransport(address, insecure=True)
    try:
        reporter = Reporter(campaign, outbox, transport, sleep=sleeps)
        reporter.record(1)
        servicer.failures, servicer.code = 5, grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(TransportError, match="PERMISSION_DENIED"):
            await reporter.send_pending()
    finally:
        await transport.close()
    assert servicer.calls == 1 and sleeps.delays == [] and outbox.count() == 1


async def test_unreachable_shuffler_is_retryable(make_campaign: Any, outbox: Outbox, sleeps: Any) -> None:
    port = free_port()
    campaign = make_campaign()
    transport = GrpcTransport(f"127.0.0.1:{port}", timeout_s=2.0, insecure=True)
    try:
        reporter = Reporter(campaign, outbox, transport, sleep=sleeps)
        reporter.record(1)
        result = await reporter.send_pending(max_attempts=2)
    finally:
        await transport.close()
    assert (result.acknowledged, result.pending) == (0, 1)
    assert len(sleeps.delays) == 1


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError):
        GrpcTransport("127.0.0.1:1", timeout_s=0)
