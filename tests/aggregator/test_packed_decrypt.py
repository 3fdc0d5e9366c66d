"""``open_packed`` (the pool's fast path) gives exactly ``open_reports``'s outcome for every report."""

from __future__ import annotations

import struct

import numpy as np

from deniable.aggregator.decrypt import OK, open_packed, open_reports, unpack_opened
from deniable.core.crypto import KEM_HYBRID, KeyPair, seal_report
from deniable.core.wire import Plaintext, encode, new_report_id
from deniable.core.wire.codec import HEADER_LENGTH
from deniable.v1 import deniable_pb2 as pb

CAMPAIGN = "packed-test"
LENGTH = 96  # plaintext length of a 1..8-byte payload


def _plain(payload: bytes = b"\x03", campaign: str = CAMPAIGN, key_id: int = 1) -> bytes:
    return encode(Plaintext(new_report_id(), campaign, key_id, payload), LENGTH)


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
    expected = open_reports(CAMPAIGN, LENGTH, width, keys, [(CAMPAIGN, k, c) for k, c in cases])
    packed = open_packed(
        CAMPAIGN,
        LENGTH,
        width,
        keys,
        np.array([k for k, _ in cases], dtype="<u4").tobytes(),
        b"".join(c for _, c in cases),
    )
    assert unpack_opened(packed) == expected
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
