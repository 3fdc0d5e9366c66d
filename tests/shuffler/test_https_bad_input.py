"""Bad input on the HTTPS reports route: a clear 4xx with a stable JSON code, a failure metric, and
nothing spooled (docs/https.md). One test per kind of bad input."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from support.https_services import assert_refused, https_services, pending, reports_for, submit_body

from deniable.core.rng import default_rng


async def _refused(
    tmp_path: Path, path_campaign: str, body: bytes, status: int, code: str, **options: Any
) -> None:
    """Send ``body`` to ``path_campaign``'s route; the answer is ``status``/``code``, nothing is held."""
    async with https_services(tmp_path, campaigns=("c1", "c2"), **options) as (services, client):
        answer = await client.submit(path_campaign, body)
        await assert_refused(services, answer, status, code)
        good = submit_body(reports_for(services.campaigns[0], 2))
        assert (await client.submit("c1", good)).status == 200  # the same route takes a good body
        assert await pending(services) == 2


async def test_wrong_content_type(tmp_path: Path) -> None:
    async with https_services(tmp_path) as (services, client):
        body = submit_body(reports_for(services.campaigns[0], 2))
        for content_type in ("text/plain", "application/json", "application/x-www-form-urlencoded"):
            answer = await client.submit("c1", body, content_type=content_type)
            assert (answer.status, answer.json()["code"]) == (415, "bad_content_type")
        assert await pending(services) == 0


async def test_oversized_body(tmp_path: Path) -> None:
    async with https_services(tmp_path, max_body_bytes=1024) as (services, client):
        body = submit_body(reports_for(services.campaigns[0], 40))
        assert len(body) > 1024
        answer = await client.submit("c1", body)
        assert (answer.status, answer.json()["code"]) == (413, "body_too_large")
        assert await pending(services) == 0
        assert (await client.submit("c1", submit_body(reports_for(services.campaigns[0], 2)))).status == 200


async def test_truncated_body(tmp_path: Path) -> None:
    async with https_services(tmp_path) as (services, client):
        body = submit_body(reports_for(services.campaigns[0], 3))
        answer = await client.submit("c1", body[:-5])  # cut inside the last report's ciphertext
        assert (answer.status, answer.json()["code"]) == (400, "malformed_body")
        assert await pending(services) == 0


async def test_garbage_body(tmp_path: Path) -> None:
    await _refused(tmp_path, "c1", b"\xff" * 64, 400, "malformed_body")


async def test_random_bytes_never_spool(tmp_path: Path) -> None:
    async with https_services(tmp_path) as (services, client):
        for _ in range(20):
            answer = await client.submit("c1", default_rng().bytes(200))
            assert 400 <= answer.status < 500
        assert await pending(services) == 0


async def test_campaign_in_body_is_not_the_path_campaign(tmp_path: Path) -> None:
    async with https_services(tmp_path, campaigns=("c1", "c2")) as (services, client):
        c1, c2 = services.campaigns
        whole = await client.submit("c1", submit_body(reports_for(c2, 3)))  # one-campaign fast path
        assert (whole.status, whole.json()["code"]) == (400, "campaign_mismatch")
        mixed = await client.submit("c1", submit_body([*reports_for(c1, 2), *reports_for(c2, 1)]))
        assert (mixed.status, mixed.json()["code"]) == (400, "campaign_mismatch")
        assert "report 2" in mixed.json()["message"]
        assert await pending(services) == 0


async def test_malformed_campaign_id_in_path(tmp_path: Path) -> None:
    async with https_services(tmp_path) as (services, client):
        answer = await client.submit("bad%20id!", submit_body(reports_for(services.campaigns[0], 1)))
        assert (answer.status, answer.json()["code"]) == (400, "invalid_campaign_id")
        assert "bad" not in answer.json()["message"]  # junk from the caller is never echoed
        assert await pending(services) == 0


async def test_empty_body(tmp_path: Path) -> None:
    await _refused(tmp_path, "c1", b"", 400, "invalid_request")


async def test_body_shorter_than_its_length_times_out(tmp_path: Path) -> None:
    """A body that stops short of its Content-Length (a truncated upload) is answered 408 once the
    body timeout passes, and the connection's slot is freed; nothing is spooled."""
    async with https_services(tmp_path, body_timeout_s=0.3) as (services, client):
        assert services.shuffler is not None and services.shuffler.https_address is not None
        host, port = services.shuffler.https_address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port), ssl=client.ssl, server_hostname=host)
        body = submit_body(reports_for(services.campaigns[0], 3))
        head = (
            "POST /v1/campaigns/c1/reports HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        writer.write(head.encode() + body[:-10])
        await writer.drain()
        status_line = await asyncio.wait_for(reader.readline(), 30)
        assert status_line.startswith(b"HTTP/1.1 408"), status_line
        writer.close()
        assert await pending(services) == 0


async def test_a_request_head_that_never_completes_is_cut_at_the_idle_timeout(tmp_path: Path) -> None:
    """Slow-loris: a request line and headers sent in part and then held; the connection is closed
    once ``idle_timeout_s`` passes (the keep-alive timer runs until a whole head has arrived), and
    nothing reached the handlers."""
    async with https_services(tmp_path, idle_timeout_s=0.3) as (services, client):
        assert services.shuffler is not None and services.shuffler.https_address is not None
        host, port = services.shuffler.https_address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port), ssl=client.ssl, server_hostname=host)
        writer.write(b"POST /v1/campaigns/c1/reports HTTP/1.1\r\nHost: x\r\nContent-Ty")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 30) == b""  # closed without an answer
        writer.close()
        assert await pending(services) == 0
