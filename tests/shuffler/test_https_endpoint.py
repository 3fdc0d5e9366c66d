"""The shuffler's HTTPS face over real TLS in front of a real aggregator: the campaign route, the
reports route (spooled, answered, counted in the metrics), health, CORS, quotas shared with gRPC,
load shedding and logs without addresses (docs/https.md)."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.https_services import https_services, pending, reports_for, submit_body

from deniable.client import ClientTls, GrpcTransport, TransportError, verify_description
from deniable.core.errors import ConfigurationError
from deniable.shuffler.https import ERROR_CODES, PROTOBUF, HttpsConfig
from deniable.v1 import deniable_pb2 as pb

ORIGIN = "https://app.example"
PEER = re.compile(r"127\.0\.0\.1(?!:\d)")


def _requests_total(services: object, rpc: str, code: str) -> float:
    metrics = services.shuffler.metrics  # type: ignore[attr-defined]
    value = metrics.registry.get_sample_value(
        "deniable_requests_total", {"service": "shuffler", "rpc": rpc, "code": code}
    )
    return float(value or 0.0)


async def test_campaign_route_relays_the_signed_description(tmp_path: Path) -> None:
    async with https_services(tmp_path) as (services, client):
        answer = await client.request("GET", "/v1/campaigns/c1")
        assert answer.status == 200
        assert answer.headers["Content-Type"] == PROTOBUF
        campaign = pb.Campaign.FromString(answer.body)
        assert campaign == services.campaigns[0]
        verify_description(campaign, services.signing_key)  # the signature devices check holds
        missing = await client.request("GET", "/v1/campaigns/nope")
        assert (missing.status, missing.json()["code"]) == (404, "not_found")
        assert _requests_total(services, "http_get_campaign", "200") == 1
        registry = services.shuffler.metrics.registry  # type: ignore[union-attr]
        series = {"service": "shuffler", "rpc": "http_submit_reports", "code": "429"}
        assert registry.get_sample_value("deniable_requests_total", series) == 0.0  # there from the start


async def test_reports_route_spools_durably_and_answers_per_report(tmp_path: Path) -> None:
    async with https_services(tmp_path) as (services, client):
        campaign = services.campaigns[0]
        answer = await client.submit("c1", submit_body(reports_for(campaign, 5)))
        assert answer.status == 200
        assert pb.SubmitReportsResponse.FromString(answer.body).accepted == 5
        assert await pending(services) == 5  # spooled before the answer existed
        mixed = reports_for(campaign, 3)
        mixed[1].ciphertext = b"short"
        response = pb.SubmitReportsResponse.FromString((await client.submit("c1", submit_body(mixed))).body)
        assert response.accepted == 2
        assert [(r.index, r.reason) for r in response.rejected] == [(1, pb.WRONG_CIPHERTEXT_LENGTH)]
        assert await pending(services) == 7
        assert _requests_total(services, "http_submit_reports", "200") == 2


async def test_health_route_and_unknown_routes(tmp_path: Path) -> None:
    async with https_services(tmp_path) as (_services, client):
        health = await client.request("GET", "/healthz")
        assert (health.status, health.json()) == (200, {"status": "serving"})
        nowhere = await client.request("GET", "/v2/anything")
        assert (nowhere.status, nowhere.json()["code"]) == (404, "no_such_route")
        wrong = await client.request("PUT", "/v1/campaigns/c1/reports", b"")
        assert (wrong.status, wrong.json()["code"]) == (405, "method_not_allowed")


async def test_cors_is_closed_by_default(tmp_path: Path) -> None:
    async with https_services(tmp_path) as (_services, client):
        preflight = await client.request(
            "OPTIONS",
            "/v1/campaigns/c1/reports",
            headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"},
        )
        assert (preflight.status, preflight.json()["code"]) == (403, "origin_not_allowed")
        answer = await client.request("GET", "/v1/campaigns/c1", headers={"Origin": ORIGIN})
        assert "Access-Control-Allow-Origin" not in answer.headers


async def test_cors_allows_the_listed_origins_only(tmp_path: Path) -> None:
    async with https_services(tmp_path, cors_origins=(ORIGIN,)) as (services, client):
        ask = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST"}
        preflight = await client.request("OPTIONS", "/v1/campaigns/c1/reports", headers=ask)
        assert preflight.status == 204
        assert preflight.headers["Access-Control-Allow-Origin"] == ORIGIN
        assert "POST" in preflight.headers["Access-Control-Allow-Methods"]
        assert preflight.headers["Access-Control-Allow-Headers"] == "Content-Type"
        body = submit_body(reports_for(services.campaigns[0], 1))
        allowed = await client.submit("c1", body, Origin=ORIGIN)
        assert allowed.headers["Access-Control-Allow-Origin"] == ORIGIN
        other = {"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
        refused = await client.request("OPTIONS", "/v1/campaigns/c1/reports", headers=other)
        assert refused.status == 403
        answered = await client.submit("c1", body, Origin="https://evil.example")
        assert "Access-Control-Allow-Origin" not in answered.headers  # the browser hides the answer


async def test_quota_is_shared_with_the_grpc_device_port(tmp_path: Path) -> None:
    async with https_services(tmp_path, shuffler_options={"quota_per_source": 3}) as (services, client):
        campaign = services.campaigns[0]
        assert (await client.submit("c1", submit_body(reports_for(campaign, 3)))).status == 200
        over = await client.submit("c1", submit_body(reports_for(campaign, 1)))
        assert (over.status, over.json()["code"]) == (429, "quota_exceeded")
        shuffler_ca = ClientTls(ca=services.certs / "shuffler-ca.pem")
        grpc_device = GrpcTransport(services.shuffler_address, tls=shuffler_ca)
        with pytest.raises(TransportError, match="RESOURCE_EXHAUSTED"):
            await grpc_device.submit(reports_for(campaign, 1))  # the same address, the same quota
        await grpc_device.close()
        assert await pending(services) == 3


async def _hold_one_request(address: str, context: ssl.SSLContext) -> asyncio.StreamWriter:
    """Open a POST whose body never comes: it stays in progress until the connection closes."""
    host, port = address.rsplit(":", 1)
    _, writer = await asyncio.open_connection(host, int(port), ssl=context, server_hostname=host)
    writer.write(
        b"POST /v1/campaigns/c1/reports HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/x-protobuf\r\nContent-Length: 100\r\n\r\n"
    )
    await writer.drain()
    return writer


async def test_load_is_shed_beyond_the_bound(tmp_path: Path) -> None:
    async with https_services(tmp_path, max_concurrent=1) as (services, client):
        shuffler = services.shuffler
        assert shuffler is not None and shuffler.https is not None and shuffler.https_address
        writer = await _hold_one_request(shuffler.https_address, client.ssl)
        for _ in range(500):
            if shuffler.https._in_progress:
                break
            await asyncio.sleep(0.01)
        shed = await client.request("GET", "/healthz")
        assert (shed.status, shed.json()["code"], shed.headers["Retry-After"]) == (503, "overloaded", "1")
        writer.close()
        for _ in range(500):
            if not shuffler.https._in_progress:
                break
            await asyncio.sleep(0.01)
        assert (await client.request("GET", "/healthz")).status == 200


class _Kept(logging.Handler):
    """Keeps every record it is handed (independent of how earlier tests configured logging)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def test_logs_never_name_the_address(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.DEBUG)
    kept = _Kept()
    quiet = logging.getLogger("deniable.shuffler.https.protocol")
    monkeypatch.setattr(quiet, "disabled", False)  # a logging config of an earlier test may disable it
    level = quiet.level
    quiet.setLevel(logging.DEBUG)  # an earlier test may have raised the deniable loggers' level
    quiet.addHandler(kept)
    try:
        await _provoke_logs(tmp_path)
    finally:
        quiet.removeHandler(kept)
        quiet.setLevel(level)
    protocol = [r for r in kept.records if r.name == "deniable.shuffler.https.protocol"]
    assert protocol  # hypercorn's own lines (its start) went through the address-free logger
    # Services' own listening addresses carry a port; a peer's address would appear without one.
    leaks = [r.getMessage() for r in [*caplog.records, *kept.records] if PEER.search(r.getMessage())]
    assert not leaks, leaks


async def _provoke_logs(tmp_path: Path) -> None:
    """A garbage body, an unknown campaign, and a connection that does not speak HTTP."""
    async with https_services(tmp_path) as (services, client):
        assert services.shuffler is not None and services.shuffler.https_address
        await client.submit("c1", b"\xff" * 64)
        await client.request("GET", "/v1/campaigns/nope")
        host, port = services.shuffler.https_address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port), ssl=client.ssl, server_hostname=host)
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")  # a protocol error: answered, logged without the peer
        await writer.drain()
        assert (await reader.read()).startswith(b"HTTP/1.1 400")
        writer.close()


def test_every_error_code_has_a_client_error_or_server_status() -> None:
    assert all(400 <= status < 600 for status in ERROR_CODES.values())


async def test_insecure_shuffler_serves_plain_http_and_a_taken_port_refuses_to_start(
    start: Any, tmp_path: Path
) -> None:
    """With ``insecure`` (tests only) the face is plaintext like every port; a taken port is a
    one-line ConfigurationError and the data directory is free again for the next start."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(ConfigurationError, match="cannot serve HTTPS"):
            await start(https=HttpsConfig(listen=busy))
    shuffler = await start(https=HttpsConfig(listen="127.0.0.1:0"))
    async with aiohttp.ClientSession() as session:
        answer = await session.get(f"http://{shuffler.https_address}/healthz")
        assert answer.status in (200, 503)  # served in plaintext; the fake upstream decides health
        assert "status" in await answer.json()
        answer.release()
