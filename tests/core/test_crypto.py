"""The HPKE envelope and aggregator key files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from deniable.core.crypto import (
    HPKE_OVERHEAD,
    SUITE_NAME,
    DecryptionError,
    KeyPair,
    PublicKey,
    ciphertext_length,
    envelope_info,
    open_report,
    seal_report,
)
from deniable.core.wire import Plaintext, encode, plaintext_length

CAMPAIGN = "languages-2026"


@pytest.fixture(scope="module")
def key_pair() -> KeyPair:
    return KeyPair.generate(key_id=3)


def plaintext(payload: bytes = b"\x05") -> bytes:
    length = plaintext_length(len(payload))
    return encode(Plaintext(bytes(16), CAMPAIGN, 3, payload), length)


def test_suite_and_overhead() -> None:
    assert SUITE_NAME == "X25519-HKDF-SHA256-CHACHA20POLY1305"
    assert HPKE_OVERHEAD == 48
    assert ciphertext_length(96) == 144


@pytest.mark.parametrize("size", [0, 1, 96, 112, 4096])
def test_round_trip_and_exact_length(key_pair: KeyPair, size: int) -> None:
    message = os.urandom(size)
    sealed = seal_report(message, key_pair.public, CAMPAIGN)
    assert len(sealed) == size + 48 == ciphertext_length(size)
    assert open_report(sealed, key_pair, CAMPAIGN) == message


def test_sealing_is_randomised(key_pair: KeyPair) -> None:
    message = plaintext()
    first, second = (
        seal_report(message, key_pair.public, CAMPAIGN),
        seal_report(message, key_pair.public, CAMPAIGN),
    )
    assert first != second
    assert first[:32] != second[:32]  # fresh encapsulated key each time


def test_wrong_campaign_fails(key_pair: KeyPair) -> None:
    sealed = seal_report(plaintext(), key_pair.public, CAMPAIGN)
    for other in ("languages-2027", "languages-202", CAMPAIGN + "x", ""):
        with pytest.raises(DecryptionError):
            open_report(sealed, key_pair, other)


def test_wrong_key_id_fails(key_pair: KeyPair) -> None:
    """Same private key, other key id: the info binds the id, so it must not open."""
    sealed = seal_report(plaintext(), key_pair.public, CAMPAIGN)
    for key_id in (0, 2, 4, 2**32 - 1):
        relabelled = KeyPair(key_id=key_id, private_raw=key_pair.private_raw)
        with pytest.raises(DecryptionError):
            open_report(sealed, relabelled, CAMPAIGN)
    relabelled_public = PublicKey(key_id=4, raw=key_pair.public.raw)
    with pytest.raises(DecryptionError):
        open_report(seal_report(plaintext(), relabelled_public, CAMPAIGN), key_pair, CAMPAIGN)


def test_wrong_private_key_fails(key_pair: KeyPair) -> None:
    sealed = seal_report(plaintext(), key_pair.public, CAMPAIGN)
    with pytest.raises(DecryptionError):
        open_report(sealed, KeyPair.generate(key_id=3), CAMPAIGN)


def test_every_tampered_byte_fails(key_pair: KeyPair) -> None:
    sealed = seal_report(plaintext(), key_pair.public, CAMPAIGN)
    for position in range(len(sealed)):
        for flip in (0x01, 0x80):
            tampered = bytearray(sealed)
            tampered[position] ^= flip
            with pytest.raises(DecryptionError):
                open_report(bytes(tampered), key_pair, CAMPAIGN)


def test_truncated_or_extended_ciphertexts_fail(key_pair: KeyPair) -> None:
    sealed = seal_report(plaintext(), key_pair.public, CAMPAIGN)
    for bad in (b"", sealed[:1], sealed[:31], sealed[:32], sealed[:47], sealed[:-1], sealed + b"\x00"):
        with pytest.raises(DecryptionError):
            open_report(bad, key_pair, CAMPAIGN)
    with pytest.raises(DecryptionError):
        open_report(bytes(len(sealed)), key_pair, CAMPAIGN)  # all-zero enc: a low-order point


def test_envelope_info_is_unambiguous() -> None:
    pairs = [("a", 1), ("ab", 1), ("a", 256), ("b", 1), ("a" * 63, 0), ("a" * 62, 97), ("", 0)]
    infos = {envelope_info(c, k) for c, k in pairs}
    assert len(infos) == len(pairs)
    assert envelope_info("ab", 1).startswith(b"deniable/v1/report")


# --------------------------------------------------------------------------- keys


def test_public_key_validation() -> None:
    raw = KeyPair.generate(1).public.raw
    assert len(raw) == 32
    assert PublicKey(key_id=0, raw=raw).key_id == 0
    assert PublicKey(key_id=2**32 - 1, raw=raw).key_id == 2**32 - 1
    for bad_raw in (b"", raw[:31], raw + b"\x00"):
        with pytest.raises(ValueError):
            PublicKey(key_id=1, raw=bad_raw)
    for bad_id in (-1, 2**32, 2**40):
        with pytest.raises(ValueError):
            PublicKey(key_id=bad_id, raw=raw)


def test_generated_keys_differ_and_public_half_is_stable() -> None:
    a, b = KeyPair.generate(1), KeyPair.generate(1)
    assert a.private_raw != b.private_raw
    assert a.public.raw != b.public.raw
    assert a.public == a.public
    assert a.public.key_id == 1


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_key_file_is_written_0600_and_loads(tmp_path: Path) -> None:
    pair = KeyPair.generate(key_id=9)
    path = tmp_path / "keys" / "agg-9.key"
    old = os.umask(0)
    try:
        pair.save(path)
    finally:
        os.umask(old)
    assert _mode(path) == 0o600
    assert path.read_bytes() == pair.private_raw
    loaded = KeyPair.load(path, key_id=9)
    assert loaded == pair
    sealed = seal_report(b"hello", pair.public, CAMPAIGN)
    assert open_report(sealed, loaded, CAMPAIGN) == b"hello"


def test_save_over_a_world_readable_file_makes_it_private(tmp_path: Path) -> None:
    path = tmp_path / "agg.key"
    path.write_bytes(b"x" * 64)
    path.chmod(0o644)
    pair = KeyPair.generate(key_id=1)
    pair.save(path)
    assert _mode(path) == 0o600
    assert path.read_bytes() == pair.private_raw


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o606, 0o610, 0o601, 0o777])
def test_load_refuses_keys_others_can_access(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "agg.key"
    KeyPair.generate(key_id=1).save(path)
    path.chmod(mode)
    with pytest.raises(PermissionError):
        KeyPair.load(path, key_id=1)


def test_load_accepts_owner_only_modes_and_rejects_wrong_sizes(tmp_path: Path) -> None:
    path = tmp_path / "agg.key"
    KeyPair.generate(key_id=1).save(path)
    path.chmod(0o400)
    assert KeyPair.load(path, key_id=1).key_id == 1
    short = tmp_path / "short.key"
    short.write_bytes(bytes(31))
    short.chmod(0o600)
    with pytest.raises(ValueError):
        KeyPair.load(short, key_id=1)
    with pytest.raises(FileNotFoundError):
        KeyPair.load(tmp_path / "missing.key", key_id=1)
