"""Opening and validating sealed reports: a pure function over plain data.

It takes and returns only bytes, ints and strings, so it can run in another process
(``ProcessPoolExecutor``): HPKE decryption holds the GIL and costs ~45 µs per report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from deniable.core.crypto import DecryptionError, KeyPair, open_report
from deniable.core.wire import MalformedPlaintext, decode
from deniable.core.wire.codec import HEADER_LENGTH, REPORT_ID_FIELD, REPORT_ID_LENGTH
from deniable.core.wire.rows import accepted_rows, payload_lengths
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
    *,
    incarnation: bytes = b"",
) -> list[Opened]:
    """Check, decrypt and decode every envelope; one outcome per envelope, never an exception.

    Reports sealed under another ``incarnation`` of the campaign id do not open (UNDECRYPTABLE)."""
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
            plaintext = open_report(ciphertext, pair, campaign_id, incarnation)
        except DecryptionError:
            out.append((UNDECRYPTABLE, _REJECTED, _REJECTED))
            continue
        out.append(decoded(plaintext, plaintext_length, campaign_id, key_id))
    return out


def decoded(plaintext: bytes, length: int, campaign_id: str, key_id: int) -> Opened:
    """One decrypted plaintext's outcome: MALFORMED_PLAINTEXT, CAMPAIGN_MISMATCH (it names another
    campaign or key than its envelope), or OK with its report id and payload."""
    try:
        content = decode(plaintext, length)
    except MalformedPlaintext:
        return MALFORMED_PLAINTEXT, _REJECTED, _REJECTED
    if content.campaign_id != campaign_id or content.key_id != key_id:
        return CAMPAIGN_MISMATCH, _REJECTED, _REJECTED
    return OK, content.report_id, content.payload


Packed = tuple[bytes, bytes, bytes, bytes]
"""(reasons: uint8 each, report ids: 16 bytes each, payload lengths: uint32 each, payloads back to back)."""


def open_packed(
    campaign_id: str,
    plaintext_length: int,
    ciphertext_length: int,
    private_keys: Mapping[int, bytes],
    key_ids: bytes,
    ciphertexts: bytes,
    *,
    incarnation: bytes = b"",
) -> Packed:
    """``open_reports`` for a chunk whose envelopes all name ``campaign_id`` and have the
    campaign's ciphertext length, passed packed (uint32 key ids, ciphertexts back to back).

    Packed in and out, so a process pool moves a few large buffers instead of many small
    objects; the plaintexts are checked with numpy in one pass (``core.wire.rows``). Outcomes are
    exactly those of ``open_reports``: a plaintext that pass rejects goes through ``decode``.
    """
    keys = np.frombuffer(key_ids, dtype="<u4")
    if len(ciphertexts) != int(keys.size) * ciphertext_length:
        raise ValueError("ciphertexts do not match the key ids and the ciphertext length")
    reasons, rows = _decrypt_rows(
        (campaign_id, incarnation), plaintext_length, ciphertext_length, private_keys, keys, ciphertexts
    )
    accepted = accepted_rows(rows, campaign_id, keys)
    for index in np.flatnonzero((reasons == OK) & ~accepted).tolist():
        # Not accepted by the vector check, so ``decode`` fails or names another campaign or key.
        reason = decoded(rows[index].tobytes(), plaintext_length, campaign_id, int(keys[index]))[0]
        if reason == OK:
            raise AssertionError("the row check refused a plaintext that decodes to this campaign and key")
        reasons[index] = reason
    return _packed_outcome(reasons, rows)


def _decrypt_rows(
    context: tuple[str, bytes],
    size: int,
    width: int,
    private_keys: Mapping[int, bytes],
    keys: npt.NDArray[np.uint32],
    ciphertexts: bytes,
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
    """(reason per report so far, plaintexts as rows of ``size`` bytes; zero where not opened);
    ``context`` is the campaign id and incarnation the reports were sealed under."""
    pairs = {key_id: KeyPair(key_id, raw) for key_id, raw in private_keys.items()}
    count = int(keys.size)
    reasons = np.zeros(count, dtype=np.uint8)
    plaintexts = bytearray(count * size)
    for index, key_id in enumerate(keys.tolist()):
        pair = pairs.get(key_id)
        if pair is None:
            reasons[index] = UNKNOWN_KEY_ID
            continue
        try:
            plaintext = open_report(ciphertexts[index * width : (index + 1) * width], pair, *context)
        except DecryptionError:
            reasons[index] = UNDECRYPTABLE
            continue
        if len(plaintext) != size:
            reasons[index] = MALFORMED_PLAINTEXT
            continue
        plaintexts[index * size : (index + 1) * size] = plaintext
    rows = np.frombuffer(bytes(plaintexts), dtype=np.uint8).reshape(count, size)
    return reasons, rows


def _packed_outcome(reasons: npt.NDArray[np.uint8], rows: npt.NDArray[np.uint8]) -> Packed:
    """Reasons, report ids (zero where rejected), payload lengths and the accepted payloads."""
    accepted = reasons == OK
    lengths = np.where(accepted, payload_lengths(rows), 0)
    report_ids = np.where(accepted[:, None], rows[:, REPORT_ID_FIELD], 0).astype(np.uint8)
    kept = np.flatnonzero(accepted)
    if kept.size and bool(np.all(lengths[kept] == lengths[kept[0]])):  # the usual case: one payload size
        payloads = rows[kept, HEADER_LENGTH : HEADER_LENGTH + int(lengths[kept[0]])].tobytes()
    else:
        payloads = b"".join(
            rows[i, HEADER_LENGTH : HEADER_LENGTH + int(lengths[i])].tobytes() for i in kept.tolist()
        )
    return reasons.tobytes(), report_ids.tobytes(), lengths.astype("<u4").tobytes(), payloads


def unpack_opened(packed: Packed) -> list[Opened]:
    """``open_packed``'s result as ``open_reports`` gives it: one (reason, report id, payload) each."""
    reasons_blob, report_ids, lengths_blob, payloads = packed
    reasons = list(reasons_blob)
    lengths = np.frombuffer(lengths_blob, dtype="<u4").tolist()
    out: list[Opened] = []
    offset = 0
    for index, (reason, length) in enumerate(zip(reasons, lengths, strict=True)):
        if reason != OK:
            out.append((reason, _REJECTED, _REJECTED))
            continue
        start = index * REPORT_ID_LENGTH
        out.append((OK, report_ids[start : start + REPORT_ID_LENGTH], payloads[offset : offset + length]))
        offset += length
    return out
