"""Seal and open one report with HPKE base mode, X25519 / HKDF-SHA256 / ChaCha20-Poly1305.

``info`` binds the campaign id and key id, so a ciphertext moved to another campaign or
relabelled with another key id fails to open.
"""

from __future__ import annotations

import functools
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

SUITE_NAME: Final = "X25519-HKDF-SHA256-CHACHA20POLY1305"
HPKE_OVERHEAD: Final = 48  # 32-byte encapsulated key + 16-byte Poly1305 tag
_SUITE: Final = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)
_INFO_PREFIX: Final = b"deniable/v1/report"


@functools.lru_cache(maxsize=64)
def _public_key_object(raw: bytes) -> X25519PublicKey:
    """Parsed public key, cached: parsing costs a third of a seal."""
    return X25519PublicKey.from_public_bytes(raw)


@functools.lru_cache(maxsize=64)
def _private_key_object(raw: bytes) -> X25519PrivateKey:
    """Parsed private key, cached: parsing costs a third of an open."""
    return X25519PrivateKey.from_private_bytes(raw)


class DecryptionError(Exception):
    """The ciphertext did not open under this key, campaign and key id."""


def envelope_info(campaign_id: str, key_id: int) -> bytes:
    """HPKE ``info``: an unambiguous encoding of the context the report belongs to."""
    campaign = campaign_id.encode("utf-8")
    return _INFO_PREFIX + len(campaign).to_bytes(2, "big") + campaign + key_id.to_bytes(4, "big")


def ciphertext_length(plaintext_length: int) -> int:
    """Exact sealed size for a plaintext of ``plaintext_length`` bytes."""
    return plaintext_length + HPKE_OVERHEAD


@dataclass(frozen=True)
class PublicKey:
    """An aggregator public key as devices see it."""

    key_id: int
    raw: bytes

    def __post_init__(self) -> None:
        if len(self.raw) != 32:
            raise ValueError("an X25519 public key is 32 bytes")
        if not 0 <= self.key_id < 2**32:
            raise ValueError("key id must fit in 32 bits")

    def _key(self) -> X25519PublicKey:
        return _public_key_object(self.raw)


@dataclass(frozen=True)
class KeyPair:
    """An aggregator key pair with its id. The private half never leaves the aggregator."""

    key_id: int
    private_raw: bytes

    @classmethod
    def generate(cls, key_id: int) -> KeyPair:
        """A fresh key pair from the OS random source."""
        from cryptography.hazmat.primitives.serialization import NoEncryption, PrivateFormat

        raw = X25519PrivateKey.generate().private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
        return cls(key_id=key_id, private_raw=raw)

    @property
    def public(self) -> PublicKey:
        """The public half, for campaign descriptions."""
        raw = self._private().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return PublicKey(key_id=self.key_id, raw=raw)

    def _private(self) -> X25519PrivateKey:
        return _private_key_object(self.private_raw)

    def save(self, path: Path) -> None:
        """Write the private key to ``path`` readable by its owner only (mode 0600)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, self.private_raw)
            os.fsync(fd)
        finally:
            os.close(fd)

    @classmethod
    def load(cls, path: Path, key_id: int) -> KeyPair:
        """Read a private key, refusing files that others can read or write."""
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise PermissionError(f"private key {path} is accessible to others (mode {oct(mode & 0o777)})")
        raw = path.read_bytes()
        if len(raw) != 32:
            raise ValueError(f"private key {path} is not a 32-byte X25519 key")
        return cls(key_id=key_id, private_raw=raw)


def seal_report(plaintext: bytes, public_key: PublicKey, campaign_id: str) -> bytes:
    """Encrypt one padded plaintext to the aggregator key named in ``public_key``."""
    return _SUITE.encrypt(plaintext, public_key._key(), info=envelope_info(campaign_id, public_key.key_id))


def open_report(ciphertext: bytes, key_pair: KeyPair, campaign_id: str) -> bytes:
    """Decrypt one report; raises ``DecryptionError`` for anything that does not authenticate."""
    try:
        return _SUITE.decrypt(
            ciphertext, key_pair._private(), info=envelope_info(campaign_id, key_pair.key_id)
        )
    except (InvalidTag, ValueError) as exc:
        raise DecryptionError(str(exc) or type(exc).__name__) from exc
