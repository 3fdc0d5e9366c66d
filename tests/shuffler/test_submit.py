"""SubmitReports over real gRPC: acceptance, each rejection reason, request-level errors, robustness."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from deniable.core.plumbing import service
from deniable.v1 import deniable_pb2 as pb

WAIT_FOREVER = {"batch_interval_s": 3600.0}  # keep reports pending so the spool can be inspected


async def pending_of(stub: Any) -> dict[str, int]:
    stats = await stub.Stats(pb.ShufflerStatsRequest())
    return {c.campaign_id: c.pending for c in stats.campaigns}


async def test_valid_reports_are_accepted_and_spooled(
    upstream, start, channel_to, kit: SimpleNamespace
) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1", n_min=100))
    shuffler = await start(**WAIT_FOREVER)
    stub = channel_to(shuffler)
    response = await stub.SubmitReports(pb.SubmitReportsRequest(reports=kit.make_reports(campaign, 3)))
    assert response.accepted == 3 and list(response.rejected) == []
    assert await pending_of(stub) == {"c1": 3}
    assert shuffler.metrics.registry.get_sample_value("deniable_shuffler_reports_accepted_total") == 3


def _bad_report(reason: str, campaign: pb.Campaign) -> pb.EncryptedReport:
    good = pb.EncryptedReport(
        campaign_id=campaign.id, key_id=campaign.key_id, ciphertext=bytes(campaign.ciphertext_length)
    )
    if reason == "UNKNOWN_CAMPAIGN":
        good.campaign_id = "no-such-campaign"
    elif reason == "UNKNOWN_KEY_ID":
        good.key_id = campaign.key_id + 1
    elif reason in ("WRONG_CIPHERTEXT_LENGTH",):
        good.ciphertext = bytes(campaign.ciphertext_length - 1)
    return good


@pytest.mark.parametrize(
    "reason", ["UNKNOWN_CAMPAIGN", "UNKNOWN_KEY_ID", "WRONG_CIPHERTEXT_LENGTH", "CAMPAIGN_CLOSED"]
)
async def test_each_rejection_reason_spools_nothing_for_the_rejected(
    reason: str, upstream, start, channel_to, kit: SimpleNamespace
) -> None:
    campaign = upstream.fake.add(kit.make_campaign("open", n_min=100))
    closed = upstream.fake.add(kit.make_campaign("closed", n_min=100, window_end_unix=int(time.time()) - 10))
    shuffler = await start(**WAIT_FOREVER)
    stub = channel_to(shuffler)
    bad = _bad_report(reason, closed if reason == "CAMPAIGN_CLOSED" else campaign)
    good = kit.make_reports(campaign, 2)
    response = await stub.SubmitReports(pb.SubmitReportsRequest(reports=[good[0], bad, good[1]]))
    assert response.accepted == 2
    assert [(r.index, pb.RejectReason.Name(r.reason)) for r in response.rejected] == [(1, reason)]
    assert response.rejected[0].detail
    assert await pending_of(stub) == {"open": 2}
    sample = shuffler.metrics.registry.get_sample_value(
        "deniable_shuffler_reports_rejected_total",
        {"reason": reason.lower()},  # one spelling (issue 11)
    )
    assert sample == 1


async def test_every_report_rejected_spools_nothing(
    upstream, start, channel_to, kit: SimpleNamespace
) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1"))
    shuffler = await start(**WAIT_FOREVER)
    stub = channel_to(shuffler)
    reports = [_bad_report("WRONG_CIPHERTEXT_LENGTH", campaign), _bad_report("UNKNOWN_KEY_ID", campaign)]
    response = await stub.SubmitReports(pb.SubmitReportsRequest(reports=reports))
    assert response.accepted == 0
    assert [r.index for r in response.rejected] == [0, 1]
    assert await pending_of(stub) == {}


async def test_junk_campaign_ids_are_not_echoed_or_asked_upstream(
    upstream, start, channel_to, kit: SimpleNamespace
) -> None:
    shuffler = await start(**WAIT_FOREVER)
    stub = channel_to(shuffler)
    junk = "X" * 5000 + "\n<script>"
    report = pb.EncryptedReport(campaign_id=junk, key_id=1, ciphertext=b"x")
    response = await stub.SubmitReports(pb.SubmitReportsRequest(reports=[report]))
    assert response.rejected[0].reason == pb.UNKNOWN_CAMPAIGN
    assert junk not in response.rejected[0].detail and len(response.rejected[0].detail) < 200
    assert upstream.fake.get_campaign_calls == []


async def test_empty_and_oversized_requests_are_invalid_argument(
    upstream, start, channel_to, kit: SimpleNamespace
) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1"))
    shuffler = await start(max_reports_per_request=5, **WAIT_FOREVER)
    stub = channel_to(shuffler)
    with pytest.raises(grpc.aio.AioRpcError) as empty:
        await stub.SubmitReports(pb.SubmitReportsRequest())
    assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as many:
        await stub.SubmitReports(pb.SubmitReportsRequest(reports=kit.make_reports(campaign, 6)))
    assert many.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "at most 5" in (many.value.details() or "")
    assert await pending_of(stub) == {}
    ok = await stub.SubmitReports(pb.SubmitReportsRequest(reports=kit.make_reports(campaign, 5)))
    assert ok.accepted == 5
    failed = shuffler.metrics.registry.get_sample_value(
        "deniable_shuffler_requests_failed_total", {"rpc": "SubmitReports", "code": "INVALID_ARGUMENT"}
    )
    assert failed == 2


async def test_message_over_the_limit_is_resource_exhausted_and_server_survives(
    upstream, start, channel_to, kit: SimpleNamespace
) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1"))
    shuffler = await start(max_message_bytes=2048, **WAIT_FOREVER)
    stub = channel_to(shuffler)
    with pytest.raises(grpc.aio.AioRpcError) as big:
        await stub.SubmitReports(pb.SubmitReportsRequest(reports=kit.make_reports(campaign, 100)))
    assert big.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    ok = await stub.SubmitReports(pb.SubmitReportsRequest(reports=kit.make_reports(campaign, 2)))
    assert ok.accepted == 2


async def test_malformed_protobuf_is_refused_and_server_survives(
    upstream, start, channel_to, kit: SimpleNamespace
) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1"))
    shuffler = await start(**WAIT_FOREVER)
    channel = service.insecure_channel(shuffler.address)
    try:
        raw: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            "/deniable.v1.Shuffler/SubmitReports"
        )
        for junk in (b"\xff\xff\xff\xff", b"\x0a\x05\x0a\xff", b"\x0a" + b"\xff" * 10):
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await raw(junk, timeout=5)
            assert bad.value.code() != grpc.StatusCode.OK
    finally:
        await channel.close()
    stub = channel_to(shuffler)
    ok = await stub.SubmitReports(pb.SubmitReportsRequest(reports=kit.make_reports(campaign, 1)))
    assert ok.accepted == 1


async def test_unknown_campaign_with_upstream_down_is_unavailable(
    upstream, start, channel_to, kit: SimpleNamespace
) -> None:
    cached = upstream.fake.add(kit.make_campaign("cached"))
    shuffler = await start(**WAIT_FOREVER)
    stub = channel_to(shuffler)
    assert (
        await stub.SubmitReports(pb.SubmitReportsRequest(reports=kit.make_reports(cached, 1)))
    ).accepted == 1
    await upstream.stop()
    fresh = kit.make_campaign("fresh")
    with pytest.raises(grpc.aio.AioRpcError) as down:
        await stub.SubmitReports(pb.SubmitReportsRequest(reports=kit.make_reports(fresh, 1)))
    assert down.value.code() == grpc.StatusCode.UNAVAILABLE
    # A cached campaign still validates while the aggregator is down.
    assert (
        await stub.SubmitReports(pb.SubmitReportsRequest(reports=kit.make_reports(cached, 2)))
    ).accepted == 2
    assert await pending_of(stub) == {"cached": 3}


async def test_unknown_campaign_is_asked_upstream_once_per_interval(
    upstream, start, channel_to, kit: SimpleNamespace
) -> None:
    shuffler = await start(campaign_refresh_s=30.0, **WAIT_FOREVER)
    stub = channel_to(shuffler)
    report = pb.EncryptedReport(campaign_id="ghost", key_id=1, ciphertext=b"x")
    responses = await asyncio.gather(
        *(stub.SubmitReports(pb.SubmitReportsRequest(reports=[report])) for _ in range(30))
    )
    assert all(r.rejected[0].reason == pb.UNKNOWN_CAMPAIGN for r in responses)
    assert upstream.fake.get_campaign_calls == ["ghost"]


async def test_new_key_id_is_picked_up_after_the_refresh_interval(
    upstream, start, channel_to, kit: SimpleNamespace
) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1", key_id=7))
    shuffler = await start(campaign_refresh_s=1.0, **WAIT_FOREVER)
    stub = channel_to(shuffler)
    assert (
        await stub.SubmitReports(pb.SubmitReportsRequest(reports=kit.make_reports(campaign, 1)))
    ).accepted == 1
    rotated = upstream.fake.add(kit.make_campaign("c1", key_id=8))
    first = await stub.SubmitReports(pb.SubmitReportsRequest(reports=kit.make_reports(rotated, 1)))
    assert first.rejected[0].reason == pb.UNKNOWN_KEY_ID  # asked upstream moments ago: not again yet
    await asyncio.sleep(1.1)
    second = await stub.SubmitReports(pb.SubmitReportsRequest(reports=kit.make_reports(rotated, 1)))
    assert second.accepted == 1


async def test_health_reports_serving(upstream, start, kit: SimpleNamespace) -> None:
    shuffler = await start(**WAIT_FOREVER)
    channel = service.insecure_channel(shuffler.address)
    try:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", "deniable.v1.Shuffler"):
            response = await health.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert response.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await channel.close()


async def test_too_many_campaigns_in_one_request_is_invalid_argument(
    upstream, start, channel_to, kit: SimpleNamespace
) -> None:
    shuffler = await start(**WAIT_FOREVER)
    stub = channel_to(shuffler)
    reports = [pb.EncryptedReport(campaign_id=f"c{i}", key_id=1, ciphertext=b"x") for i in range(257)]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.SubmitReports(pb.SubmitReportsRequest(reports=reports))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert upstream.fake.get_campaign_calls == []


async def test_unexpected_failure_is_internal_logged_without_peer_and_server_survives(
    upstream, start, channel_to, kit: SimpleNamespace, monkeypatch, caplog
) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1"))
    shuffler = await start(**WAIT_FOREVER)
    stub = channel_to(shuffler)

    def broken_disk(reports: object) -> None:
        raise RuntimeError("disk on fire")  # an OSError is now UNAVAILABLE (tests/shuffler/test_health.py)

    monkeypatch.setattr(shuffler.handlers.store, "append", broken_disk)
    with caplog.at_level("ERROR", logger="deniable"), pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.SubmitReports(pb.SubmitReportsRequest(reports=kit.make_reports(campaign, 1)))
    assert err.value.code() == grpc.StatusCode.INTERNAL
    assert "disk on fire" not in (err.value.details() or "")
    assert "unexpected failure" in caplog.text
    assert "ipv4:" not in caplog.text and "ipv6:" not in caplog.text
    monkeypatch.undo()
    ok = await stub.SubmitReports(pb.SubmitReportsRequest(reports=kit.make_reports(campaign, 1)))
    assert ok.accepted == 1
