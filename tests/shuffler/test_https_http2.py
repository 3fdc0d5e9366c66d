"""HTTP/2 on the shuffler's HTTPS face, spoken for real (httpx over h2, and the h2 package frame by
frame): ALPN picks h2; the routes, the bad-input refusals and the real services behave as over
HTTP/1.1; one connection's concurrent streams are bounded; HTTP/1.1 clients still work
(docs/https.md, ADR 0038)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import h2.errors
import h2.events
import pytest
from support.h2_client import H2Client, H2Transport, RawH2, h2_client
from support.https_services import assert_refused, https_services, pending, reports_for, submit_body
from support.sdk_services import Services, binary_campaign, counted, running_services

from deniable.client import ClientTls, HttpTransport, Outbox, Reporter, verify_description
from deniable.shuffler.https import PROTOBUF, HttpsConfig
from deniable.v1 import deniable_pb2 as pb


def _context(services: Services) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(services.certs / "shuffler-ca.pem"))


def _address(services: Services) -> str:
    assert services.shuffler is not None and services.shuffler.https_address is not None
    return services.shuffler.https_address


@asynccontextmanager
async def h2_services(tmp_path: Path, **options: Any) -> AsyncIterator[tuple[Services, H2Client]]:
    """The real services with the HTTPS face (``options``: HttpsConfig fields), and an h2-only client."""
    async with https_services(tmp_path, **options) as (services, _http1):
        base = "https://" + _address(services)
        async with h2_client(base, _context(services)) as client:
            h2 = H2Client(base, client)
            yield services, h2
            assert set(h2.versions) <= {"HTTP/2"}, h2.versions


async def test_alpn_negotiates_h2_and_http1_is_still_offered(tmp_path: Path) -> None:
    async with https_services(tmp_path) as (services, http1):
        raw = await RawH2.open(_address(services), _context(services))
        assert raw.alpn == "h2"
        await raw.close()
        old = _context(services)
        old.set_alpn_protocols(["http/1.1"])
        host, port = _address(services).rsplit(":", 1)
        _, writer = await asyncio.open_connection(host, int(port), ssl=old, server_hostname=host)
        assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == "http/1.1"
        writer.close()
        answer = await http1.request("GET", "/healthz")  # aiohttp's client: HTTP/1.1 only
        assert (answer.status, answer.json()) == (200, {"status": "serving"})


async def test_campaign_and_reports_over_h2(tmp_path: Path) -> None:
    async with h2_services(tmp_path) as (services, client):
        answer = await client.request("GET", "/v1/campaigns/c1")
        assert (answer.status, answer.headers["content-type"]) == (200, PROTOBUF)
        campaign = pb.Campaign.FromString(answer.body)
        verify_description(campaign, services.signing_key)
        sent = await client.submit("c1", submit_body(reports_for(campaign, 4)))
        assert pb.SubmitReportsResponse.FromString(sent.body).accepted == 4
        assert await pending(services) == 4
        assert client.versions == ["HTTP/2", "HTTP/2"]


@pytest.mark.parametrize(
    ("kind", "status", "code"),
    [
        ("wrong_type", 415, "bad_content_type"),
        ("oversized", 413, "body_too_large"),
        ("garbage", 400, "malformed_body"),
        ("truncated", 400, "malformed_body"),
        ("mismatch", 400, "campaign_mismatch"),
        ("empty", 400, "invalid_request"),
    ],
)
async def test_bad_input_over_h2_is_refused_as_over_http1(
    tmp_path: Path, kind: str, status: int, code: str
) -> None:
    """Each refusal is the same status and JSON code as over HTTP/1.1 (tests/shuffler/
    test_https_bad_input.py), counted as a failure, nothing spooled; the connection still serves."""
    async with h2_services(tmp_path, campaigns=("c1", "c2"), max_body_bytes=4096) as (services, client):
        c1, c2 = services.campaigns
        good = submit_body(reports_for(c1, 3))
        body, content_type = {
            "wrong_type": (good, "application/json"),
            "oversized": (submit_body(reports_for(c1, 200)), PROTOBUF),
            "garbage": (b"\xff" * 64, PROTOBUF),
            "truncated": (good[:-5], PROTOBUF),
            "mismatch": (submit_body(reports_for(c2, 2)), PROTOBUF),
            "empty": (b"", PROTOBUF),
        }[kind]
        answer = await client.submit("c1", body, content_type=content_type)
        await assert_refused(services, answer, status, code)
        assert (await client.submit("c1", good)).status == 200  # the same connection, a good body
        assert await pending(services) == 3


async def test_a_body_larger_than_announced_limit_is_refused_while_it_streams(tmp_path: Path) -> None:
    """No content-length (HTTP/2 may leave it out): the face counts as the DATA frames come and
    refuses at the limit, while the client is still sending; nothing is spooled and the connection
    keeps working for the next stream."""
    async with https_services(tmp_path, max_body_bytes=4096) as (services, _http1):
        raw = await RawH2.open(_address(services), _context(services))
        stream = raw.connection.get_next_available_stream_id()
        raw.connection.send_headers(
            stream,
            [
                (":method", "POST"),
                (":scheme", "https"),
                (":authority", "x"),
                (":path", "/v1/campaigns/c1/reports"),
                ("content-type", PROTOBUF),
            ],
        )
        for _ in range(3):
            raw.connection.send_data(stream, b"\x00" * 2000)
        await raw.flush()
        for _ in range(10):  # the client goes on sending what it meant to, then ends the stream
            raw.connection.send_data(stream, b"\x00" * 2000)
        raw.connection.end_stream(stream)
        await raw.flush()
        assert await pending(services) == 0
        second = await raw.start_post("/v1/campaigns/c1/reports", 0)
        raw.connection.end_stream(second)
        await raw.flush()
        await raw.read_until(lambda: raw.status(second) is not None or raw.closed())
        assert raw.status(stream) == 413  # answered once the refused body had ended
        assert raw.status(second) == 400  # an empty request, answered: the connection still serves
        await raw.close()


async def _until(condition: Any, rounds: int = 1000) -> None:
    for _ in range(rounds):
        if condition():
            return
        await asyncio.sleep(0.01)


async def test_concurrent_streams_on_one_connection_are_bounded(tmp_path: Path) -> None:
    """The server announces its stream limit (4 here); a client may hold that many requests in
    progress on one connection, and one that opens a stream more loses the connection (GOAWAY,
    PROTOCOL_ERROR): its requests end, nothing is spooled, and the limit was never passed."""
    async with https_services(tmp_path, max_streams_per_connection=4) as (services, _http1):
        assert services.shuffler is not None and services.shuffler.https is not None
        endpoint = services.shuffler.https
        polite = await RawH2.open(_address(services), _context(services))
        assert polite.connection.remote_settings.max_concurrent_streams == 4
        await polite.close()
        greedy = await RawH2.open(_address(services), _context(services), obey_limits=False)
        for _ in range(4):
            await greedy.start_post("/v1/campaigns/c1/reports", 100)  # bodies held back
        await _until(lambda: endpoint._in_progress == 4)
        assert endpoint._in_progress == 4
        await greedy.start_post("/v1/campaigns/c1/reports", 100)  # the fifth
        await greedy.read_until(greedy.closed)
        assert endpoint._in_progress <= 4
        ended = [e for e in greedy.events if isinstance(e, h2.events.ConnectionTerminated)]
        assert ended and ended[0].error_code == h2.errors.ErrorCodes.PROTOCOL_ERROR
        await greedy.close()
        await _until(lambda: endpoint._in_progress == 0)
        assert endpoint._in_progress == 0  # the held requests ended with their connection
        assert await pending(services) == 0


async def test_a_body_that_stops_coming_over_h2_is_answered_408(tmp_path: Path) -> None:
    async with https_services(tmp_path, body_timeout_s=0.3) as (services, _http1):
        raw = await RawH2.open(_address(services), _context(services))
        stream = await raw.start_post("/v1/campaigns/c1/reports", 100)
        raw.connection.send_data(stream, b"\x00" * 10)  # 10 of the 100 bytes announced
        await raw.flush()
        await raw.read_until(lambda: raw.status(stream) is not None or raw.closed())
        assert raw.status(stream) == 408
        assert await pending(services) == 0
        await raw.close()


async def test_devices_over_h2_are_counted_once(tmp_path: Path) -> None:
    """Devices (the SDK's Reporter, each its own outbox) fetch the signed description and send over
    HTTP/2 into the real services; the aggregator counts each report once."""
    devices = 6
    async with running_services(
        tmp_path, [binary_campaign("over-h2")], https=HttpsConfig(listen="127.0.0.1:0")
    ) as services:
        transport = H2Transport("https://" + _address(services), _context(services))
        for device in range(devices):
            outbox = Outbox(tmp_path / f"outbox-{device}.db")
            reporter = await Reporter.fetch(
                "over-h2", transport, outbox, aggregator_key=services.signing_key, give_up_after_s=30
            )
            reporter.record(device % 2)
            result = await reporter.send_pending()
            assert (result.acknowledged, result.pending) == (1, 0)
            outbox.close()
        await transport.close()
        assert transport.versions == {"HTTP/2"}
        answer = await counted(services, "over-h2", devices)
        assert (answer.n, answer.rejected) == (devices, 0)
        http1 = HttpTransport(
            "https://" + _address(services), tls=ClientTls(ca=services.certs / "shuffler-ca.pem")
        )
        assert (await http1.get_campaign("over-h2")).id == "over-h2"  # http.client: HTTP/1.1 still served
        await http1.close()


async def test_stop_lets_a_request_in_progress_finish_within_the_grace(tmp_path: Path) -> None:
    async with https_services(tmp_path) as (services, _http1):
        assert services.shuffler is not None and services.shuffler.https is not None
        endpoint = services.shuffler.https
        raw = await RawH2.open(_address(services), _context(services))
        body = submit_body(reports_for(services.campaigns[0], 2))
        stream = await raw.start_post("/v1/campaigns/c1/reports", len(body))
        await _until(lambda: endpoint._in_progress == 1)
        stopping = asyncio.create_task(endpoint.stop(grace=30))
        await asyncio.sleep(0.05)
        raw.connection.send_data(stream, body, end_stream=True)
        await raw.flush()
        await raw.read_until(lambda: raw.status(stream) is not None or raw.closed())
        assert raw.status(stream) == 200
        await stopping
        assert await pending(services) == 2
        await raw.close()
