"""HPKE base mode (RFC 9180) for one suite, DHKEM(X25519, HKDF-SHA256), HKDF-SHA256,
ChaCha20Poly1305, single-shot, over ``deniable.core.primitives`` (ADR 0039).

The envelope uses it where cryptography's HPKE is absent (the bare device SDK on PyNaCl); on
either backend it gives the bytes cryptography's HPKE gives (tests/core/test_crypto_backends.py
checks RFC 9180 A.2.1 and both directions). HKDF is HMAC-SHA256 from the standard library.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Final

from deniable.core import primitives

_KEM_ID: Final = 0x0020
_KDF_ID: Final = 0x0001
_AEAD_ID: Final = 0x0003
_KEM_SUITE: Final = b"KEM" + _KEM_ID.to_bytes(2, "big")
_HPKE_SUITE: Final = b"HPKE" + b"".join(i.to_bytes(2, "big") for i in (_KEM_ID, _KDF_ID, _AEAD_ID))
_MODE_BASE: Final = b"\x00"
ENC_LENGTH: Final = 32
TAG_LENGTH: Final = 16
_HASH_LENGTH: Final = 32


def _extract(salt: bytes, ikm: bytes) -> bytes:
    """HKDF-Extract (RFC 5869) with SHA-256; an empty salt is HMAC's all-zero key."""
    return hmac.new(salt, ikm, hashlib.sha256).digest()


def _expand(prk: bytes, info: bytes, length: int) -> bytes:
    """HKDF-Expand (RFC 5869) with SHA-256, ``length`` <= 255 * 32 bytes."""
    out, block, counter = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        out += block
        counter += 1
    return out[:length]


def labeled_extract(suite: bytes, salt: bytes, label: bytes, ikm: bytes) -> bytes:
    """RFC 9180 LabeledExtract."""
    return _extract(salt, b"HPKE-v1" + suite + label + ikm)


def labeled_expand(suite: bytes, prk: bytes, label: bytes, info: bytes, length: int) -> bytes:
    """RFC 9180 LabeledExpand."""
    return _expand(prk, length.to_bytes(2, "big") + b"HPKE-v1" + suite + label + info, length)


def _shared_secret(dh: bytes, enc: bytes, recipient_public: bytes) -> bytes:
    """DHKEM's ExtractAndExpand over ``enc || pkR``."""
    prk = labeled_extract(_KEM_SUITE, b"", b"eae_prk", dh)
    return labeled_expand(_KEM_SUITE, prk, b"shared_secret", enc + recipient_public, _HASH_LENGTH)


def _key_schedule(shared_secret: bytes, info: bytes) -> tuple[bytes, bytes]:
    """Base mode KeySchedule (no PSK): the AEAD key and base nonce (sequence 0 uses it as is)."""
    psk_id_hash = labeled_extract(_HPKE_SUITE, b"", b"psk_id_hash", b"")
    info_hash = labeled_extract(_HPKE_SUITE, b"", b"info_hash", info)
    context = _MODE_BASE + psk_id_hash + info_hash
    secret = labeled_extract(_HPKE_SUITE, shared_secret, b"secret", b"")
    key = labeled_expand(_HPKE_SUITE, secret, b"key", context, 32)
    nonce = labeled_expand(_HPKE_SUITE, secret, b"base_nonce", context, 12)
    return key, nonce


def seal(
    recipient_public: bytes, info: bytes, plaintext: bytes, aad: bytes = b"", ephemeral: bytes | None = None
) -> bytes:
    """``enc || ciphertext`` for ``recipient_public``. ``ephemeral`` (an X25519 private key) only
    for known-answer tests; by default a fresh one from the OS, used once."""
    private = primitives.x25519_private() if ephemeral is None else ephemeral
    enc = primitives.x25519_public(private)
    dh = primitives.x25519(private, recipient_public)
    key, nonce = _key_schedule(_shared_secret(dh, enc, recipient_public), info)
    return enc + primitives.aead_seal(key, nonce, plaintext, aad)


def open_sealed(recipient_private: bytes, info: bytes, sealed: bytes, aad: bytes = b"") -> bytes:
    """The plaintext of ``enc || ciphertext``; ValueError if it does not authenticate."""
    if len(sealed) < ENC_LENGTH + TAG_LENGTH:
        raise ValueError("sealed message shorter than enc and tag")
    enc, ciphertext = sealed[:ENC_LENGTH], sealed[ENC_LENGTH:]
    dh = primitives.x25519(recipient_private, enc)
    recipient_public = primitives.x25519_public(recipient_private)
    key, nonce = _key_schedule(_shared_secret(dh, enc, recipient_public), info)
    return primitives.aead_open(key, nonce, ciphertext, aad)


def derive_key_pair(ikm: bytes) -> tuple[bytes, bytes]:
    """RFC 9180 DeriveKeyPair for X25519: (private, public) from input keying material (tests)."""
    prk = labeled_extract(_KEM_SUITE, b"", b"dkp_prk", ikm)
    private = labeled_expand(_KEM_SUITE, prk, b"sk", b"", 32)
    return private, primitives.x25519_public(private)
