"""Development certificates: one CA and a certificate per role (``deniable certs dev``).

The role of a certificate is a SAN URI ``spiffe://deniable/<role>`` (``ROLE_URI_PREFIX``); the
services read it from the verified peer certificate (``deniable.core.plumbing.tls.role_of``) to decide
which RPCs the peer may call.
These certificates are for development and tests: production deployments issue their own from
their PKI with the same URI SANs (docs/security.md).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from deniable.core.errors import ConfigurationError
from deniable.core.plumbing.tls import ROLE_URI_PREFIX, ROLES, role_of

__all__ = [
    "DEV_ROLES",
    "ROLES",
    "ROLE_URI_PREFIX",
    "DevCerts",
    "issue",
    "make_ca",
    "role_of",
    "write_dev_certs",
]

DEV_ROLES: Final = ("aggregator", "shuffler", "operator")
"""The certificates ``deniable certs dev`` writes (a device certificate only on request)."""
DEFAULT_HOSTS: Final = ("localhost", "127.0.0.1", "::1")
VALID_DAYS: Final = 825


@dataclass(frozen=True)
class DevCerts:
    """Paths of what ``write_dev_certs`` wrote: the CA and each role's certificate and key."""

    directory: Path

    @property
    def ca(self) -> Path:
        """The CA certificate every party trusts."""
        return self.directory / "ca.pem"

    def cert(self, role: str) -> Path:
        """The certificate of ``role``."""
        return self.directory / f"{role}.pem"

    def key(self, role: str) -> Path:
        """The private key of ``role`` (mode 0600)."""
        return self.directory / f"{role}.key"


def _name(common_name: str, role: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Deniable development")]
    if role is not None:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role))
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _san(hosts: Sequence[str], role: str) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(ROLE_URI_PREFIX + role)]
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` readable by the owner only (created 0600, never world-readable in between)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(path, 0o600)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _builder(
    subject: x509.Name, issuer: x509.Name, public: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
    )


def make_ca(
    common_name: str = "Deniable development CA",
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed CA key and certificate (P-256, path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name)
    cert = (
        _builder(name, name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def issue(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    role: str,
    hosts: Sequence[str] = DEFAULT_HOSTS,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A key and a certificate for ``role`` (its SAN URI), valid as TLS server and client."""
    if role not in ROLES:
        raise ConfigurationError(f"unknown role {role!r}; one of {', '.join(ROLES)}")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(_name(f"deniable-{role}", role), ca_cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(_san(hosts, role), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def write_dev_certs(directory: Path, hosts: Sequence[str] = (), roles: Sequence[str] = DEV_ROLES) -> DevCerts:
    """Write ``ca.pem`` and ``<role>.pem``/``<role>.key`` (0600) for each role into ``directory``.

    Every certificate names localhost, 127.0.0.1 and ::1 plus ``hosts``. The CA's private key is
    not kept: nothing more can be issued under this CA, so a stolen directory mints no new roles.
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(f"cannot write certificates to {directory}: {exc}") from exc
    all_hosts = list(dict.fromkeys([*DEFAULT_HOSTS, *hosts]))
    ca_key, ca_cert = make_ca()
    out = DevCerts(directory)
    out.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    for role in roles:
        key, cert = issue(ca_key, ca_cert, role, all_hosts)
        out.cert(role).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_private(out.key(role), _key_pem(key))
    return out
