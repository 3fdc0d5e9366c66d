"""The few cryptographic primitives the device path needs, from one of two pyca backends (ADR 0039).

``cryptography`` (OpenSSL) when it is installed: every service has it through ``[server]``.
``pynacl`` (libsodium) otherwise: the bare device SDK depends on PyNaCl only, 4 MB where
cryptography takes 16 (issue 21's < 20 MB target). Both give the same bytes for everything here:
X25519, ChaCha20-Poly1305 (IETF, RFC 8439), Ed25519 verification and the CSPRNG's ChaCha20
keystream chunks. ``DENIABLE_CRYPTO_BACKEND=pynacl`` (or ``cryptography``) forces one at start-up;
``use`` switches in-process (tests that check one backend against the other).
"""

from __future__ import annotations

import os
from typing import Final

BACKEND_ENV: Final = "DENIABLE_CRYPTO_BACKEND"
CRYPTOGRAPHY: Final = "cryptography"
PYNACL: Final = "pynacl"
BACKENDS: Final = (CRYPTOGRAPHY, PYNACL)
_MODULE: Final = {CRYPTOGRAPHY: "cryptography", PYNACL: "nacl"}
KEYSTREAM_CHUNK: Final = 1 << 16
"""Bytes per keystream chunk: 1024 ChaCha20 blocks, counters 1 to 1024 under one nonce."""
_ZERO_CHUNK: Final = bytes(KEYSTREAM_CHUNK)
_COUNTER_ONE: Final = (1).to_bytes(4, "little")
MISSING_HINT: Final = (
    "the device SDK needs PyNaCl or cryptography: pip install deniable (PyNaCl), or deniable[server]"
)


def _installed(name: str) -> bool:
    """Whether ``name`` imports here (a broken or absent package counts as absent)."""
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def _initial() -> str:
    """The backend named by ``DENIABLE_CRYPTO_BACKEND``, else cryptography if installed, else PyNaCl."""
    forced = os.environ.get(BACKEND_ENV, "").strip().lower()
    if forced:
        if forced not in BACKENDS:
            raise ValueError(f"{BACKEND_ENV}={forced!r}: use one of {', '.join(BACKENDS)}")
        if not _installed(_MODULE[forced]):
            raise ModuleNotFoundError(f"{BACKEND_ENV}={forced}, but {forced} is not installed")
        return forced
    if _installed("cryptography"):
        return CRYPTOGRAPHY
    if _installed("nacl"):
        return PYNACL
    raise ModuleNotFoundError(MISSING_HINT)


_active = _initial()


def active() -> str:
    """The backend in use now: ``"cryptography"`` or ``"pynacl"``."""
    return _active


def use(name: str) -> str:
    """Switch to backend ``name`` (tests); returns the previous one. ValueError if unknown or absent."""
    global _active
    if name not in BACKENDS:
        raise ValueError(f"unknown crypto backend {name!r}: use one of {', '.join(BACKENDS)}")
    if not _installed(_MODULE[name]):
        raise ModuleNotFoundError(f"the {name} backend is not installed")
    previous, _active = _active, name
    return previous


def keystream_chunk(key: bytes, index: int) -> bytes:
    """Chunk ``index`` of the CSPRNG's keystream: ChaCha20 (RFC 8439) under ``key`` and the 96-bit
    nonce ``index`` (little-endian), blocks 1 to 1024.

    PyNaCl exposes no raw ChaCha20 stream, but its ChaCha20-Poly1305 IETF encryption of zeros is
    exactly that keystream (block 0 keys Poly1305; the text starts at block 1): the tag is dropped.
    Every (key, nonce, counter) triple is used once, so chunks are independent ChaCha20 outputs.
    """
    if len(key) != 32:
        raise ValueError("a ChaCha20 key is 32 bytes")
    nonce = index.to_bytes(12, "little")
    if _active == CRYPTOGRAPHY:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

        return (
            Cipher(algorithms.ChaCha20(key, _COUNTER_ONE + nonce), mode=None).encryptor().update(_ZERO_CHUNK)
        )
    from nacl.bindings import crypto_aead_chacha20poly1305_ietf_encrypt

    return crypto_aead_chacha20poly1305_ietf_encrypt(_ZERO_CHUNK, None, nonce, key)[:KEYSTREAM_CHUNK]


def x25519_private() -> bytes:
    """A fresh X25519 private key (32 bytes) from the OS random source."""
    return os.urandom(32)


def x25519_public(private: bytes) -> bytes:
    """The X25519 public key of ``private`` (RFC 7748, clamped scalar times the base point)."""
    if _active == CRYPTOGRAPHY:
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

        return X25519PrivateKey.from_private_bytes(private).public_key().public_bytes_raw()
    from nacl.bindings import crypto_scalarmult_base

    return crypto_scalarmult_base(private)


def x25519(private: bytes, public: bytes) -> bytes:
    """The X25519 shared secret; ValueError if it is all zeros (a small-order ``public``)."""
    if len(private) != 32 or len(public) != 32:
        raise ValueError("X25519 keys are 32 bytes")
    if _active == CRYPTOGRAPHY:
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

        peer = X25519PublicKey.from_public_bytes(public)
        return X25519PrivateKey.from_private_bytes(private).exchange(peer)
    from nacl.bindings import crypto_scalarmult
    from nacl.exceptions import RuntimeError as NaclRuntimeError

    try:
        return crypto_scalarmult(private, public)
    except NaclRuntimeError:  # libsodium refuses an all-zero result
        raise ValueError("X25519 shared secret is all zeros (small-order public key)") from None


def aead_seal(key: bytes, nonce: bytes, plaintext: bytes, aad: bytes) -> bytes:
    """ChaCha20-Poly1305 (RFC 8439) encryption: ciphertext || 16-byte tag."""
    if _active == CRYPTOGRAPHY:
        from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

        return ChaCha20Poly1305(key).encrypt(nonce, plaintext, aad)
    from nacl.bindings import crypto_aead_chacha20poly1305_ietf_encrypt

    return crypto_aead_chacha20poly1305_ietf_encrypt(plaintext, aad, nonce, key)


def aead_open(key: bytes, nonce: bytes, ciphertext: bytes, aad: bytes) -> bytes:
    """ChaCha20-Poly1305 decryption; ValueError for anything that does not authenticate."""
    if _active == CRYPTOGRAPHY:
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

        try:
            return ChaCha20Poly1305(key).decrypt(nonce, ciphertext, aad)
        except InvalidTag:
            raise ValueError("ciphertext does not authenticate") from None
    from nacl.bindings import crypto_aead_chacha20poly1305_ietf_decrypt
    from nacl.exceptions import CryptoError

    try:
        return crypto_aead_chacha20poly1305_ietf_decrypt(ciphertext, aad, nonce, key)
    except CryptoError:
        raise ValueError("ciphertext does not authenticate") from None


def ed25519_verify(public: bytes, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` is a valid Ed25519 (RFC 8032) signature of ``message`` by ``public``."""
    if len(public) != 32 or len(signature) != 64:
        return False
    if _active == CRYPTOGRAPHY:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        try:
            Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
        except (InvalidSignature, ValueError):
            return False
        return True
    from nacl.bindings import crypto_sign_open
    from nacl.exceptions import BadSignatureError
    from nacl.exceptions import ValueError as NaclValueError

    try:
        crypto_sign_open(signature + message, public)
    except (BadSignatureError, NaclValueError):
        return False
    return True
