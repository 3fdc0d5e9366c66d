"""``open_packed`` (the pool's fast path) gives exactly ``open_reports``'s outcome for every report."""

from __future__ import annotations

import struct

import numpy as np

from deniable.aggregator.decrypt import OK, Opened, open_packed, open_reports, unpack_opened
from deniable.core.crypto import KEM_HYBRID, KeyPair, seal_report
from deniable.core.wire import Plaintext, encode, new_report_id
from deniable.core.wire.codec import HEADER_LENGTH
from deniable.v1 import deniable_pb2 as pb

CAMPAIGN = "packed-test"
LENGTH = 96  # plaintext length of a 1..8-byte payload


def _plain(payload: bytes = b"\x03", campaign: str = CAMPAIGN, key_id: int = 1) -> bytes:
    return encode(Plaintext(new_report_id(), campaign, key_id, payload), LENGTH)


def _both_paths(keys: dict[int, bytes], cases: list[tuple[int, bytes]]) -> tuple[list[Opened], list[Opened]]:
    """The outcomes of ``open_reports`` and of ``open_packed`` (unpacked) for (key id, ciphertext)s."""
    width = len(cases[0][1])
    expected = open_reports(CAMPAIGN, LENGTH, width, keys, [(CAMPAIGN, k, c) for k, c in cases])
    packed = open_packed(
        CAMPAIGN,
        LENGTH,
        width,
        keys,
        np.array([k for k, _ in cases], dtype="<u4").tobytes(),
        b"".join(c for _, c in cases),
    )
    return expected, unpack_opened(packed)


def test_open_packed_matches_open_reports_on_good_and_bad_reports() -> None:
    pair, other = KeyPair.generate(1), KeyPair.generate(2)
    public = pair.public
    cases: list[tuple[int, bytes]] = []
    for i in range(40):
        cases.append((1, seal_report(_plain(bytes([i % 4])), public, CAMPAIGN)))
    cases.append((1, seal_report(_plain(b"\x01\x02"), public, CAMPAIGN)))  # another payload size
    cases.append((9, seal_report(_plain(key_id=9), public, CAMPAIGN)))  # unknown key id
    cases.append((2, seal_report(_plain(key_id=2), other.public, CAMPAIGN)))  # second key, fine
    tampered = bytearray(seal_report(_plain(), public, CAMPAIGN))
    tampered[-1] ^= 1
    cases.append((1, bytes(tampered)))  # undecryptable
    cases.append((1, seal_report(_plain(), public, "another")))  # info of another campaign
    cases.append((1, seal_report(_plain(campaign="elsewhere"), public, CAMPAIGN)))  # plaintext names another
    cases.append((1, seal_report(_plain(key_id=2), public, CAMPAIGN)))  # plaintext names another key
    bad_version = bytearray(_plain())
    bad_version[0] = 9
    cases.append((1, seal_report(bytes(bad_version), public, CAMPAIGN)))
    dirty_padding = bytearray(_plain())
    dirty_padding[-1] = 1
    cases.append((1, seal_report(bytes(dirty_padding), public, CAMPAIGN)))
    overlong = bytearray(_plain())
    struct.pack_into(">H", overlong, HEADER_LENGTH - 2, 500)
    cases.append((1, seal_report(bytes(overlong), public, CAMPAIGN)))
    dirty_campaign = bytearray(_plain())
    dirty_campaign[HEADER_LENGTH - 3] = 7  # inside the zero padding of the campaign field
    cases.append((1, seal_report(bytes(dirty_campaign), public, CAMPAIGN)))
    short = seal_report(bytes(LENGTH - 16), public, CAMPAIGN)  # decrypts to a short plaintext
    cases.append((1, short + bytes(16)))  # (length still right on the wire, so undecryptable)

    keys = {1: pair.private_raw, 2: other.private_raw}
    width = len(cases[0][1])
    assert all(len(c) == width for _, c in cases)
    expected, packed_outcome = _both_paths(keys, cases)
    assert packed_outcome == expected
    reasons = [reason for reason, _, _ in expected]
    assert reasons.count(OK) == 42 and len(set(reasons)) >= 4


def test_open_packed_of_nothing() -> None:
    assert unpack_opened(open_packed(CAMPAIGN, LENGTH, LENGTH + 48, {}, b"", b"")) == []


def test_open_packed_opens_hybrid_kem_reports_like_open_reports() -> None:
    """The pool's fast path with ML-KEM-768 + X25519 keys (96-byte private keys as plain bytes)."""
    pair = KeyPair.generate(4, KEM_HYBRID)
    cases = [seal_report(_plain(bytes([i % 4]), key_id=4), pair.public, CAMPAIGN) for i in range(6)]
    tampered = bytearray(cases[0])
    tampered[5] ^= 1
    cases.append(bytes(tampered))
    keys = {4: pair.private_raw}
    width = LENGTH + 1136
    expected = open_reports(CAMPAIGN, LENGTH, width, keys, [(CAMPAIGN, 4, c) for c in cases])
    packed = open_packed(CAMPAIGN, LENGTH, width, keys, np.full(7, 4, dtype="<u4").tobytes(), b"".join(cases))
    assert unpack_opened(packed) == expected
    assert [reason for reason, _, _ in expected] == [OK] * 6 + [int(pb.UNDECRYPTABLE)]


def _malformed_plaintexts() -> dict[str, tuple[bytes, int]]:
    """One plaintext per way ``decode`` can refuse or mismatch one, and good ones: (bytes, key id)."""
    from deniable.core.wire.codec import CAMPAIGN_FIELD, CAMPAIGN_LENGTH_AT

    def changed(at: int, value: int, base: bytes | None = None) -> bytes:
        data = bytearray(base or _plain())
        data[at] = value
        return bytes(data)

    overlong = bytearray(_plain())
    struct.pack_into(">H", overlong, HEADER_LENGTH - 2, 500)
    not_utf8 = changed(CAMPAIGN_FIELD.start, 0xFF)
    upper = changed(CAMPAIGN_FIELD.start, ord("P"))
    return {
        "good": (_plain(), 1),
        "good, longer payload": (_plain(b"\x01\x02\x03"), 1),
        "version": (changed(0, 9), 1),
        "campaign length over the field": (changed(CAMPAIGN_LENGTH_AT, 65), 1),
        "campaign field padding": (changed(CAMPAIGN_FIELD.stop - 1, 7), 1),
        "payload past the end": (bytes(overlong), 1),
        "padding not zero": (changed(LENGTH - 1, 1), 1),
        "campaign not UTF-8": (not_utf8, 1),
        "campaign not a valid id": (upper, 1),
        "names another campaign": (_plain(campaign="elsewhere"), 1),
        "names another key": (_plain(key_id=2), 1),
    }


def test_row_check_and_decode_agree_on_every_rejection_reason() -> None:
    """``core.wire.rows.accepted_rows`` (packed path) accepts exactly what ``decode`` accepts for
    this campaign and key; ``open_packed`` and ``open_reports`` share one per-plaintext outcome."""
    from deniable.aggregator.decrypt import CAMPAIGN_MISMATCH, MALFORMED_PLAINTEXT, decoded
    from deniable.core.wire.rows import accepted_rows

    cases = _malformed_plaintexts()
    rows = np.frombuffer(b"".join(p for p, _ in cases.values()), dtype=np.uint8).reshape(len(cases), LENGTH)
    keys = np.array([k for _, k in cases.values()], dtype="<u4")
    accepted = accepted_rows(rows, CAMPAIGN, keys).tolist()
    outcomes = {name: decoded(p, LENGTH, CAMPAIGN, k)[0] for name, (p, k) in cases.items()}
    assert dict(zip(cases, accepted, strict=True)) == {
        name: reason == OK for name, reason in outcomes.items()
    }
    assert {r for r in outcomes.values()} == {OK, MALFORMED_PLAINTEXT, CAMPAIGN_MISMATCH}
    assert [name for name, r in outcomes.items() if r == OK] == ["good", "good, longer payload"]
    assert outcomes["names another key"] == outcomes["names another campaign"] == CAMPAIGN_MISMATCH


def test_open_packed_matches_open_reports_on_every_malformed_plaintext() -> None:
    pair = KeyPair.generate(1)
    cases = _malformed_plaintexts()
    sealed = [(k, seal_report(p, pair.public, CAMPAIGN)) for p, k in cases.values()]
    keys = {1: pair.private_raw, 2: KeyPair.generate(2).private_raw}
    expected, packed_outcome = _both_paths(keys, sealed)
    assert packed_outcome == expected
