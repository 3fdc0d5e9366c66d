"""Development certificates: one CA per party and a certificate per role (``deniable certs dev``).

The shuffler's CA (``shuffler-ca.pem``) issues ``shuffler`` (server and client auth) and
``shuffler-operator`` (client auth only); the aggregator's CA (``aggregator-ca.pem``) issues
``aggregator`` (server auth; client auth for its own readiness probe and NATS consumer) and
``aggregator-operator`` (client auth only); the device CA
(``device-ca.pem``, on request) issues ``device`` (client auth only). A client trusts only its
peer party's CA, so it reaches nothing but that party's serving role (ADR 0030).

The role of a certificate is a SAN URI ``spiffe://deniable/<role>`` (``ROLE_URI_PREFIX``); a CA
names its party with ``spiffe://deniable/ca/<party>`` (``CA_URI_PREFIX``). Services read the role
of a verified peer certificate and accept it only from a CA of that role's party
(``deniable.core.plumbing.tls.peer_role``). These certificates are for development and tests:
production deployments issue their own from their PKI with the same URI SANs (docs/security.md).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from deniable.core.errors import ConfigurationError
from deniable.core.plumbing.tls import (
    CA_URI_PREFIX,
    PARTY_OF,
    ROLE_URI_PREFIX,
    ROLES,
    ClientTls,
    ServerTls,
    role_of,
)

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

DEV_ROLES: Final = ("aggregator", "aggregator-operator", "shuffler", "shuffler-operator")
"""The certificates ``deniable certs dev`` writes (a device certificate only on request)."""
SERVING_ROLES: Final = ("aggregator", "shuffler")
"""Roles whose certificates serve TLS (and so name hosts)."""
MQTT_BROKER: Final = "mqtt-broker"
"""The shuffler party's MQTT broker: a server certificate from the shuffler's CA (devices trust
only that CA) naming only the broker's hosts; no service accepts it as a role."""
USAGES: Final = {
    "shuffler": (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH),
    "aggregator": (ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH),
    "shuffler-operator": (ExtendedKeyUsageOID.CLIENT_AUTH,),
    "aggregator-operator": (ExtendedKeyUsageOID.CLIENT_AUTH,),
    "device": (ExtendedKeyUsageOID.CLIENT_AUTH,),
    MQTT_BROKER: (ExtendedKeyUsageOID.SERVER_AUTH,),
}
"""Each role's extended key usages: only the serving roles may serve; the shuffler is also the
aggregator's client, the aggregator a client of its own health port and of NATS (its role is
allowed nothing else anywhere, and no shuffler port trusts the aggregator's CA)."""
CLIENT_CAS: Final = {"aggregator": ("aggregator", "shuffler"), "shuffler": ("shuffler", "device")}
"""Whose CAs each service accepts client certificates from (its ``--tls-ca`` bundle)."""
DEFAULT_HOSTS: Final = ("localhost", "127.0.0.1", "::1")
VALID_DAYS: Final = 825


@dataclass(frozen=True)
class DevCerts:
    """Paths of what ``write_dev_certs`` wrote: each party's CA, each service's client-CA bundle,
    and each role's certificate and key."""

    directory: Path

    def ca(self, party: str) -> Path:
        """The CA certificate of ``party`` (``shuffler``, ``aggregator``, ``device``)."""
        return self.directory / f"{party}-ca.pem"

    def clients_ca(self, service: str) -> Path:
        """The bundle of CAs ``service`` accepts client certificates from (its ``--tls-ca``)."""
        return self.directory / f"{service}-clients-ca.pem"

    def cert(self, role: str) -> Path:
        """The certificate of ``role``."""
        return self.directory / f"{role}.pem"

    def key(self, role: str) -> Path:
        """The private key of ``role`` (mode 0600)."""
        return self.directory / f"{role}.key"

    def server_tls(self, service: str) -> ServerTls:
        """How ``service`` (``aggregator`` or ``shuffler``) serves with these certificates."""
        return ServerTls(self.cert(service), self.key(service), self.clients_ca(service))

    def client_tls(self, peer: str, role: str | None = None) -> ClientTls:
        """A client of ``peer`` (trusting only that party's CA), as ``role`` if given."""
        if role is None:
            return ClientTls(ca=self.ca(peer))
        return ClientTls(ca=self.ca(peer), cert=self.cert(role), key=self.key(role))


def _name(common_name: str, role: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Deniable development")]
    if role is not None:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role))
    attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attributes)


def _san(hosts: Sequence[str], uri: str) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(uri)]
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
    party: str | None = None, common_name: str | None = None
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed CA key and certificate (P-256, path length 0) naming ``party`` (its SAN URI
    ``spiffe://deniable/ca/<party>``; None: a CA naming no party, whose roles no service accepts)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name or f"Deniable development {party or 'unnamed'} CA")
    builder = _builder(name, name, key.public_key())
    if party is not None:
        builder = builder.add_extension(_san((), CA_URI_PREFIX + party), critical=False)
    cert = (
        builder.add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
    usages: Sequence[x509.ObjectIdentifier] | None = None,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A key and a certificate for ``role`` (its SAN URI) with that role's usages (``USAGES``).

    Unknown roles (client auth) and other ``usages`` are accepted here only so that tests can mint
    the removed ``operator`` role and the old every-usage layout; ``write_dev_certs`` never does.
    """
    if role not in ROLES and role not in ("operator", MQTT_BROKER):
        raise ConfigurationError(f"unknown role {role!r}; one of {', '.join(ROLES)}")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(_name(f"deniable-{role}", role), ca_cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True
        )
        .add_extension(
            x509.ExtendedKeyUsage(list(usages or USAGES.get(role, (ExtendedKeyUsageOID.CLIENT_AUTH,)))),
            critical=False,
        )
        .add_extension(_san(hosts, ROLE_URI_PREFIX + role), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def write_dev_certs(
    directory: Path,
    hosts: Mapping[str, Sequence[str]] | None = None,
    roles: Sequence[str] = DEV_ROLES,
    mqtt_hosts: Sequence[str] = (),
) -> DevCerts:
    """Write each party's CA, each service's client-CA bundle and ``<role>.pem``/``<role>.key``
    (0600) for each role into ``directory``.

    A serving certificate (``aggregator``, ``shuffler``) names localhost, 127.0.0.1 and ::1 plus
    ``hosts[role]``; the others name no host (they never serve). With ``mqtt_hosts`` also
    ``mqtt-broker.pem``/``.key``: the broker's server certificate from the shuffler's CA. The CAs'
    private keys are not kept: nothing more can be issued under them, so a stolen directory mints
    no new roles.
    """
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(f"cannot write certificates to {directory}: {exc}") from exc
    out = DevCerts(directory)
    parties = sorted({PARTY_OF[role] for role in roles if role in PARTY_OF} | {"aggregator", "shuffler"})
    cas = {party: make_ca(party) for party in parties}
    for party, (_, ca_cert) in cas.items():
        out.ca(party).write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    for service, trusted in CLIENT_CAS.items():
        bundle = b"".join(out.ca(party).read_bytes() for party in trusted if party in cas)
        out.clients_ca(service).write_bytes(bundle)
    for role in roles:
        if role not in PARTY_OF:
            raise ConfigurationError(f"unknown role {role!r}; one of {', '.join(ROLES)}")
        named = [*DEFAULT_HOSTS, *(hosts or {}).get(role, ())] if role in SERVING_ROLES else []
        ca_key, ca_cert = cas[PARTY_OF[role]]
        key, cert = issue(ca_key, ca_cert, role, list(dict.fromkeys(named)))
        out.cert(role).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_private(out.key(role), _key_pem(key))
    if mqtt_hosts:
        key, cert = issue(*cas["shuffler"], MQTT_BROKER, list(dict.fromkeys(mqtt_hosts)))
        out.cert(MQTT_BROKER).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_private(out.key(MQTT_BROKER), _key_pem(key))
    return out
