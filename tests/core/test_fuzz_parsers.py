"""Fuzzing every parser of untrusted bytes and stored state: the wire codec, the HPKE envelope and
report opener, stored shuffled batches, spool segments, keyring.json and outbox rows.

Each either returns a well-formed value or raises its one documented error, never anything else.
Default run: modest example counts (seconds); ``pytest -m slow`` runs the large profile.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from deniable.aggregator.decrypt import OK, open_reports
from deniable.aggregator.keys import KEYRING_FILE, Keyring
from deniable.client.outbox import Outbox
from deniable.core.crypto import KeyPair, seal_report
from deniable.core.crypto.envelope import DecryptionError, open_report
from deniable.core.errors import ConfigurationError
from deniable.core.wire import MalformedPlaintext, Plaintext, decode, encode
from deniable.shuffler.columns import Columns, CorruptSegment, parse_batch_wire
from deniable.v1 import deniable_pb2 as pb

QUICK = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
LONG = settings(max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck), database=None)
LENGTH = 100
PAIR = KeyPair.generate(5)

_ids = st.from_regex(r"[a-z0-9][a-z0-9._-]{0,20}", fullmatch=True)
_plaintexts = st.builds(
    Plaintext,
    report_id=st.binary(min_size=16, max_size=16),
    campaign_id=_ids,
    key_id=st.integers(0, 2**32 - 1),
    payload=st.binary(max_size=10),
)


def _decode_total(data: bytes) -> None:
    try:
        decoded = decode(data, LENGTH)
    except MalformedPlaintext:
        return
    assert encode(decoded, LENGTH) == data  # strict: one encoding per plaintext


@QUICK
@given(_plaintexts)
def test_codec_round_trips(plaintext: Plaintext) -> None:
    assert decode(encode(plaintext, LENGTH), LENGTH) == plaintext


@QUICK
@given(st.one_of(st.binary(max_size=2 * LENGTH), st.binary(min_size=LENGTH, max_size=LENGTH)))
def test_codec_random_bytes_decode_or_malformed(data: bytes) -> None:
    _decode_total(data)


@QUICK
@given(_plaintexts, st.integers(0, LENGTH - 1), st.integers(1, 255))
def test_codec_mutated_valid_bytes(plaintext: Plaintext, at: int, xor: int) -> None:
    data = bytearray(encode(plaintext, LENGTH))
    data[at] ^= xor
    _decode_total(bytes(data))


def _open_mutated(plaintext: bytes, at: int, xor: int, cut: int) -> None:
    sealed = bytearray(seal_report(plaintext, PAIR.public, "c"))
    sealed[at % len(sealed)] ^= xor
    with pytest.raises(DecryptionError):
        open_report(bytes(sealed[: len(sealed) - cut]), PAIR, "c")


@QUICK
@given(st.binary(max_size=64), st.integers(0, 10_000), st.integers(1, 255), st.integers(0, 8))
def test_envelope_any_change_fails_authentication(plaintext: bytes, at: int, xor: int, cut: int) -> None:
    """Every bit of the encapsulated key and ciphertext is authenticated: a change never opens."""
    _open_mutated(plaintext, at, xor, cut)


@QUICK
@given(st.binary(max_size=300), _ids)
def test_envelope_random_bytes_never_open(data: bytes, campaign: str) -> None:
    with pytest.raises(DecryptionError):
        open_report(data, PAIR, campaign)


@QUICK
@given(
    st.lists(
        st.tuples(st.sampled_from(["c", "d", ""]), st.integers(0, 2**32 - 1), st.binary(max_size=200)),
        max_size=6,
    )
)
def test_open_reports_gives_one_outcome_per_envelope(envelopes: list[tuple[str, int, bytes]]) -> None:
    opened = open_reports("c", LENGTH, LENGTH + 48, {PAIR.key_id: PAIR.private_raw}, envelopes)
    assert len(opened) == len(envelopes) and all(reason != OK for reason, _, _ in opened)


@QUICK
@given(st.binary(max_size=300))
def test_stored_batch_wire_parses_or_decode_error(wire: bytes) -> None:
    try:
        record = parse_batch_wire(wire)
    except Exception as exc:
        assert type(exc).__name__ == "DecodeError"
        return
    assert len(record.reports) == len(pb.ShuffledBatch.FromString(wire).reports)


@QUICK
@given(st.binary(max_size=40), st.binary(max_size=40), st.binary(max_size=200))
def test_spool_segment_blobs_load_whole_or_corrupt(key_ids: bytes, lengths: bytes, data: bytes) -> None:
    """A damaged segment is CorruptSegment, never a half-read batch (before: numpy errors or a
    silently wrong split of the ciphertexts)."""
    try:
        columns = Columns.load(key_ids, lengths, data)
    except CorruptSegment:
        return
    assert b"".join(columns.ciphertexts()) == data and len(columns.ciphertexts()) == columns.count


@QUICK
@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.binary(max_size=30)), min_size=1, max_size=8))
def test_spool_segment_round_trips(reports: list[tuple[int, bytes]]) -> None:
    columns = Columns.of([k for k, _ in reports], [c for _, c in reports])
    blobs = [bytes(b) for b in columns.blobs()]
    loaded = Columns.load(*blobs)
    assert loaded.ciphertexts() == [c for _, c in reports] and loaded.key_ids.tolist() == [
        k for k, _ in reports
    ]


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


def _keyring_documents(valid: dict[str, object]) -> st.SearchStrategy[object]:
    """Random JSON, and the valid document with one key or one entry field replaced."""
    entry = valid["keys"][0]  # type: ignore[index]

    def with_entry(field: str, value: object) -> object:
        document = json.loads(json.dumps(valid))
        document["keys"][0][field] = value
        return document

    def with_top(field: str, value: object) -> object:
        return {**valid, field: value}

    return st.one_of(
        _json,
        st.builds(with_entry, st.sampled_from(sorted(entry)), _json),
        st.builds(with_top, st.sampled_from(sorted(valid)), _json),
    )


def test_keyring_json_loads_or_configuration_error(tmp_path: Path) -> None:
    """Any keyring.json: a keyring or one ConfigurationError (a one-line exit 2 at start-up)."""
    Keyring.load_or_create(tmp_path)
    index = tmp_path / "keys" / KEYRING_FILE
    valid = json.loads(index.read_text())

    @QUICK
    @given(_keyring_documents(valid))
    def load(document: object) -> None:
        index.write_text(json.dumps(document))
        try:
            Keyring.load_or_create(tmp_path, create=False)
        except ConfigurationError as exc:
            assert "\n" not in str(exc)

    load()


def test_outbox_rows_round_trip(tmp_path: Path) -> None:
    """Whatever reports a device stores come back byte for byte, in order."""
    reports = st.builds(
        pb.EncryptedReport,
        campaign_id=_ids,
        key_id=st.integers(0, 2**32 - 1),
        ciphertext=st.binary(max_size=80),
    )

    @QUICK
    @given(st.lists(reports, max_size=6))
    def round_trip(batch: list[pb.EncryptedReport]) -> None:
        path = tmp_path / f"outbox-{os.urandom(4).hex()}.sqlite3"
        with Outbox(path) as outbox:
            outbox.add_many(batch)
            assert [row.to_proto() for row in outbox.pending(100)] == batch

    round_trip()


@pytest.mark.slow
@LONG
@given(
    st.binary(max_size=2 * LENGTH), st.binary(max_size=40), st.binary(max_size=40), st.binary(max_size=300)
)
def test_parsers_long(data: bytes, key_ids: bytes, lengths: bytes, blob: bytes) -> None:
    _decode_total(data)
    with contextlib.suppress(CorruptSegment):
        Columns.load(key_ids, lengths, blob)
    assume(len(blob) > 0)
    with pytest.raises(DecryptionError):
        open_report(blob, PAIR, "c")
