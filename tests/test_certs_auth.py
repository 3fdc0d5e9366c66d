"""Development certificates (one CA per party, roles in SAN URIs, own usages only, 0600 keys),
roles bound to their party's CA, and the default-deny access policies (ADR 0030)."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID

from deniable.aggregator.server import ACCESS_POLICY as AGGREGATOR
from deniable.core.errors import ConfigurationError
from deniable.core.plumbing.auth import HEALTH_METHODS, refusal
from deniable.core.plumbing.certs import ROLE_URI_PREFIX, issue, make_ca, role_of, write_dev_certs
from deniable.core.plumbing.tls import (
    NO_CERTIFICATE,
    NO_ROLE,
    RETIRED_ROLE,
    WRONG_ISSUER,
    ClientTls,
    PeerRoles,
    ServerTls,
    party_of_ca,
    peer_role,
)
from deniable.shuffler.server import ACCESS_POLICY as SHUFFLER
from deniable.v1 import deniable_pb2 as pb

SERVER = ExtendedKeyUsageOID.SERVER_AUTH
CLIENT = ExtendedKeyUsageOID.CLIENT_AUTH
EXPECTED = {
    "shuffler": ("shuffler", {SERVER, CLIENT}),
    "shuffler-operator": ("shuffler", {CLIENT}),
    "aggregator": ("aggregator", {SERVER, CLIENT}),  # client: its own readiness probe, NATS
    "aggregator-operator": ("aggregator", {CLIENT}),
    "device": ("device", {CLIENT}),
}
"""Each role: the party whose CA issues it, and its only usages."""


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _hosts(cert: x509.Certificate) -> set[str]:
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return set(san.get_values_for_type(x509.DNSName)) | {
        str(ip) for ip in san.get_values_for_type(x509.IPAddress)
    }


def test_dev_certs_one_ca_per_party_own_usages_own_hosts(tmp_path: Path) -> None:
    hosts = {"shuffler": ["shuffler.internal", "10.0.0.7"], "aggregator": ["aggregator.internal"]}
    out = write_dev_certs(tmp_path / "certs", hosts=hosts, roles=(*EXPECTED.keys(),))
    cas = {party: _load(out.ca(party)) for party in ("shuffler", "aggregator", "device")}
    assert len({ca.subject for ca in cas.values()}) == 3
    for party, ca in cas.items():
        assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        assert party_of_ca(ca) == party
    assert not list((tmp_path / "certs").glob("*ca.key"))  # no CA private key is kept
    for role, (party, usages) in EXPECTED.items():
        cert = _load(out.cert(role))
        assert role_of(cert) == role
        cert.verify_directly_issued_by(cas[party])
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert set(eku) == usages, role
        assert stat.S_IMODE(out.key(role).stat().st_mode) == 0o600
    assert _hosts(_load(out.cert("shuffler"))) == {
        "localhost",
        "127.0.0.1",
        "::1",
        "shuffler.internal",
        "10.0.0.7",
    }
    assert _hosts(_load(out.cert("aggregator"))) == {"localhost", "127.0.0.1", "::1", "aggregator.internal"}
    for role in ("shuffler-operator", "aggregator-operator", "device"):
        assert _hosts(_load(out.cert(role))) == set(), role  # never serves, names no host
    bundles = {
        s: x509.load_pem_x509_certificates(out.clients_ca(s).read_bytes()) for s in ("aggregator", "shuffler")
    }
    assert {party_of_ca(ca) for ca in bundles["aggregator"]} == {"aggregator", "shuffler"}
    assert {party_of_ca(ca) for ca in bundles["shuffler"]} == {"shuffler", "device"}


def test_without_device_no_device_ca_and_the_removed_role_is_not_issued(tmp_path: Path) -> None:
    out = write_dev_certs(tmp_path)
    assert not out.ca("device").exists() and not out.cert("device").exists()
    assert not out.cert("operator").exists()
    with pytest.raises(ConfigurationError, match="unknown role"):
        write_dev_certs(tmp_path / "old", roles=("operator",))


def test_a_certificate_names_one_known_role_or_none() -> None:
    ca_key, ca = make_ca("device")
    _, device = issue(ca_key, ca, "device")
    assert role_of(device) == "device"
    assert role_of(ca) is None
    with pytest.raises(ConfigurationError):
        issue(ca_key, ca, "root")
    assert ROLE_URI_PREFIX == "spiffe://deniable/"


class _Context:
    def __init__(self, pem: bytes | None) -> None:
        self._pem = pem

    def auth_context(self) -> dict[str, list[bytes]]:
        return {} if self._pem is None else {"x509_pem_cert": [self._pem]}


def test_peer_roles_read_the_verified_certificate(tmp_path: Path) -> None:
    out = write_dev_certs(tmp_path)
    roles = PeerRoles(
        ServerTls(out.cert("aggregator"), out.key("aggregator"), out.clients_ca("aggregator")).issuers()
    )
    context: Any = _Context(out.cert("aggregator-operator").read_bytes())
    assert roles.role(context) == "aggregator-operator"
    assert roles.role(_Context(out.cert("shuffler").read_bytes())) == "shuffler"  # type: ignore[arg-type]
    assert roles.role(_Context(None)) == NO_CERTIFICATE  # type: ignore[arg-type]
    assert roles.role(_Context(out.ca("aggregator").read_bytes())) == NO_ROLE  # type: ignore[arg-type]
    assert roles.role(_Context(b"not a certificate")) == NO_ROLE  # type: ignore[arg-type]


def test_a_role_counts_only_from_its_own_partys_ca() -> None:
    """A shuffler-party CA minting ``aggregator-operator`` gets WRONG_ISSUER; the same certificate
    read without the binding (the CA claiming the aggregator's party) would pass: the control."""
    agg_key, agg_ca = make_ca("aggregator")
    shuf_key, shuf_ca = make_ca("shuffler")
    _, forged = issue(shuf_key, shuf_ca, "aggregator-operator")
    _, genuine = issue(agg_key, agg_ca, "aggregator-operator")
    _, shuffler = issue(shuf_key, shuf_ca, "shuffler")
    issuers = {"aggregator": (agg_ca,), "shuffler": (shuf_ca,)}
    assert role_of(forged) == "aggregator-operator"  # the SAN alone says operator
    assert peer_role(forged, issuers) == WRONG_ISSUER
    assert peer_role(genuine, issuers) == "aggregator-operator"
    assert peer_role(shuffler, issuers) == "shuffler"
    assert peer_role(shuffler, {"aggregator": (shuf_ca,)}) == WRONG_ISSUER
    assert peer_role(forged, {"aggregator": (agg_ca, shuf_ca)}) == "aggregator-operator"  # control
    _, retired = issue(agg_key, agg_ca, "operator")
    assert peer_role(retired, issuers) == RETIRED_ROLE


def _open_to_devices(policy: Any, service: str) -> set[str]:
    methods = pb.DESCRIPTOR.services_by_name[service].methods
    return {
        m.name for m in methods if refusal(policy, f"/deniable.v1.{service}/{m.name}", NO_CERTIFICATE) is None
    }


def test_devices_reach_only_campaigns_submit_and_health() -> None:
    """Every RPC of both services, including any added later, is closed unless listed."""
    assert _open_to_devices(SHUFFLER, "Shuffler") == {"GetCampaign", "SubmitReports"}
    assert _open_to_devices(AGGREGATOR, "Aggregator") == set()
    for method in HEALTH_METHODS:
        assert refusal(SHUFFLER, method, NO_CERTIFICATE) is None
        assert refusal(AGGREGATOR, method, NO_CERTIFICATE) is None


WRONG = (grpc.StatusCode.PERMISSION_DENIED, "wrong_role")


def test_roles_per_method_and_default_deny() -> None:
    """Ingest for the shuffler only; campaign reads for the shuffler and the aggregator's operator;
    every other aggregator RPC for ``aggregator-operator`` only, every other shuffler RPC for
    ``shuffler-operator`` only; the removed ``operator`` role and foreign-CA roles nowhere."""
    agg = "/deniable.v1.Aggregator/"
    assert refusal(AGGREGATOR, agg + "IngestBatch", "shuffler") is None
    for role in ("aggregator-operator", "shuffler-operator", "device", "aggregator", "operator"):
        assert refusal(AGGREGATOR, agg + "IngestBatch", role) == WRONG
    for method in ("GetCampaign", "ListCampaigns"):
        assert refusal(AGGREGATOR, agg + method, "shuffler") is None
        assert refusal(AGGREGATOR, agg + method, "aggregator-operator") is None
        for role in ("device", "shuffler-operator"):
            assert refusal(AGGREGATOR, agg + method, role) == WRONG
    operator_rpcs = (
        "CreateCampaign",
        "BinarySum",
        "Histogram",
        "ListKeys",
        "CloseCampaign",
        "DeleteCampaign",
    )
    for method in (*operator_rpcs, "ReleaseBelowNMin", "DestroyKey", "Future"):
        assert refusal(AGGREGATOR, agg + method, "aggregator-operator") is None
        for role in ("shuffler", "shuffler-operator", "device", "aggregator"):
            assert refusal(AGGREGATOR, agg + method, role) == WRONG, (method, role)
        assert refusal(AGGREGATOR, agg + method, NO_ROLE) == (grpc.StatusCode.UNAUTHENTICATED, "no_role")
        assert refusal(AGGREGATOR, agg + method, RETIRED_ROLE) == (
            grpc.StatusCode.UNAUTHENTICATED,
            "retired_role",
        )
        assert refusal(AGGREGATOR, agg + method, WRONG_ISSUER) == (
            grpc.StatusCode.UNAUTHENTICATED,
            "wrong_issuer",
        )
    shuf = "/deniable.v1.Shuffler/"
    for method in ("Flush", "Stats", "ListCampaigns", "SomethingNew"):
        assert refusal(SHUFFLER, shuf + method, NO_CERTIFICATE) == (
            grpc.StatusCode.UNAUTHENTICATED,
            "no_certificate",
        )
        for role in ("device", "aggregator-operator", "aggregator", "shuffler"):
            assert refusal(SHUFFLER, shuf + method, role) == WRONG
        assert refusal(SHUFFLER, shuf + method, "shuffler-operator") is None


def test_tls_configuration_errors_are_one_line(tmp_path: Path) -> None:
    out = write_dev_certs(tmp_path)
    with pytest.raises(ConfigurationError, match="needs its key"):
        ClientTls(ca=out.ca("aggregator"), cert=out.cert("aggregator-operator"))
    with pytest.raises(ConfigurationError, match="cannot read"):
        ServerTls(tmp_path / "missing.pem", out.key("aggregator"), out.clients_ca("aggregator")).credentials(
            True
        )
    with pytest.raises(ConfigurationError, match="not a PEM"):
        (tmp_path / "junk.pem").write_text("junk")
        ServerTls(tmp_path / "junk.pem", out.key("aggregator"), out.clients_ca("aggregator")).credentials(
            True
        )
    with pytest.raises(ConfigurationError, match="--upstream-ca"):
        out.server_tls("shuffler").as_client(None)
    with pytest.raises(ConfigurationError, match="names its party"):
        _key, ca = make_ca(None)  # a CA naming no party: no role it issues could ever count
        (tmp_path / "unnamed.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
        ServerTls(out.cert("aggregator"), out.key("aggregator"), tmp_path / "unnamed.pem").issuers()


def test_a_certificate_naming_the_removed_operator_role_is_refused_with_a_clear_message(
    tmp_path: Path,
) -> None:
    key, ca = make_ca("aggregator")
    operator_key, operator = issue(key, ca, "operator")
    (tmp_path / "operator.pem").write_bytes(operator.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "operator.key").write_bytes(
        operator_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    (tmp_path / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    tls = ClientTls(ca=tmp_path / "ca.pem", cert=tmp_path / "operator.pem", key=tmp_path / "operator.key")
    with pytest.raises(ConfigurationError, match="'operator' role was removed"):
        tls.credentials()
    with pytest.raises(ConfigurationError, match="'operator' role was removed"):
        ServerTls(tmp_path / "operator.pem", tmp_path / "operator.key", tmp_path / "ca.pem").credentials(True)
