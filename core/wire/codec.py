"""The plaintext of one report, padded to a length fixed per campaign.

Layout (big-endian)::

    version u8 | report_id 16 | key_id u32 | campaign_len u8 | campaign_id (64, zero padded)
    | payload_len u16 | payload | zero padding up to the campaign's plaintext length

The plaintext length is the smallest of a few size classes shared by every campaign
(``SIZE_CLASSES``, powers of two from 128 bytes), so a ciphertext's size says nothing about the
answer and, beyond its class, nothing about which campaign or mechanism it answers (ADR 0031).
Decoding is strict: wrong version, lengths or non-zero padding are rejected.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

from deniable.core.ids import CAMPAIGN_ID_PATTERN, MAX_CAMPAIGN_ID_BYTES
from deniable.core.rng import Csprng, default_rng

VERSION: Final = 1
REPORT_ID_LENGTH: Final = 16
_HEAD = struct.Struct(f">B{REPORT_ID_LENGTH}sIB{MAX_CAMPAIGN_ID_BYTES}sH")
HEADER_LENGTH: Final = _HEAD.size  # 88
SIZE_CLASSES: Final = tuple(2**k for k in range(7, 18))
"""Every plaintext length a campaign may have: 128, 256, …, 131072 bytes."""

# Byte positions of the header fields (what ``_HEAD`` packs), for readers of many rows at once.
VERSION_AT: Final = 0
REPORT_ID_FIELD: Final = slice(1, 1 + REPORT_ID_LENGTH)
KEY_ID_FIELD: Final = slice(REPORT_ID_FIELD.stop, REPORT_ID_FIELD.stop + 4)
CAMPAIGN_LENGTH_AT: Final = KEY_ID_FIELD.stop
CAMPAIGN_FIELD: Final = slice(CAMPAIGN_LENGTH_AT + 1, CAMPAIGN_LENGTH_AT + 1 + MAX_CAMPAIGN_ID_BYTES)
PAYLOAD_LENGTH_FIELD: Final = slice(CAMPAIGN_FIELD.stop, CAMPAIGN_FIELD.stop + 2)
assert PAYLOAD_LENGTH_FIELD.stop == HEADER_LENGTH, "field positions must follow _HEAD"


class MalformedPlaintext(ValueError):
    """A decrypted plaintext that does not follow the codec."""


@dataclass(frozen=True)
class Plaintext:
    """Decoded content of one report."""

    report_id: bytes
    campaign_id: str
    key_id: int
    payload: bytes


def plaintext_length(payload_length: int) -> int:
    """The size class a campaign whose payloads are ``payload_length`` bytes pads every plaintext to."""
    if not 0 < payload_length <= 0xFFFF:
        raise ValueError("payload length must be in 1..65535")
    raw = HEADER_LENGTH + payload_length
    return next(size for size in SIZE_CLASSES if size >= raw)


def new_report_id(rng: Csprng | None = None) -> bytes:
    """A fresh random report id: the aggregator dedupes on it."""
    return (rng or default_rng()).bytes(REPORT_ID_LENGTH)


def encode(plaintext: Plaintext, length: int) -> bytes:
    """Encode and zero-pad to exactly ``length`` bytes."""
    campaign = plaintext.campaign_id.encode("utf-8")
    if not CAMPAIGN_ID_PATTERN.fullmatch(plaintext.campaign_id):
        raise ValueError(f"invalid campaign id {plaintext.campaign_id!r}")
    if len(plaintext.report_id) != REPORT_ID_LENGTH:
        raise ValueError("report id must be 16 bytes")
    body = (
        _HEAD.pack(
            VERSION, plaintext.report_id, plaintext.key_id, len(campaign), campaign, len(plaintext.payload)
        )
        + plaintext.payload
    )
    if len(body) > length:
        raise ValueError(f"payload of {len(plaintext.payload)} bytes does not fit a {length}-byte plaintext")
    return body + bytes(length - len(body))


def decode(data: bytes, length: int) -> Plaintext:
    """Strictly decode a plaintext of the campaign's fixed ``length``."""
    if len(data) != length:
        raise MalformedPlaintext(f"plaintext is {len(data)} bytes, expected {length}")
    if len(data) < HEADER_LENGTH:
        raise MalformedPlaintext("plaintext shorter than its header")
    version, report_id, key_id, campaign_len, campaign_raw, payload_len = _HEAD.unpack_from(data)
    if version != VERSION:
        raise MalformedPlaintext(f"unknown plaintext version {version}")
    if campaign_len > MAX_CAMPAIGN_ID_BYTES or any(campaign_raw[campaign_len:]):
        raise MalformedPlaintext("campaign id field is malformed")
    end = HEADER_LENGTH + payload_len
    if end > len(data):
        raise MalformedPlaintext("payload length runs past the plaintext")
    if any(data[end:]):
        raise MalformedPlaintext("padding is not zero")
    try:
        campaign_id = campaign_raw[:campaign_len].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise MalformedPlaintext("campaign id is not UTF-8") from exc
    if not CAMPAIGN_ID_PATTERN.fullmatch(campaign_id):
        raise MalformedPlaintext("campaign id is not a valid id")
    return Plaintext(
        report_id=report_id, campaign_id=campaign_id, key_id=key_id, payload=data[HEADER_LENGTH:end]
    )
