"""HPKE envelope (RFC 9180) and aggregator key pairs."""

from deniable.core.crypto.envelope import (
    HPKE_OVERHEAD,
    SUITE_NAME,
    DecryptionError,
    KeyPair,
    PublicKey,
    ciphertext_length,
    envelope_info,
    open_report,
    seal_report,
)

__all__ = [
    "HPKE_OVERHEAD",
    "SUITE_NAME",
    "DecryptionError",
    "KeyPair",
    "PublicKey",
    "ciphertext_length",
    "envelope_info",
    "open_report",
    "seal_report",
]
