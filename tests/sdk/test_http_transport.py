"""``HttpTransport`` (standard library only) through the shuffler's HTTPS endpoint into the real
services over TLS: every device's report counted once; failures map to retryable or permanent."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.sdk_services import binary_campaign, categorical_campaign, counted, running_services

from deniable.client import ClientTls, HttpTransport, Outbox, Reporter, TransportError
from deniable.shuffler.https import HttpsConfig
from deniable.v1 import deniable_pb2 as pb

DEVICES = 12
HTTPS = HttpsConfig(listen="127.0.0.1:0")


def _transport(services: object) -> HttpTransport:
    shuffler = services.shuffler  # type: ignore[attr-defined]
    ca = services.certs / "shuffler-ca.pem"  # type: ignore[attr-defined]
    return HttpTransport(f"https://{shuffler.https_address}", tls=ClientTls(ca=ca))


async def test_devices_over_https_are_counted_once(tmp_path: Path) -> None:
    """DEVICES devices, each its own Reporter and outbox, fetch (signature pinned) and send over
    HTTPS; the aggregator counts DEVICES messages and rejects none (a report sent twice would be
    a duplicate, one lost would leave the count short)."""
    async with running_services(tmp_path, [binary_campaign("over-https")], https=HTTPS) as services:
        transport = _transport(services)
        for device in range(DEVICES):
            outbox = Outbox(tmp_path / f"outbox-{device}.db")
            reporter = await Reporter.fetch(
                "over-https", transport, outbox, aggregator_key=services.signing_key, give_up_after_s=30
            )
            reporter.record(device % 2)
            result = await reporter.send_pending()
            assert (result.acknowledged, result.pending) == (1, 0)
            outbox.close()
        await transport.close()
        answer = await counted(services, "over-https", DEVICES)
        assert (answer.n, answer.rejected) == (DEVICES, 0)


async def test_reports_of_two_campaigns_go_as_two_requests_and_merge(tmp_path: Path) -> None:
    """One submit naming two campaigns: one POST per campaign; rejections keep the caller's indices."""
    requests = [binary_campaign("https-a"), categorical_campaign("https-b", ["x", "y", "z"])]
    async with running_services(tmp_path, requests, https=HTTPS) as services:
        transport = _transport(services)
        a, b = services.campaigns
        reports = [
            pb.EncryptedReport(campaign_id=c.id, key_id=c.key_id, ciphertext=bytes(c.ciphertext_length))
            for c in (a, b, a)
        ]
        reports.insert(2, pb.EncryptedReport(campaign_id=b.id, key_id=b.key_id, ciphertext=b"short"))
        response = await transport.submit(reports)
        assert response.accepted == 3
        assert [(r.index, r.reason) for r in response.rejected] == [(2, pb.WRONG_CIPHERTEXT_LENGTH)]
        await transport.close()


async def test_refusals_are_permanent_or_retryable_as_their_status_says(tmp_path: Path) -> None:
    async with running_services(
        tmp_path, [binary_campaign("https-q")], https=HTTPS, quota_per_source=1
    ) as services:
        transport = _transport(services)
        with pytest.raises(TransportError) as missing:
            await transport.get_campaign("no-such-campaign")
        assert not missing.value.retryable and "404 not_found" in missing.value.message
        campaign = services.campaigns[0]
        report = pb.EncryptedReport(
            campaign_id=campaign.id, key_id=campaign.key_id, ciphertext=bytes(campaign.ciphertext_length)
        )
        assert (await transport.submit([report])).accepted == 1
        with pytest.raises(TransportError) as over:
            await transport.submit([report])
        assert over.value.retryable and "429 quota_exceeded" in over.value.message
        await transport.close()


async def test_an_unreachable_or_untrusted_shuffler_is_a_retryable_failure(tmp_path: Path) -> None:
    async with running_services(tmp_path, [binary_campaign("https-t")], https=HTTPS) as services:
        assert services.shuffler is not None
        untrusted = HttpTransport(f"https://{services.shuffler.https_address}")  # system roots only
        with pytest.raises(TransportError) as refused:
            await untrusted.get_campaign("https-t")
        assert refused.value.retryable and "CERTIFICATE_VERIFY_FAILED" in refused.value.message
        port = services.shuffler.https.port if services.shuffler.https else 0
    await asyncio.sleep(0)
    shuffler_ca = ClientTls(ca=tmp_path / "certs" / "shuffler-ca.pem")
    gone = HttpTransport(f"https://127.0.0.1:{port}", tls=shuffler_ca)
    with pytest.raises(TransportError) as down:
        await gone.get_campaign("https-t")
    assert down.value.retryable


def test_the_url_must_match_the_security_asked_for() -> None:
    with pytest.raises(ValueError, match="https://"):
        HttpTransport("http://127.0.0.1:1")
    with pytest.raises(ValueError, match="insecure"):
        HttpTransport("https://127.0.0.1:1", insecure=True)
    with pytest.raises(ValueError, match="tls or insecure"):
        HttpTransport("http://127.0.0.1:1", tls=ClientTls(), insecure=True)
