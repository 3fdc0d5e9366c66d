"""TLS for every gRPC link: server and channel credentials from PEM files, and the peer's role.

Each party has its own CA (ADR 0030): the shuffler's CA issues ``shuffler`` and
``shuffler-operator``, the aggregator's ``aggregator`` and ``aggregator-operator``, the device
CA ``device``. A client trusts only the CA of the party it means to reach, and only the serving
role of that party carries the server-auth usage, so a device reaches nothing but a ``shuffler``
certificate and a shuffler nothing but an ``aggregator`` one. Servers accept client certificates
from a bundle of CAs; a peer's role is the ``spiffe://deniable/<role>`` SAN URI of its verified
certificate, and counts only when the certificate was issued directly by a CA of that role's party
(a CA names its party with the SAN URI ``spiffe://deniable/ca/<party>``).
Plaintext exists only when asked for by name (``insecure=True``, ``--insecure``): for tests.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from deniable.core.errors import ConfigurationError

if TYPE_CHECKING:
    import grpc
    from cryptography import exceptions as cryptography_exceptions
    from cryptography import x509
else:  # grpcio is the [grpc] extra: a device on HttpTransport uses ClientTls without it; so is
    # cryptography (certificate checks, ADR 0039): the bare SDK on PyNaCl has neither
    from deniable.core.lazy import LazyModule

    _CERTS_HINT = "certificate checks need cryptography: pip install 'deniable[grpc]' or deniable[server]"
    grpc = LazyModule("grpc", "gRPC needs grpcio: pip install 'deniable[grpc]'")
    x509 = LazyModule("cryptography.x509", _CERTS_HINT)
    cryptography_exceptions = LazyModule("cryptography.exceptions", _CERTS_HINT)

log = logging.getLogger("deniable.tls")
_ROLE_CACHE_SIZE: Final = 1024
ROLE_URI_PREFIX: Final = "spiffe://deniable/"
CA_URI_PREFIX: Final = "spiffe://deniable/ca/"
"""A CA's SAN URI naming the party whose roles it may issue (``spiffe://deniable/ca/shuffler``)."""
PARTY_OF: Final = {
    "device": "device",
    "shuffler": "shuffler",
    "shuffler-operator": "shuffler",
    "aggregator": "aggregator",
    "aggregator-operator": "aggregator",
}
"""Each role and the party (and so the CA) it belongs to."""
ROLES: Final = tuple(PARTY_OF)
PARTIES: Final = ("device", "shuffler", "aggregator")
RETIRED_ROLES: Final = {
    "operator": "the single 'operator' role was removed (ADR 0030): use an aggregator-operator"
    " or a shuffler-operator certificate (`deniable certs dev`, docs/security.md)"
}
NO_CERTIFICATE: Final = ""
"""``PeerRoles.role`` of a peer that presented no certificate."""
NO_ROLE: Final = "?"
"""``PeerRoles.role`` of a peer whose verified certificate names no (single, known) role."""
RETIRED_ROLE: Final = "?retired"
"""``PeerRoles.role`` of a peer whose certificate names a removed role (``operator``)."""
WRONG_ISSUER: Final = "?issuer"
"""``PeerRoles.role`` of a peer whose role was not issued by a CA of that role's party."""


def read_pem(path: Path, what: str) -> bytes:
    """The bytes of a PEM file; ConfigurationError (one line) if it cannot be read or is not PEM."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigurationError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None
    if b"-----BEGIN " not in data:
        raise ConfigurationError(f"the {what} {path} is not a PEM file")
    return data


@dataclass(frozen=True)
class ServerTls:
    """A service's certificate and key, and the CA bundle its clients' certificates come from.

    ``ca`` may hold several CAs (one per party whose roles may call); each must name its party
    (``CA_URI_PREFIX``) for the roles it issued to count.
    """

    cert: Path
    key: Path
    ca: Path

    def credentials(self, require_client_cert: bool) -> grpc.ServerCredentials:
        """Server credentials; with ``require_client_cert`` the handshake needs a cert from ``ca``."""
        pair = (read_pem(self.key, "TLS key"), read_pem(self.cert, "TLS certificate"))
        ca = read_pem(self.ca, "TLS CA")
        _check_certificate(pair[1], self.cert)
        return grpc.ssl_server_credentials(
            [pair], root_certificates=ca, require_client_auth=require_client_cert
        )

    def issuers(self) -> dict[str, tuple[x509.Certificate, ...]]:
        """The CAs of ``ca`` per party they name; ConfigurationError if none names one."""
        return issuers_by_party(read_pem(self.ca, "TLS CA"), self.ca)

    def as_client(self, upstream_ca: Path | None) -> ClientTls:
        """The same certificate as a client certificate (the shuffler towards the aggregator),
        trusting only ``upstream_ca``: the CA of the peer party, never this party's own bundle."""
        if upstream_ca is None:
            raise ConfigurationError(
                "TLS towards the aggregator needs --upstream-ca: the aggregator party's CA"
                " (aggregator-ca.pem), so that only the aggregator's certificate is accepted"
            )
        return ClientTls(ca=upstream_ca, cert=self.cert, key=self.key)


def issuers_by_party(bundle: bytes, where: Path | str) -> dict[str, tuple[x509.Certificate, ...]]:
    """The CA certificates of a PEM bundle grouped by the party each names (``CA_URI_PREFIX``)."""
    try:
        cas = x509.load_pem_x509_certificates(bundle)
    except ValueError:
        raise ConfigurationError(f"the TLS CA {where} holds no valid certificate") from None
    found: dict[str, list[x509.Certificate]] = {}
    for ca in cas:
        party = party_of_ca(ca)
        if party is None:
            log.warning("a CA in %s names no party (%s…): roles it issued are refused", where, CA_URI_PREFIX)
            continue
        found.setdefault(party, []).append(ca)
    if not found:
        raise ConfigurationError(
            f"no CA in {where} names its party ({CA_URI_PREFIX}<party>); make them with"
            " `deniable certs dev` or see docs/security.md"
        )
    return {party: tuple(cas) for party, cas in found.items()}


def party_of_ca(ca: x509.Certificate) -> str | None:
    """The party a CA certificate names with its SAN URI, or None (none, several, unknown)."""
    parties = {uri[len(CA_URI_PREFIX) :] for uri in _uris(ca) if uri.startswith(CA_URI_PREFIX)}
    if len(parties) != 1:
        return None
    (party,) = parties
    return party if party in PARTIES else None


@dataclass(frozen=True)
class ClientTls:
    """How a client verifies the server (``ca``, or gRPC's default roots when None) and proves itself."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ConfigurationError("a client certificate needs its key (--tls-cert and --tls-key together)")

    def credentials(self) -> grpc.ChannelCredentials:
        """Channel credentials that verify the server and, with a cert, authenticate the client."""
        ca = None if self.ca is None else read_pem(self.ca, "TLS CA")
        if self.cert is None or self.key is None:
            return grpc.ssl_channel_credentials(root_certificates=ca)
        chain = read_pem(self.cert, "TLS certificate")
        _check_certificate(chain, self.cert)
        return grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=read_pem(self.key, "TLS key"), certificate_chain=chain
        )


class Plaintext:
    """The explicit choice of a plaintext client link (``--insecure``): the only value that makes
    an operator call unencrypted (``deniable.admin.rpc.call``); a missing TLS setting never does."""

    def __repr__(self) -> str:
        return "INSECURE"


INSECURE: Final = Plaintext()
Transport = ClientTls | Plaintext
"""How an operator command reaches a service: TLS, or plaintext chosen by name."""


def _check_certificate(pem: bytes, path: Path) -> None:
    """ConfigurationError if ``pem`` is not a certificate or names a removed role."""
    try:
        cert = x509.load_pem_x509_certificate(pem)
    except ValueError:
        raise ConfigurationError(f"the TLS certificate {path} is not a valid certificate") from None
    named = named_role(cert)
    if named in RETIRED_ROLES:
        raise ConfigurationError(f"the TLS certificate {path}: {RETIRED_ROLES[named]}")


def open_channel(address: str, tls: ClientTls | None = None, *, insecure: bool = False) -> grpc.aio.Channel:
    """A channel that verifies the server (``tls``, default: gRPC's roots); plaintext only if ``insecure``."""
    from deniable.core.plumbing.service import CHANNEL_OPTIONS  # imports grpcio

    if insecure:
        if tls is not None:
            raise ConfigurationError("choose TLS or insecure, not both")
        return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
    return grpc.aio.secure_channel(address, (tls or ClientTls()).credentials(), options=CHANNEL_OPTIONS)


def _uris(cert: x509.Certificate) -> list[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return list(san.get_values_for_type(x509.UniformResourceIdentifier))


def named_role(cert: x509.Certificate) -> str | None:
    """The one role a certificate's SAN URI names, known or not (None: none or several)."""
    roles = {
        uri[len(ROLE_URI_PREFIX) :]
        for uri in _uris(cert)
        if uri.startswith(ROLE_URI_PREFIX) and not uri.startswith(CA_URI_PREFIX)
    }
    if len(roles) != 1:
        return None
    (role,) = roles
    return role


def role_of(cert: x509.Certificate) -> str | None:
    """The role a certificate's SAN URI names, or None if it names none, several or a removed one."""
    role = named_role(cert)
    return role if role in ROLES else None


def peer_role(cert: x509.Certificate, issuers: Mapping[str, tuple[x509.Certificate, ...]]) -> str:
    """The role of a verified peer certificate, or why it has none (``NO_ROLE``, ``RETIRED_ROLE``,
    ``WRONG_ISSUER``): a role counts only if a CA of its own party issued the certificate."""
    named = named_role(cert)
    if named in RETIRED_ROLES:
        return RETIRED_ROLE
    role = role_of(cert)
    if role is None:
        return NO_ROLE
    for ca in issuers.get(PARTY_OF[role], ()):
        try:
            cert.verify_directly_issued_by(ca)
        except (ValueError, TypeError, cryptography_exceptions.InvalidSignature):
            continue
        return role
    return WRONG_ISSUER


class PeerRoles:
    """The role of a peer from its verified certificate, cached by certificate (bounded)."""

    def __init__(self, issuers: Mapping[str, tuple[x509.Certificate, ...]]) -> None:
        """``issuers``: the CAs of each party (``ServerTls.issuers``); roles of others are refused."""
        self._issuers = issuers
        self._cache: dict[bytes, str] = {}

    def role(self, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        """The peer's role, else ``NO_CERTIFICATE``, ``NO_ROLE``, ``RETIRED_ROLE`` or ``WRONG_ISSUER``."""
        pems = list(context.auth_context().get("x509_pem_cert", ()))
        if not pems:
            return NO_CERTIFICATE
        pem = pems[0]
        if pem not in self._cache:
            if len(self._cache) >= _ROLE_CACHE_SIZE:
                self._cache.clear()
            try:
                self._cache[pem] = peer_role(x509.load_pem_x509_certificate(pem), self._issuers)
            except ValueError:
                self._cache[pem] = NO_ROLE
        return self._cache[pem]


def check_transport(tls: ServerTls | None, insecure: bool, service: str) -> None:
    """One line for a service configured with neither TLS nor an explicit ``insecure``, or both."""
    if tls is None and not insecure:
        raise ConfigurationError(
            f"the {service} needs --tls-cert, --tls-key and --tls-ca"
            " (or --insecure for plaintext, tests only)"
        )
    if tls is not None and insecure:
        raise ConfigurationError(f"the {service} got TLS files and --insecure: choose one")
