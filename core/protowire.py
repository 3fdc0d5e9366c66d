"""Protobuf wire framing written by hand where the runtime is too slow: varints and report elements.

Only the outer messages (``EncryptedReport`` elements of ``SubmitReportsRequest`` and
``ShuffledBatch``) are framed here; the plaintext inside a ciphertext is ``core.wire``'s, which
the shuffler never imports. Encoding is proto3 canonical (fields in order, defaults omitted), the
bytes the protobuf runtime writes; tests compare the two.
"""

from __future__ import annotations

from typing import Final

MAX_VARINT32_BYTES: Final = 5


def varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative integer."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if not value:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)


def read_varint(data: bytes | bytearray | memoryview, offset: int) -> tuple[int, int] | None:
    """(value, next offset) of the varint at ``offset``, or None if truncated or over 5 bytes."""
    value = shift = 0
    for position in range(offset, min(len(data), offset + MAX_VARINT32_BYTES)):
        byte = data[position]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position + 1
        shift += 7
    return None


def length_delimited(field_number: int, payload: bytes) -> bytes:
    """A length-delimited field (omitted when empty, as proto3 does)."""
    return varint(field_number << 3 | 2) + varint(len(payload)) + payload if payload else b""


def report_prefix(campaign: bytes, key_id: int, length: int, field_number: int) -> bytes:
    """Everything of one encoded ``EncryptedReport`` element before its ciphertext of ``length``.

    ``field_number``: 1 in SubmitReportsRequest, 3 in ShuffledBatch.
    """
    inner_head = length_delimited(1, campaign) + (b"\x10" + varint(key_id) if key_id else b"")
    inner_head += varint(3 << 3 | 2) + varint(length) if length else b""
    return varint(field_number << 3 | 2) + varint(len(inner_head) + length) + inner_head


def report_element(campaign: bytes, key_id: int, ciphertext: bytes, field_number: int) -> bytes:
    """One encoded ``EncryptedReport`` element: concatenated elements form a valid message."""
    return report_prefix(campaign, key_id, len(ciphertext), field_number) + ciphertext
