"""The fixed-length plaintext codec: round trips, constant length, strict decoding."""

from __future__ import annotations

import struct

import pytest

from deniable.core import mechanisms
from deniable.core.campaigns import layout_for
from deniable.core.ids import valid_campaign_id
from deniable.core.rng import Csprng
from deniable.core.wire import (
    HEADER_LENGTH,
    MAX_CAMPAIGN_ID_BYTES,
    REPORT_ID_LENGTH,
    MalformedPlaintext,
    Plaintext,
    decode,
    encode,
    new_report_id,
    plaintext_length,
)
from deniable.core.wire.codec import SIZE_CLASSES

REPORT_ID = bytes(range(16))


def sample(campaign: str = "languages-2026", payload: bytes = b"\x03", key_id: int = 7) -> Plaintext:
    return Plaintext(report_id=REPORT_ID, campaign_id=campaign, key_id=key_id, payload=payload)


def header(
    *,
    version: int = 1,
    campaign: bytes = b"abc",
    campaign_len: int | None = None,
    payload_len: int = 1,
    campaign_field: bytes | None = None,
) -> bytes:
    """A raw header built independently of the codec (big-endian, see the codec's layout)."""
    field = campaign_field if campaign_field is not None else campaign.ljust(64, b"\x00")
    length = len(campaign) if campaign_len is None else campaign_len
    return (
        bytes([version])
        + REPORT_ID
        + (9).to_bytes(4, "big")
        + bytes([length])
        + field
        + payload_len.to_bytes(2, "big")
    )


def test_header_length_and_layout() -> None:
    assert HEADER_LENGTH == 1 + 16 + 4 + 1 + 64 + 2 == 88
    assert REPORT_ID_LENGTH == 16
    assert MAX_CAMPAIGN_ID_BYTES == 64
    raw = header() + b"\x05"
    raw += bytes(plaintext_length(1) - len(raw))
    assert decode(raw, plaintext_length(1)) == Plaintext(REPORT_ID, "abc", 9, b"\x05")
    assert encode(Plaintext(REPORT_ID, "abc", 9, b"\x05"), plaintext_length(1)) == raw


@pytest.mark.parametrize("payload_length", [1, 2, 3, 8, 40, 41, 100, 168, 169, 4000, 65_535])
def test_plaintext_length_is_the_smallest_size_class_that_fits(payload_length: int) -> None:
    length = plaintext_length(payload_length)
    assert length in SIZE_CLASSES
    assert HEADER_LENGTH + payload_length <= length
    smaller = [c for c in SIZE_CLASSES if c < length]
    assert not smaller or HEADER_LENGTH + payload_length > max(smaller)


def test_size_classes_are_few_and_shared_by_every_mechanism() -> None:
    """An observer of the device link learns a class, not a campaign: every single-message
    mechanism at an ordinary domain seals to the same size (issue 20, item 10). With the old
    16-byte padding OUE at d = 200 (176 bytes) and GRR (144) were told apart by size."""
    assert len(SIZE_CLASSES) <= 12
    assert tuple(sorted(SIZE_CLASSES)) == SIZE_CLASSES
    sizes = {
        layout_for(mechanisms.create(name, epsilon0=1.0, domain_size=d)).ciphertext_length
        for name in ("binary_rr", "grr", "olh", "oue", "sue", "subset_selection", "hadamard_response")
        for d in ((2,) if name == "binary_rr" else (2, 8, 32, 200))
    }
    assert sizes == {176}


@pytest.mark.parametrize("payload_length", [0, -1, 65_536])
def test_plaintext_length_rejects_bad_payload_lengths(payload_length: int) -> None:
    with pytest.raises(ValueError):
        plaintext_length(payload_length)


@pytest.mark.parametrize(
    ("campaign", "payload", "key_id"),
    [
        ("a", b"\x00", 0),
        ("languages-2026", b"\x01", 7),
        ("x" * 63, b"\x00\x01", 2**32 - 1),
        ("a.b_c-9", bytes(range(256)), 123_456),
        ("0", b"\xff" * 65_535, 1),
    ],
)
def test_round_trip(campaign: str, payload: bytes, key_id: int) -> None:
    message = Plaintext(new_report_id(), campaign, key_id, payload)
    length = plaintext_length(len(payload))
    data = encode(message, length)
    assert len(data) == length
    assert decode(data, length) == message


def test_every_report_of_a_campaign_has_the_same_length() -> None:
    length = plaintext_length(2)
    sizes = {len(encode(sample(payload=v.to_bytes(2, "big")), length)) for v in range(0, 65_536, 997)}
    sizes |= {len(encode(sample(campaign="c" * n, payload=b"\x00\x00"), length)) for n in (1, 30, 63)}
    assert sizes == {length}


def test_new_report_id() -> None:
    ids = {new_report_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(len(i) == 16 for i in ids)
    keyed = Csprng(key=bytes(32))
    assert new_report_id(keyed) == Csprng(key=bytes(32)).bytes(16)


# --------------------------------------------------------------------------- encode errors


@pytest.mark.parametrize(
    "campaign",
    [
        "",
        "A",
        "Abc",
        "-abc",
        ".abc",
        "_abc",
        "a b",
        "a/b",
        "é",
        "x" * 64,
        "abc\n",
        "abc\n\n",
        "\nabc",
        "a\x00",
    ],
)
def test_encode_rejects_bad_campaign_ids(campaign: str) -> None:
    with pytest.raises(ValueError):
        encode(sample(campaign=campaign), plaintext_length(1))


@pytest.mark.parametrize("campaign", ["abc\n", "a" * 63 + "\n"])
def test_campaign_id_with_trailing_newline_is_invalid(campaign: str) -> None:
    """The id pattern ends in ``$``, which also matches before a final newline."""
    assert not valid_campaign_id(campaign)


def test_encode_rejects_bad_fields() -> None:
    with pytest.raises(ValueError):
        encode(Plaintext(bytes(15), "abc", 1, b"\x00"), plaintext_length(1))
    with pytest.raises(ValueError):
        encode(Plaintext(bytes(17), "abc", 1, b"\x00"), plaintext_length(1))
    with pytest.raises(ValueError):  # payload does not fit
        encode(sample(payload=bytes(41)), plaintext_length(1))
    with pytest.raises(ValueError):  # length shorter than the header
        encode(sample(), HEADER_LENGTH - 1)
    for key_id in (-1, 2**32):
        with pytest.raises((ValueError, struct.error)):
            encode(sample(key_id=key_id), plaintext_length(1))


# --------------------------------------------------------------------------- strict decoding


def valid_bytes() -> tuple[bytes, int]:
    length = plaintext_length(1)
    return encode(sample(payload=b"\x02"), length), length


def test_decode_rejects_wrong_length() -> None:
    data, length = valid_bytes()
    for bad in (data[:-1], data + b"\x00", b"", data[:HEADER_LENGTH]):
        with pytest.raises(MalformedPlaintext):
            decode(bad, length)
    with pytest.raises(MalformedPlaintext):  # the right bytes against a shorter campaign length
        decode(data[:50], 50)


@pytest.mark.parametrize("version", [0, 2, 255])
def test_decode_rejects_unknown_versions(version: int) -> None:
    data, length = valid_bytes()
    with pytest.raises(MalformedPlaintext):
        decode(bytes([version]) + data[1:], length)


def test_decode_rejects_nonzero_padding_anywhere() -> None:
    data, length = valid_bytes()
    end = HEADER_LENGTH + 1
    for position in range(end, length):
        tampered = bytearray(data)
        tampered[position] = 1
        with pytest.raises(MalformedPlaintext):
            decode(bytes(tampered), length)


def test_decode_rejects_payload_length_past_the_end() -> None:
    length = plaintext_length(1)
    for payload_len in (length - HEADER_LENGTH + 1, 0xFFFF):
        raw = header(payload_len=payload_len).ljust(length, b"\x00")
        with pytest.raises(MalformedPlaintext):
            decode(raw, length)
    exact = header(payload_len=length - HEADER_LENGTH).ljust(length, b"\x01")  # fills to the end
    assert len(decode(exact, length).payload) == length - HEADER_LENGTH


@pytest.mark.parametrize(
    "raw_header",
    [
        header(campaign_len=65),  # longer than the field
        header(campaign_len=255),
        header(campaign=b"abc", campaign_field=b"abc\x00x".ljust(64, b"\x00")),  # bytes after the id
        header(campaign=b"ab\xff"),  # not UTF-8
        header(campaign=b"\xc3"),  # truncated UTF-8
    ],
)
def test_decode_rejects_malformed_campaign_fields(raw_header: bytes) -> None:
    length = plaintext_length(1)
    with pytest.raises(MalformedPlaintext):
        decode((raw_header + b"\x01").ljust(length, b"\x00"), length)


@pytest.mark.parametrize("campaign", [b"", b"ABC", b"-abc", b"a b", b"abc\n", "é".encode()])
def test_decode_rejects_campaign_ids_encode_would_refuse(campaign: bytes) -> None:
    """Strictness: whatever decodes must re-encode to the very same bytes, so a campaign id that
    ``encode`` refuses (empty, upper case, bad characters) is malformed."""
    length = plaintext_length(1)
    raw = (header(campaign=campaign) + b"\x01").ljust(length, b"\x00")
    with pytest.raises(MalformedPlaintext):
        decode(raw, length)


def test_decode_then_encode_is_identity_on_valid_plaintexts() -> None:
    length = plaintext_length(3)
    for campaign in ("a", "b-2", "z" * 63):
        for payload in (b"", b"\x01", b"\x01\x02\x03"):
            data = encode(Plaintext(REPORT_ID, campaign, 5, payload), length)
            assert encode(decode(data, length), length) == data
