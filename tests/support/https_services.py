"""The real services over TLS with the shuffler's HTTPS face on, and a small HTTPS client for tests."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from deniable.shuffler.https import PROTOBUF, HttpsConfig
from deniable.v1 import deniable_pb2 as pb
from support.sdk_services import Services, binary_campaign, running_services


@dataclass
class Answer:
    """One HTTP answer: status, headers and body."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        import json

        return json.loads(self.body)


@dataclass
class HttpsClient:
    """Requests to the shuffler's HTTPS face over HTTP/1.1 (aiohttp's client), trusting the development CA."""

    base: str
    session: aiohttp.ClientSession
    ssl: ssl.SSLContext

    async def request(
        self, method: str, path: str, body: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> Answer:
        async with self.session.request(
            method, self.base + path, data=body, headers=dict(headers or {}), ssl=self.ssl
        ) as answer:
            return Answer(answer.status, dict(answer.headers), await answer.read())

    async def submit(
        self, campaign_id: str, body: bytes, content_type: str = PROTOBUF, **headers: str
    ) -> Answer:
        """POST ``body`` to the campaign's reports route."""
        return await self.request(
            "POST", f"/v1/campaigns/{campaign_id}/reports", body, {"Content-Type": content_type, **headers}
        )


def reports_for(campaign: pb.Campaign, count: int) -> list[pb.EncryptedReport]:
    """Well-formed envelopes (zero ciphertexts of the campaign's length): the shuffler accepts them."""
    return [
        pb.EncryptedReport(
            campaign_id=campaign.id,
            key_id=campaign.key_id,
            ciphertext=bytes([i % 256]) * campaign.ciphertext_length,
        )
        for i in range(count)
    ]


def submit_body(reports: list[pb.EncryptedReport]) -> bytes:
    return pb.SubmitReportsRequest(reports=reports).SerializeToString()


async def pending(services: Services) -> int:
    """Reports the shuffler holds (pending or in flight), all campaigns."""
    assert services.shuffler is not None
    stats = await services.shuffler.handlers.stats()
    return sum(c.pending + c.in_flight for c in stats.campaigns)


async def assert_refused(services: Services, answer: Any, status: int, code: str) -> None:
    """``answer`` (HTTP/1.1 or h2) is ``status`` with JSON ``code``; nothing is held; the refusal
    is counted once in the shuffler's failed-requests metric."""
    assert (answer.status, answer.json()["code"]) == (status, code), answer.body
    assert set(answer.json()) == {"code", "message"}
    assert await pending(services) == 0
    assert services.shuffler is not None
    failed = services.shuffler.metrics.registry.get_sample_value(
        "deniable_shuffler_requests_failed_total", {"rpc": "http_submit_reports", "code": str(status)}
    )
    assert failed == 1


@asynccontextmanager
async def https_services(
    workdir: Path,
    campaigns: tuple[str, ...] = ("c1",),
    shuffler_options: Mapping[str, Any] | None = None,
    **https_options: Any,
) -> AsyncIterator[tuple[Services, HttpsClient]]:
    """Aggregator and shuffler over TLS, the HTTPS face on a free port with ``https_options``
    (``HttpsConfig`` fields), binary campaigns ``campaigns``, and a client for it."""
    https = HttpsConfig(listen="127.0.0.1:0", **https_options)
    requests = [binary_campaign(c) for c in campaigns]
    async with running_services(workdir, requests, https=https, **(shuffler_options or {})) as services:
        assert services.shuffler is not None and services.shuffler.https_address is not None
        context = ssl.create_default_context(cafile=str(services.certs / "shuffler-ca.pem"))
        async with aiohttp.ClientSession() as session:
            yield services, HttpsClient("https://" + services.shuffler.https_address, session, context)
