"""The manifest of a shuffled batch: the shuffler and the aggregator compute it here, and only here.

The digest is SHA-256 over ``deniable/v1/batch`` and the ordered ciphertexts, each prefixed by its
length as 4 big-endian bytes. Equal-length ciphertexts (the rule: reports are padded) are framed
as numpy rows and hashed a block at a time, so a 48 MiB batch needs no second copy.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
else:
    from deniable.core.lazy import numpy as np

DIGEST_DOMAIN: Final = b"deniable/v1/batch"
_BLOCK_ROWS: Final = 65536
"""Rows framed and hashed at a time."""


def batch_digest(ciphertexts: Iterable[bytes]) -> bytes:
    """SHA-256 over the ordered, length-prefixed ciphertexts of a batch."""
    ciphertexts = list(ciphertexts)
    widths = set(map(len, ciphertexts))
    if len(widths) == 1 and len(ciphertexts) > 1:
        width = widths.pop()
        rows = np.frombuffer(b"".join(ciphertexts), dtype=np.uint8).reshape(len(ciphertexts), width)
        return rows_digest(rows)
    digest = hashlib.sha256(DIGEST_DOMAIN)
    for ciphertext in ciphertexts:
        digest.update(len(ciphertext).to_bytes(4, "big"))
        digest.update(ciphertext)
    return digest.digest()


def rows_digest(rows: npt.NDArray[np.uint8]) -> bytes:
    """``batch_digest`` of equal-width ciphertexts given as the rows of a 2-D uint8 array."""
    count, width = rows.shape
    hashed = hashlib.sha256(DIGEST_DOMAIN)
    length = np.frombuffer(width.to_bytes(4, "big"), dtype=np.uint8)
    for start in range(0, count, _BLOCK_ROWS):
        block = rows[start : start + _BLOCK_ROWS]
        framed = np.empty((block.shape[0], 4 + width), dtype=np.uint8)
        framed[:, :4] = length
        framed[:, 4:] = block
        hashed.update(framed.data)
    return hashed.digest()
