"""The batch manifest digest both the shuffler and the aggregator compute."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

from deniable.core.batches import batch_digest


def reference_digest(ciphertexts: list[bytes]) -> bytes:
    """The documented construction, written out independently: SHA-256 over a domain tag and
    each ciphertext prefixed by its 4-byte big-endian length, in order."""
    data = b"deniable/v1/batch" + b"".join(len(c).to_bytes(4, "big") + c for c in ciphertexts)
    return hashlib.sha256(data).digest()


def test_digest_matches_the_documented_construction() -> None:
    for batch in ([], [b""], [b"abc"], [b"a" * 144, b"b" * 144, b"c" * 144], [bytes(range(256))] * 3):
        assert batch_digest(batch) == reference_digest(batch)
    assert len(batch_digest([b"x"])) == 32


def test_digest_depends_on_order() -> None:
    batch = [b"first", b"second", b"third"]
    assert batch_digest(batch) != batch_digest(list(reversed(batch)))
    assert batch_digest(batch) != batch_digest([batch[1], batch[0], batch[2]])


def test_digest_depends_on_content() -> None:
    batch = [bytes(144), bytes(144)]
    base = batch_digest(batch)
    for position in range(144):
        changed = bytearray(batch[1])
        changed[position] ^= 1
        assert batch_digest([batch[0], bytes(changed)]) != base
    assert batch_digest(batch[:1]) != base  # a dropped report
    assert batch_digest([*batch, bytes(144)]) != base  # an added one
    assert batch_digest([b"", b""]) != batch_digest([b""])


def test_length_prefix_makes_boundaries_unambiguous() -> None:
    assert batch_digest([b"ab", b"c"]) != batch_digest([b"a", b"bc"])
    assert batch_digest([b"abc"]) != batch_digest([b"ab", b"c"])
    assert batch_digest([]) != batch_digest([b""])


def test_digest_is_deterministic_and_accepts_any_iterable() -> None:
    batch = [bytes([i]) * 10 for i in range(50)]

    def generate() -> Iterator[bytes]:
        yield from batch

    assert batch_digest(batch) == batch_digest(tuple(batch)) == batch_digest(generate())


def test_equal_width_rows_hash_like_the_documented_construction() -> None:
    """The one-pass numpy framing (equal widths, across block boundaries) and the byte loop agree."""
    import numpy as np

    from deniable.core.batches import rows_digest
    from deniable.core.rng import default_rng

    for count in (2, 30, 65536 + 3):
        ciphertexts = [default_rng().bytes(16) for _ in range(count)]
        assert batch_digest(ciphertexts) == reference_digest(ciphertexts)
        rows = np.frombuffer(b"".join(ciphertexts), dtype=np.uint8).reshape(count, 16)
        assert rows_digest(rows) == reference_digest(ciphertexts)
