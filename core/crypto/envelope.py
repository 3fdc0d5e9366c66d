"""Seal and open one report with HPKE base mode: X25519 (default) or ML-KEM-768 + X25519 hybrid,
both with HKDF-SHA256 / ChaCha20-Poly1305.

``info`` binds the campaign id, key id and the campaign's incarnation, so a ciphertext moved to
another campaign, relabelled with another key id or replayed into a later life of the same id
fails to open. A key's KEM follows from its raw length.

With ``cryptography`` (every service) its HPKE seals and opens; on the bare device SDK (PyNaCl,
ADR 0039) X25519 goes through ``hpke_base`` (the same bytes) and the hybrid suite is refused with
an error naming the extra that brings it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from deniable.core import primitives
from deniable.core.crypto import hpke_base
from deniable.core.crypto.keyfile import check_private_file, write_private_file

if TYPE_CHECKING:
    from cryptography.hazmat.primitives import hpke
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

KEM_X25519: Final = "x25519"
KEM_HYBRID: Final = "x25519-mlkem768"
SUITE_NAME: Final = "X25519-HKDF-SHA256-CHACHA20POLY1305"
HYBRID_SUITE_NAME: Final = "MLKEM768X25519-HKDF-SHA256-CHACHA20POLY1305"
HPKE_OVERHEAD: Final = 48  # 32-byte encapsulated key + 16-byte Poly1305 tag
HYBRID_NEEDS: Final = (
    "the hybrid ML-KEM suite needs the cryptography backend: pip install cryptography"
    " (or deniable[server]); the bare SDK on PyNaCl seals X25519 only (ADR 0039)"
)
_INFO_PREFIX: Final = b"deniable/v1/report"
_MLKEM_PUBLIC: Final = 1184
_MLKEM_SEED: Final = 64


@dataclass(frozen=True)
class Kem:
    """One supported KEM: its names and sizes (raw keys as stored and published)."""

    name: str
    suite_name: str
    public_length: int
    private_length: int
    overhead: int

    @property
    def suite(self) -> hpke.Suite:
        """cryptography's HPKE suite for this KEM (imports cryptography: the services' backend)."""
        return _suite(self.name)


@functools.cache
def _suite(name: str) -> hpke.Suite:
    """The cryptography HPKE suite of KEM ``name``, built once."""
    from cryptography.hazmat.primitives import hpke

    kem = hpke.KEM.X25519 if name == KEM_X25519 else hpke.KEM.MLKEM768_X25519
    return hpke.Suite(kem, hpke.KDF.HKDF_SHA256, hpke.AEAD.CHACHA20_POLY1305)


KEMS: Final = {
    KEM_X25519: Kem(KEM_X25519, SUITE_NAME, 32, 32, HPKE_OVERHEAD),
    KEM_HYBRID: Kem(
        KEM_HYBRID,
        HYBRID_SUITE_NAME,
        _MLKEM_PUBLIC + 32,  # ML-KEM-768 encapsulation key || X25519 public key
        _MLKEM_SEED + 32,  # ML-KEM-768 seed (d || z) || X25519 private key
        1120 + 16,  # ML-KEM ciphertext 1088 + X25519 share 32, Poly1305 tag
    ),
}


def kem_named(name: str) -> Kem:
    """The KEM called ``name`` ("" means x25519); ValueError naming the choices otherwise."""
    try:
        return KEMS[name or KEM_X25519]
    except KeyError:
        raise ValueError(f"unknown KEM {name!r}: use one of {', '.join(KEMS)}") from None


def kem_for_suite(suite_name: str) -> Kem:
    """The KEM of an HPKE suite name as campaigns carry it; ValueError if unsupported."""
    for kem in KEMS.values():
        if kem.suite_name == suite_name:
            return kem
    raise ValueError(f"unsupported HPKE suite {suite_name!r}")


def _kem_of(raw: bytes, public: bool) -> Kem:
    """The KEM whose raw public (or private) keys have this length."""
    for kem in KEMS.values():
        if len(raw) == (kem.public_length if public else kem.private_length):
            return kem
    what = "public" if public else "private"
    raise ValueError(f"a {len(raw)}-byte {what} key fits no supported KEM")


def _with_cryptography(kem: Kem) -> bool:
    """Whether this KEM goes through cryptography's HPKE now; the hybrid needs it (refused otherwise)."""
    if primitives.active() == primitives.CRYPTOGRAPHY:
        return True
    if kem.name == KEM_HYBRID:
        raise ValueError(HYBRID_NEEDS)
    return False


@functools.lru_cache(maxsize=64)
def _public_key_object(raw: bytes) -> X25519PublicKey | hpke.MLKEM768X25519PublicKey:
    """Parsed public key, cached: parsing costs a third of a seal."""
    from cryptography.hazmat.primitives import hpke
    from cryptography.hazmat.primitives.asymmetric.mlkem import MLKEM768PublicKey
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

    if len(raw) == 32:
        return X25519PublicKey.from_public_bytes(raw)
    return hpke.MLKEM768X25519PublicKey(
        MLKEM768PublicKey.from_public_bytes(raw[:_MLKEM_PUBLIC]),
        X25519PublicKey.from_public_bytes(raw[_MLKEM_PUBLIC:]),
    )


@functools.lru_cache(maxsize=64)
def _private_key_object(raw: bytes) -> X25519PrivateKey | hpke.MLKEM768X25519PrivateKey:
    """Parsed private key, cached: parsing costs a third of an open."""
    from cryptography.hazmat.primitives import hpke
    from cryptography.hazmat.primitives.asymmetric.mlkem import MLKEM768PrivateKey
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    if len(raw) == 32:
        return X25519PrivateKey.from_private_bytes(raw)
    return hpke.MLKEM768X25519PrivateKey(
        MLKEM768PrivateKey.from_seed_bytes(raw[:_MLKEM_SEED]),
        X25519PrivateKey.from_private_bytes(raw[_MLKEM_SEED:]),
    )


class DecryptionError(Exception):
    """The ciphertext did not open under this key, campaign and key id."""


def envelope_info(campaign_id: str, key_id: int, incarnation: bytes = b"") -> bytes:
    """HPKE ``info``: an unambiguous encoding of the context the report belongs to.

    A campaign with an incarnation appends ``len u8 || incarnation``; without one (descriptions
    older than incarnations) the info is unchanged, so the two can never collide.
    """
    campaign = campaign_id.encode("utf-8")
    info = _INFO_PREFIX + len(campaign).to_bytes(2, "big") + campaign + key_id.to_bytes(4, "big")
    if incarnation:
        if len(incarnation) > 255:
            raise ValueError("an incarnation is at most 255 bytes")
        info += len(incarnation).to_bytes(1, "big") + incarnation
    return info


def ciphertext_length(plaintext_length: int, suite_name: str = SUITE_NAME) -> int:
    """Exact sealed size for a plaintext of ``plaintext_length`` bytes under ``suite_name``."""
    return plaintext_length + kem_for_suite(suite_name).overhead


@dataclass(frozen=True)
class PublicKey:
    """An aggregator public key as devices see it."""

    key_id: int
    raw: bytes

    def __post_init__(self) -> None:
        _kem_of(self.raw, public=True)
        if not 0 <= self.key_id < 2**32:
            raise ValueError("key id must fit in 32 bits")

    @property
    def kem(self) -> Kem:
        """The KEM this key belongs to."""
        return _kem_of(self.raw, public=True)

    def _key(self) -> X25519PublicKey | hpke.MLKEM768X25519PublicKey:
        return _public_key_object(self.raw)


@dataclass(frozen=True)
class KeyPair:
    """An aggregator key pair with its id. The private half never leaves the aggregator."""

    key_id: int
    private_raw: bytes

    def __post_init__(self) -> None:
        _kem_of(self.private_raw, public=False)

    @classmethod
    def generate(cls, key_id: int, kem: str = KEM_X25519) -> KeyPair:
        """A fresh key pair of ``kem`` from the OS random source."""
        raw = primitives.x25519_private()
        if kem_named(kem).name == KEM_HYBRID:
            _with_cryptography(KEMS[KEM_HYBRID])
            from cryptography.hazmat.primitives.asymmetric.mlkem import MLKEM768PrivateKey

            raw = MLKEM768PrivateKey.generate().private_bytes_raw() + raw
        return cls(key_id=key_id, private_raw=raw)

    @property
    def kem(self) -> Kem:
        """The KEM this key belongs to."""
        return _kem_of(self.private_raw, public=False)

    @property
    def public(self) -> PublicKey:
        """The public half, for campaign descriptions."""
        raw = self.private_raw
        public = primitives.x25519_public(raw[-32:])
        if len(raw) > 32:
            _with_cryptography(self.kem)
            from cryptography.hazmat.primitives.asymmetric.mlkem import MLKEM768PrivateKey

            mlkem = MLKEM768PrivateKey.from_seed_bytes(raw[:_MLKEM_SEED]).public_key()
            public = mlkem.public_bytes_raw() + public
        return PublicKey(key_id=self.key_id, raw=public)

    def _private(self) -> X25519PrivateKey | hpke.MLKEM768X25519PrivateKey:
        return _private_key_object(self.private_raw)

    def save(self, path: Path) -> None:
        """Write the private key to ``path`` readable by its owner only (mode 0600)."""
        write_private_file(path, self.private_raw)

    @classmethod
    def load(cls, path: Path, key_id: int, trusted_group: int | None = None) -> KeyPair:
        """Read a private key, refusing files that others can read or write (core/crypto/keyfile.py)."""
        check_private_file(path, "private key", trusted_group)
        raw = path.read_bytes()
        _kem_of(raw, public=False)
        return cls(key_id=key_id, private_raw=raw)


def seal_report(plaintext: bytes, public_key: PublicKey, campaign_id: str, incarnation: bytes = b"") -> bytes:
    """Encrypt one padded plaintext to the aggregator key named in ``public_key``, bound to the
    campaign's id and ``incarnation``."""
    info = envelope_info(campaign_id, public_key.key_id, incarnation)
    if _with_cryptography(public_key.kem):
        return public_key.kem.suite.encrypt(plaintext, public_key._key(), info=info)
    return hpke_base.seal(public_key.raw, info, plaintext)


def open_report(ciphertext: bytes, key_pair: KeyPair, campaign_id: str, incarnation: bytes = b"") -> bytes:
    """Decrypt one report; raises ``DecryptionError`` for anything that does not authenticate."""
    info = envelope_info(campaign_id, key_pair.key_id, incarnation)
    use_cryptography = _with_cryptography(key_pair.kem)  # a refused hybrid is no DecryptionError
    try:
        if use_cryptography:
            from cryptography.exceptions import InvalidTag

            try:
                return key_pair.kem.suite.decrypt(ciphertext, key_pair._private(), info=info)
            except InvalidTag as exc:
                raise ValueError("InvalidTag") from exc
        return hpke_base.open_sealed(key_pair.private_raw, info, ciphertext)
    except ValueError as exc:
        raise DecryptionError(str(exc) or type(exc).__name__) from exc
