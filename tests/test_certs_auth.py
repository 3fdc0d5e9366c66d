"""Development certificates (roles in SAN URIs, 0600 keys) and the default-deny access policies."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509

from deniable.aggregator.server import ACCESS_POLICY as AGGREGATOR
from deniable.core.errors import ConfigurationError
from deniable.core.plumbing.auth import HEALTH_METHODS, refusal
from deniable.core.plumbing.certs import ROLE_URI_PREFIX, issue, make_ca, role_of, write_dev_certs
from deniable.core.plumbing.tls import NO_CERTIFICATE, NO_ROLE, ClientTls, PeerRoles, ServerTls
from deniable.shuffler.server import ACCESS_POLICY as SHUFFLER
from deniable.v1 import deniable_pb2 as pb


def test_dev_certs_name_their_role_and_hosts_and_keep_keys_private(tmp_path: Path) -> None:
    out = write_dev_certs(tmp_path / "certs", hosts=["shuffler.internal", "10.0.0.7"])
    ca = x509.load_pem_x509_certificate(out.ca.read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not (tmp_path / "certs" / "ca.key").exists()
    for role in ("aggregator", "shuffler", "operator"):
        cert = x509.load_pem_x509_certificate(out.cert(role).read_bytes())
        assert role_of(cert) == role
        assert cert.issuer == ca.subject
        ca.public_key().verify(  # type: ignore[call-arg, union-attr]
            cert.signature,
            cert.tbs_certificate_bytes,
            cert.signature_algorithm_parameters,  # type: ignore[arg-type]
        )
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert {"localhost", "shuffler.internal"} <= set(san.get_values_for_type(x509.DNSName))
        ips = set(san.get_values_for_type(x509.IPAddress))
        assert {ipaddress.ip_address(a) for a in ("127.0.0.1", "::1", "10.0.0.7")} <= ips
        assert stat.S_IMODE(out.key(role).stat().st_mode) == 0o600
    assert not out.cert("device").exists()


def test_a_certificate_names_one_known_role_or_none() -> None:
    ca_key, ca = make_ca()
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
    roles = PeerRoles()
    context: Any = _Context(out.cert("operator").read_bytes())
    assert roles.role(context) == "operator"
    assert roles.role(_Context(None)) == NO_CERTIFICATE  # type: ignore[arg-type]
    assert roles.role(_Context(out.ca.read_bytes())) == NO_ROLE  # type: ignore[arg-type]
    assert roles.role(_Context(b"not a certificate")) == NO_ROLE  # type: ignore[arg-type]


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


def test_roles_per_method_and_default_deny() -> None:
    agg = "/deniable.v1.Aggregator/"
    assert refusal(AGGREGATOR, agg + "IngestBatch", "shuffler") is None
    for role in ("operator", "device", "aggregator"):
        assert refusal(AGGREGATOR, agg + "IngestBatch", role) == (
            grpc.StatusCode.PERMISSION_DENIED,
            "wrong_role",
        )
    for method in ("GetCampaign", "ListCampaigns"):
        assert refusal(AGGREGATOR, agg + method, "shuffler") is None
        assert refusal(AGGREGATOR, agg + method, "operator") is None
        assert refusal(AGGREGATOR, agg + method, "device") is not None
    for method in ("CreateCampaign", "BinarySum", "Histogram", "ListKeys", "CloseCampaign", "Future"):
        assert refusal(AGGREGATOR, agg + method, "operator") is None
        assert refusal(AGGREGATOR, agg + method, "shuffler") == (
            grpc.StatusCode.PERMISSION_DENIED,
            "wrong_role",
        )
        assert refusal(AGGREGATOR, agg + method, NO_ROLE) == (grpc.StatusCode.UNAUTHENTICATED, "no_role")
    shuf = "/deniable.v1.Shuffler/"
    for method in ("Flush", "Stats", "ListCampaigns", "SomethingNew"):
        assert refusal(SHUFFLER, shuf + method, NO_CERTIFICATE) == (
            grpc.StatusCode.UNAUTHENTICATED,
            "no_certificate",
        )
        assert refusal(SHUFFLER, shuf + method, "device") is not None
        assert refusal(SHUFFLER, shuf + method, "operator") is None


def test_tls_configuration_errors_are_one_line(tmp_path: Path) -> None:
    out = write_dev_certs(tmp_path)
    with pytest.raises(ConfigurationError, match="needs its key"):
        ClientTls(ca=out.ca, cert=out.cert("operator"))
    with pytest.raises(ConfigurationError, match="cannot read"):
        ServerTls(tmp_path / "missing.pem", out.key("aggregator"), out.ca).credentials(True)
    with pytest.raises(ConfigurationError, match="not a PEM"):
        (tmp_path / "junk.pem").write_text("junk")
        ServerTls(tmp_path / "junk.pem", out.key("aggregator"), out.ca).credentials(True)
