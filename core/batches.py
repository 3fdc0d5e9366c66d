"""The manifest of a shuffled batch: the shuffler and the aggregator compute it here, and only here.

The digest is SHA-256 over ``deniable/v1/batch`` and the ordered ciphertexts, each prefixed by its
length as 4 big-endian bytes. Equal-length ciphertexts (the rule: reports are padded) are framed
as numpy rows and hashed a block at a time, so a 48 MiB batch needs no second copy.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from deniable.core.protowire import length_delimited, varint

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
else:
    from deniable.core.lazy import numpy as np

DIGEST_DOMAIN: Final = b"deniable/v1/batch"
_BLOCK_ROWS: Final = 65536
"""Rows framed and hashed at a time."""
MAX_CHUNKS: Final = 1_000_000
"""The most chunks one release may claim (ADR 0023)."""
MAX_RELEASE_MESSAGES: Final = 10**10
"""The most messages one release may claim."""


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


@dataclass(frozen=True)
class ReleaseChunk:
    """Where a shuffled batch sits in its release (ADR 0023): one permutation cut into ``count``
    chunks, ``messages`` in all. The shuffler writes it, the aggregator checks it."""

    release_id: str
    index: int
    count: int
    messages: int

    def wire(self) -> bytes:
        """ShuffledBatch fields 9-12 (release id, chunk index, chunk count, release messages)."""
        out = length_delimited(9, self.release_id.encode("utf-8"))
        for number, value in ((10, self.index), (11, self.count), (12, self.messages)):
            out += varint(number << 3) + varint(value) if value else b""
        return out

    def problem(self, size: int) -> str | None:
        """Why this claim is malformed for a chunk of ``size`` messages (INVALID_ARGUMENT), or None."""
        if not 1 <= self.count <= MAX_CHUNKS or not 0 <= self.index < self.count:
            return f"chunk {self.index} of {self.count} is not a valid place in a release"
        if not size <= self.messages <= MAX_RELEASE_MESSAGES:
            return f"release total {self.messages} is below this chunk's {size} messages or too large"
        return None
