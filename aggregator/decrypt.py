"""Opening and validating sealed reports: a pure function over plain data.

It takes and returns only bytes, ints and strings, so it can run in another process
(``ProcessPoolExecutor``): HPKE decryption holds the GIL and costs ~45 µs per report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from deniable.core.crypto import DecryptionError, KeyPair, open_report
from deniable.core.wire import MalformedPlaintext, decode
from deniable.v1 import deniable_pb2 as pb

OK: Final = 0
CAMPAIGN_MISMATCH: Final = int(pb.CAMPAIGN_MISMATCH)
UNKNOWN_KEY_ID: Final = int(pb.UNKNOWN_KEY_ID)
WRONG_CIPHERTEXT_LENGTH: Final = int(pb.WRONG_CIPHERTEXT_LENGTH)
UNDECRYPTABLE: Final = int(pb.UNDECRYPTABLE)
MALFORMED_PLAINTEXT: Final = int(pb.MALFORMED_PLAINTEXT)

Envelope = tuple[str, int, bytes]
"""(campaign id, key id, ciphertext) of one report as it arrived."""

Opened = tuple[int, bytes, bytes]
"""(reason, report id, payload): reason is OK or a RejectReason value; ids/payload empty if not OK."""

_REJECTED: Final = b""


def open_reports(
    campaign_id: str,
    plaintext_length: int,
    ciphertext_length: int,
    private_keys: Mapping[int, bytes],
    envelopes: Sequence[Envelope],
) -> list[Opened]:
    """Check, decrypt and decode every envelope; one outcome per envelope, never an exception."""
    pairs = {key_id: KeyPair(key_id, raw) for key_id, raw in private_keys.items()}
    out: list[Opened] = []
    for envelope_campaign, key_id, ciphertext in envelopes:
        if envelope_campaign != campaign_id:
            out.append((CAMPAIGN_MISMATCH, _REJECTED, _REJECTED))
            continue
        pair = pairs.get(key_id)
        if pair is None:
            out.append((UNKNOWN_KEY_ID, _REJECTED, _REJECTED))
            continue
        if len(ciphertext) != ciphertext_length:
            out.append((WRONG_CIPHERTEXT_LENGTH, _REJECTED, _REJECTED))
            continue
        try:
            plaintext = open_report(ciphertext, pair, campaign_id)
        except DecryptionError:
            out.append((UNDECRYPTABLE, _REJECTED, _REJECTED))
            continue
        try:
            decoded = decode(plaintext, plaintext_length)
        except MalformedPlaintext:
            out.append((MALFORMED_PLAINTEXT, _REJECTED, _REJECTED))
            continue
        if decoded.campaign_id != campaign_id or decoded.key_id != key_id:
            out.append((CAMPAIGN_MISMATCH, _REJECTED, _REJECTED))
            continue
        out.append((OK, decoded.report_id, decoded.payload))
    return out
