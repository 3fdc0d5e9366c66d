"""Who may use the console: a slow token hash (scrypt), sessions, CSRF tokens, the listen rule."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from deniable.core.errors import ConfigurationError

SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**15, 8, 1
"""scrypt cost: about 32 MiB and tens of milliseconds per try (RFC 7914 interactive-login range)."""


def hash_token(token: str, salt: bytes | None = None) -> str:
    """``scrypt$N$r$p$salt$hash`` (hex) of ``token``: the only form a login is ever stored in."""
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.scrypt(
        token.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, maxmem=64 * 2**20, dklen=32
    )
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${salt.hex()}${digest.hex()}"


def verify_token(token: str, stored: str) -> bool:
    """Whether ``token`` matches the stored hash (constant-time compare; False on a malformed hash)."""
    parts = stored.strip().split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        return False
    try:
        n, r, p = int(parts[1]), int(parts[2]), int(parts[3])
        salt, expected = bytes.fromhex(parts[4]), bytes.fromhex(parts[5])
        digest = hashlib.scrypt(
            token.encode(), salt=salt, n=n, r=r, p=p, maxmem=64 * 2**20, dklen=len(expected)
        )
    except ValueError:
        return False
    return hmac.compare_digest(digest, expected)


def read_hash_file(path: Path) -> str:
    """The stored hash in ``path`` (ConfigurationError, one line, if it is not one)."""
    text = path.read_text(encoding="utf-8").strip()
    if not text.startswith("scrypt$") or text.count("$") != 5:
        raise ConfigurationError(f"{path} holds no scrypt hash: make one with `deniable console hash-token`")
    return text


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_listen(host: str, https: bool, login: bool) -> None:
    """ConfigurationError unless ``host`` is loopback, or the console has both TLS and a login."""
    if is_loopback(host) or (https and login):
        return
    missing = " and ".join(
        what
        for what, given in (("TLS (--https-cert/--https-key)", https), ("a login (--login-hash-file)", login))
        if not given
    )
    raise ConfigurationError(
        f"refusing to listen on {host} (not loopback) without {missing}:"
        " operators' data would be open to the network"
    )


@dataclass
class Sessions:
    """Sessions by random id, the logged-in ones, and CSRF tokens bound to a session by an HMAC."""

    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    logged_in: set[str] = field(default_factory=set)

    def new_id(self) -> str:
        """A fresh unguessable session id (the cookie's value)."""
        return secrets.token_urlsafe(32)

    def csrf(self, session: str) -> str:
        """The synchronizer token of ``session``: HMAC-SHA256 under this process's secret."""
        return hmac.new(self.secret, b"csrf:" + session.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, session: str | None, token: str | None) -> bool:
        """Whether a form's token belongs to the request's session."""
        if not session or not token:
            return False
        return hmac.compare_digest(self.csrf(session), token)
