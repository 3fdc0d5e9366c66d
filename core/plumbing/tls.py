"""TLS for every gRPC link: server and channel credentials from PEM files, and the peer's role.

Servers present a certificate; where the peer must authenticate (the aggregator, the shuffler's
operator port) they also require a client certificate from the configured CA. A peer's role is
the ``spiffe://deniable/<role>`` SAN URI of its verified certificate (``deniable.core.plumbing.certs``).
Plaintext exists only when asked for by name (``insecure=True``, ``--insecure``): for tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from cryptography import x509

from deniable.core.errors import ConfigurationError

if TYPE_CHECKING:
    import grpc
else:  # grpcio is the [grpc] extra: a device on HttpTransport uses ClientTls without it
    from deniable.core.lazy import LazyModule

    grpc = LazyModule("grpc", "gRPC needs grpcio: pip install 'deniable[grpc]'")

_ROLE_CACHE_SIZE: Final = 1024
ROLE_URI_PREFIX: Final = "spiffe://deniable/"
ROLES: Final = ("aggregator", "shuffler", "operator", "device")
NO_CERTIFICATE: Final = ""
"""``PeerRoles.role`` of a peer that presented no certificate."""
NO_ROLE: Final = "?"
"""``PeerRoles.role`` of a peer whose verified certificate names no (single, known) role."""


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
    """A service's certificate and key, and the CA its authenticated peers' certificates come from."""

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

    def as_client(self, upstream_ca: Path | None = None) -> ClientTls:
        """The same certificate used as a client certificate (the shuffler towards the aggregator)."""
        return ClientTls(ca=upstream_ca or self.ca, cert=self.cert, key=self.key)


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
        return grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=read_pem(self.key, "TLS key"),
            certificate_chain=read_pem(self.cert, "TLS certificate"),
        )


def _check_certificate(pem: bytes, path: Path) -> None:
    try:
        x509.load_pem_x509_certificate(pem)
    except ValueError:
        raise ConfigurationError(f"the TLS certificate {path} is not a valid certificate") from None


def open_channel(address: str, tls: ClientTls | None = None, *, insecure: bool = False) -> grpc.aio.Channel:
    """A channel that verifies the server (``tls``, default: gRPC's roots); plaintext only if ``insecure``."""
    from deniable.core.plumbing.service import CHANNEL_OPTIONS  # imports grpcio

    if insecure:
        if tls is not None:
            raise ConfigurationError("choose TLS or insecure, not both")
        return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
    return grpc.aio.secure_channel(address, (tls or ClientTls()).credentials(), options=CHANNEL_OPTIONS)


def role_of(cert: x509.Certificate) -> str | None:
    """The role a certificate's SAN URI names, or None if it names none (or several)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    roles = {
        uri[len(ROLE_URI_PREFIX) :]
        for uri in san.get_values_for_type(x509.UniformResourceIdentifier)
        if uri.startswith(ROLE_URI_PREFIX)
    }
    if len(roles) != 1:
        return None
    (role,) = roles
    return role if role in ROLES else None


class PeerRoles:
    """The role of a peer from its verified certificate, cached by certificate (bounded)."""

    def __init__(self) -> None:
        self._cache: dict[bytes, str] = {}

    def role(self, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        """The peer's role, ``NO_ROLE`` for a certificate without one, ``NO_CERTIFICATE`` for none."""
        pems = list(context.auth_context().get("x509_pem_cert", ()))
        if not pems:
            return NO_CERTIFICATE
        pem = pems[0]
        if pem not in self._cache:
            if len(self._cache) >= _ROLE_CACHE_SIZE:
                self._cache.clear()
            try:
                self._cache[pem] = role_of(x509.load_pem_x509_certificate(pem)) or NO_ROLE
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
