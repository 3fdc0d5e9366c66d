"""TLS, surfaces and quotas through the real services (docs/security.md): each attack from issue 8
is tried against a TLS stack and refused, and, as a control, succeeds against an ``insecure``
one, so every test here fails if its protection is removed."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from deniable.aggregator import AggregatorConfig, RunningAggregator, start_aggregator
from deniable.core.campaigns import randomiser_for
from deniable.core.crypto import PublicKey, seal_report
from deniable.core.plumbing.certs import DevCerts, issue, make_ca
from deniable.core.plumbing.tls import ClientTls, ServerTls, open_channel
from deniable.core.wire import Plaintext, encode, new_report_id
from deniable.shuffler import RunningShuffler, ShufflerConfig, start_shuffler
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc

QUOTA = 4


@dataclass
class Stack:
    aggregator: RunningAggregator
    shuffler: RunningShuffler
    certs: DevCerts
    channels: list[grpc.aio.Channel]
    root: Path

    def tls(self, role: str | None, peer: str = "shuffler", certs: DevCerts | None = None) -> ClientTls:
        """Trust ``peer``'s CA (ours); present ``role``'s certificate from ``certs`` (default ours)."""
        issuer = certs or self.certs
        if role is None:
            return ClientTls(ca=self.certs.ca(peer))
        return ClientTls(ca=self.certs.ca(peer), cert=issuer.cert(role), key=issuer.key(role))

    def aggregator_as(self, role: str | None, certs: DevCerts | None = None) -> pb_grpc.AggregatorAsyncStub:
        channel = open_channel(self.aggregator.address, self.tls(role, "aggregator", certs))
        self.channels.append(channel)
        return pb_grpc.AggregatorStub(channel)

    def shuffler_as(self, role: str | None, operator_port: bool = False) -> pb_grpc.ShufflerAsyncStub:
        address = self.shuffler.operator_address if operator_port else self.shuffler.address
        assert address is not None
        channel = open_channel(address, self.tls(role))
        self.channels.append(channel)
        return pb_grpc.ShufflerStub(channel)

    def refusals(self, service: str, rpc: str, reason: str) -> float:
        metrics = self.aggregator.metrics if service == "aggregator" else self.shuffler.metrics
        value = metrics.registry.get_sample_value(
            "deniable_auth_refusals_total", {"service": service, "rpc": rpc, "reason": reason}
        )
        return value or 0.0


async def _start(tmp_path: Path, certs: DevCerts | None, quota: int = QUOTA) -> Stack:
    """Aggregator and shuffler with TLS from ``certs``, or both ``insecure`` when it is None."""

    def files(role: str) -> ServerTls | None:
        return None if certs is None else certs.server_tls(role)

    aggregator = await start_aggregator(
        AggregatorConfig(
            data_dir=tmp_path / "agg",
            listen="127.0.0.1:0",
            tls=files("aggregator"),
            insecure=certs is None,
        )
    )
    shuffler = await start_shuffler(
        ShufflerConfig(
            data_dir=tmp_path / "shuf",
            upstream=aggregator.address,
            listen="127.0.0.1:0",
            operator_listen=None if certs is None else "127.0.0.1:0",
            tls=files("shuffler"),
            upstream_ca=None if certs is None else certs.ca("aggregator"),
            insecure=certs is None,
            quota_per_source=quota,
            batch_interval_s=3600.0,
        )
    )
    return Stack(aggregator, shuffler, certs or DevCerts(tmp_path), [], tmp_path)


@pytest.fixture
async def stack(tmp_path: Path, dev_certs: DevCerts) -> AsyncIterator[Stack]:
    running = await _start(tmp_path, dev_certs)
    try:
        yield running
    finally:
        await _stop(running)


async def _stop(running: Stack) -> None:
    for channel in running.channels:
        await channel.close()
    await running.shuffler.stop(grace=1.0)
    await running.aggregator.stop(grace=1.0)


def _campaign_request(campaign_id: str, quota: int = 0) -> pb.CreateCampaignRequest:
    return pb.CreateCampaignRequest(
        id=campaign_id,
        question="Yes?",
        kind=pb.BINARY,
        epsilon0=1.0,
        n_min=1,
        quota_per_source=quota,
    )


def _reports(campaign: pb.Campaign, count: int) -> list[pb.EncryptedReport]:
    """``count`` well-formed sealed reports (all "yes")."""
    width = randomiser_for(campaign).payload_length
    out = []
    for _ in range(count):
        plaintext = encode(
            Plaintext(new_report_id(), campaign.id, campaign.key_id, (1).to_bytes(width, "big")),
            campaign.plaintext_length,
        )
        ciphertext = seal_report(plaintext, PublicKey(campaign.key_id, campaign.public_key), campaign.id)
        out.append(pb.EncryptedReport(campaign_id=campaign.id, key_id=campaign.key_id, ciphertext=ciphertext))
    return out


async def _code(call: object) -> grpc.StatusCode:
    """The status a call ends with (OK if it succeeds)."""
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


async def test_plaintext_client_against_a_tls_port_is_refused(stack: Stack, tmp_path: Path) -> None:
    """A plaintext channel gets no answer from either TLS service; an insecure stack answers it."""
    for address in (stack.aggregator.address, stack.shuffler.address, stack.shuffler.operator_address):
        assert address is not None
        channel = open_channel(address, insecure=True)
        stack.channels.append(channel)
        request = pb.GetCampaignRequest(campaign_id="x")
        code = await _code(pb_grpc.ShufflerStub(channel).GetCampaign(request, timeout=5))
        assert code == grpc.StatusCode.UNAVAILABLE, address
    plain = await _start(tmp_path / "plain", None)
    try:
        channel = open_channel(plain.shuffler.address, insecure=True)
        plain.channels.append(channel)
        code = await _code(pb_grpc.ShufflerStub(channel).GetCampaign(pb.GetCampaignRequest(campaign_id="x")))
        assert code == grpc.StatusCode.NOT_FOUND  # the control: plaintext reaches an insecure shuffler
    finally:
        await _stop(plain)


async def test_a_tls_client_refuses_a_server_it_cannot_verify(stack: Stack, other_ca_certs: DevCerts) -> None:
    """A device trusting another CA (or the system roots) does not talk to our shuffler."""
    for tls in (ClientTls(ca=other_ca_certs.ca("shuffler")), ClientTls()):
        channel = open_channel(stack.shuffler.address, tls)
        stack.channels.append(channel)
        request = pb.GetCampaignRequest(campaign_id="x")
        assert await _code(pb_grpc.ShufflerStub(channel).GetCampaign(request, timeout=5)) == (
            grpc.StatusCode.UNAVAILABLE
        )


async def test_ingest_needs_a_shuffler_certificate_from_our_ca(
    stack: Stack, other_ca_certs: DevCerts
) -> None:
    """No certificate, another CA's shuffler certificate, an operator's or a device's: refused,
    nothing counted. The shuffler's own certificate passes the check (the empty batch then fails
    validation)."""
    operator = stack.aggregator_as("aggregator-operator")
    await operator.CreateCampaign(_campaign_request("c"))
    batch = pb.ShuffledBatch(campaign_id="c", batch_id="forged", reports=[])
    assert await _code(stack.aggregator_as(None).IngestBatch(batch, timeout=5)) == grpc.StatusCode.UNAVAILABLE
    stranger = stack.aggregator_as("shuffler", other_ca_certs)
    assert await _code(stranger.IngestBatch(batch, timeout=5)) == grpc.StatusCode.UNAVAILABLE
    assert await _code(operator.IngestBatch(batch, timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
    shuffler_operator = stack.aggregator_as("shuffler-operator")
    assert await _code(shuffler_operator.IngestBatch(batch, timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
    assert stack.refusals("aggregator", "IngestBatch", "wrong_role") == 2
    device = stack.aggregator_as("device")  # the device CA is not in the aggregator's bundle
    assert await _code(device.IngestBatch(batch, timeout=5)) == grpc.StatusCode.UNAVAILABLE
    passed = await _code(stack.aggregator_as("shuffler").IngestBatch(batch, timeout=5))
    assert passed not in (
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.OK,
    )
    answer = await operator.BinarySum(pb.QueryRequest(campaign_id="c"))
    assert answer.n == 0


async def test_flush_and_create_campaign_need_the_operator(stack: Stack, tmp_path: Path) -> None:
    """Flush, Stats, ListCampaigns from a device (no certificate, or a device certificate) and
    CreateCampaign from a device or the shuffler are refused and counted; the operator's pass.
    On an insecure stack the same anonymous Flush succeeds (the attack from issue 8)."""
    device_port = stack.shuffler_as(None)
    flush = pb.FlushRequest(below_n_min=True)
    assert await _code(device_port.Flush(flush)) == grpc.StatusCode.UNAUTHENTICATED
    assert await _code(device_port.Stats(pb.ShufflerStatsRequest())) == grpc.StatusCode.UNAUTHENTICATED
    listing = device_port.ListCampaigns(pb.ListCampaignsRequest())
    assert await _code(listing) == grpc.StatusCode.UNAUTHENTICATED
    assert stack.refusals("shuffler", "Flush", "no_certificate") == 1
    device_cert = stack.shuffler_as("device", operator_port=True)
    assert await _code(device_cert.Flush(flush)) == grpc.StatusCode.PERMISSION_DENIED
    assert stack.refusals("shuffler", "Flush", "wrong_role") == 1
    shuffler_operator = stack.shuffler_as("shuffler-operator", operator_port=True)
    assert await _code(shuffler_operator.Flush(flush)) == grpc.StatusCode.OK

    create = _campaign_request("made-by-a-stranger")
    for role in ("shuffler", "shuffler-operator"):  # nothing the shuffler's party holds operates it
        refused = await _code(stack.aggregator_as(role).CreateCampaign(create))
        assert refused == grpc.StatusCode.PERMISSION_DENIED, role
    assert await _code(stack.aggregator_as(None).CreateCampaign(create, timeout=5)) == (
        grpc.StatusCode.UNAVAILABLE  # no client certificate: the handshake itself fails
    )
    assert stack.refusals("aggregator", "CreateCampaign", "wrong_role") == 2
    operator = stack.aggregator_as("aggregator-operator")
    assert await _code(operator.CreateCampaign(create)) == grpc.StatusCode.OK

    plain = await _start(tmp_path / "plain", None)
    try:
        channel = open_channel(plain.shuffler.address, insecure=True)
        plain.channels.append(channel)
        assert await _code(pb_grpc.ShufflerStub(channel).Flush(flush)) == grpc.StatusCode.OK
    finally:
        await _stop(plain)


async def test_devices_reach_campaigns_and_submit_on_the_device_port(stack: Stack) -> None:
    """What devices need stays open without a credential: GetCampaign, SubmitReports, health;
    a device with a certificate submits on the mutual-TLS port."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    created = await stack.aggregator_as("aggregator-operator").CreateCampaign(_campaign_request("open"))
    device = stack.shuffler_as(None)
    relayed = await device.GetCampaign(pb.GetCampaignRequest(campaign_id="open"))
    assert relayed.public_key == created.public_key
    response = await device.SubmitReports(pb.SubmitReportsRequest(reports=_reports(created, 2)))
    assert response.accepted == 2
    credentialed = stack.shuffler_as("device", operator_port=True)  # a device with a certificate
    response = await credentialed.SubmitReports(pb.SubmitReportsRequest(reports=_reports(created, 1)))
    assert response.accepted == 1
    channel = open_channel(stack.shuffler.address, stack.tls(None))
    stack.channels.append(channel)
    health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert health.status == health_pb2.HealthCheckResponse.SERVING


async def _count_after_flush(stack: Stack, campaign_id: str) -> int:
    operator = stack.shuffler_as("shuffler-operator", operator_port=True)
    await operator.Flush(pb.FlushRequest(campaign_id=campaign_id, below_n_min=True), timeout=60)
    query = pb.QueryRequest(campaign_id=campaign_id)
    answer = await stack.aggregator_as("aggregator-operator").BinarySum(query)
    return int(answer.n)


async def test_a_device_over_its_quota_is_refused_and_nothing_beyond_it_is_counted(stack: Stack) -> None:
    """Shuffler default quota 4, a campaign overriding it with 6: one address sends 3 + 3 + 3
    reports to each; beyond the quota every request gets RESOURCE_EXHAUSTED and the aggregator
    counts exactly what was accepted. The spool and the aggregator keep no trace of the address."""
    operator = stack.aggregator_as("aggregator-operator")
    default = await operator.CreateCampaign(_campaign_request("default-quota"))
    override = await operator.CreateCampaign(_campaign_request("own-quota", quota=6))
    assert override.quota_per_source == 6
    device = stack.shuffler_as(None)
    for campaign, quota in ((default, QUOTA), (override, 6)):
        codes = []
        for _ in range(3):
            request = pb.SubmitReportsRequest(reports=_reports(campaign, 3))
            codes.append(await _code(device.SubmitReports(request)))
        ok = (quota // 3) * 3
        assert codes.count(grpc.StatusCode.OK) == ok // 3, (campaign.id, codes)
        assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == 3 - ok // 3
        assert await _count_after_flush(stack, campaign.id) == ok
    one = pb.SubmitReportsRequest(reports=_reports(default, 1))
    assert await _code(device.SubmitReports(one)) == grpc.StatusCode.OK  # 3 + 1 = 4: exactly the quota
    assert await _code(device.SubmitReports(one)) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert await _count_after_flush(stack, default.id) == QUOTA
    assert stack.shuffler.metrics.quota_refusals._value.get() == 4
    for path in stack.root.rglob("*"):  # spool, batches, counts: no source address anywhere
        if path.is_file():
            assert b"127.0.0.1" not in path.read_bytes(), path


async def test_without_a_quota_the_same_flood_is_counted(tmp_path: Path, dev_certs: DevCerts) -> None:
    """The control for the quota test: quota 0 (no limit) counts all 9 reports of one address."""
    running = await _start(tmp_path, dev_certs, quota=0)
    try:
        operator = running.aggregator_as("aggregator-operator")
        campaign = await operator.CreateCampaign(_campaign_request("open"))
        device = running.shuffler_as(None)
        for _ in range(3):
            await device.SubmitReports(pb.SubmitReportsRequest(reports=_reports(campaign, 3)))
        assert await _count_after_flush(running, campaign.id) == 9
    finally:
        await _stop(running)


def _write(path: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> tuple[Path, Path]:
    path.mkdir(parents=True, exist_ok=True)
    pem, key_file = path / "cert.pem", path / "cert.key"
    pem.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return pem, key_file


async def test_a_certificate_of_our_ca_without_a_role_is_unauthenticated(tmp_path: Path) -> None:
    """Our CA, a valid client certificate, but no role URI: UNAUTHENTICATED, counted as no_role."""
    ca_key, ca = make_ca("aggregator")
    ca_file = tmp_path / "ca.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    agg_cert, agg_key = _write(tmp_path / "agg-tls", *issue(ca_key, ca, "aggregator"))
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    roleless = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nobody")]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("nobody")]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    client_cert, client_key = _write(tmp_path / "client", key, roleless)
    aggregator = await start_aggregator(
        AggregatorConfig(
            data_dir=tmp_path / "agg", listen="127.0.0.1:0", tls=ServerTls(agg_cert, agg_key, ca_file)
        )
    )
    channel = open_channel(aggregator.address, ClientTls(ca_file, client_cert, client_key))
    try:
        stub = pb_grpc.AggregatorStub(channel)
        for call in (stub.ListKeys(pb.ListKeysRequest()), stub.ListCampaigns(pb.ListCampaignsRequest())):
            assert await _code(call) == grpc.StatusCode.UNAUTHENTICATED
        refused = aggregator.metrics.registry.get_sample_value(
            "deniable_auth_refusals_total", {"service": "aggregator", "rpc": "ListKeys", "reason": "no_role"}
        )
        assert refused == 1
    finally:
        await channel.close()
        await aggregator.stop(grace=1.0)
