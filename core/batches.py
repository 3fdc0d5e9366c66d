"""The manifest of a shuffled batch: both the shuffler and the aggregator compute it here."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def batch_digest(ciphertexts: Iterable[bytes]) -> bytes:
    """SHA-256 over the ordered, length-prefixed ciphertexts of a batch."""
    digest = hashlib.sha256(b"deniable/v1/batch")
    for ciphertext in ciphertexts:
        digest.update(len(ciphertext).to_bytes(4, "big"))
        digest.update(ciphertext)
    return digest.digest()
