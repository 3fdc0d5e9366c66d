"""Keyring: creation, 0600 keys, reload, refusal of unsafe or missing keys, rotation, the signing
key, per-KEM active keys and destruction."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from deniable.aggregator.keys import Keyring, KeyStateError
from deniable.core.crypto import KEM_HYBRID, SUITE_NAME, open_report, seal_report
from deniable.core.errors import ConfigurationError


def test_first_start_creates_key_one_readable_by_owner_only(tmp_path: Path) -> None:
    keyring = Keyring.load_or_create(tmp_path)
    assert keyring.active.key_id == 1
    key_file = tmp_path / "keys" / "1.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    document = json.loads((tmp_path / "keys" / "keyring.json").read_text())
    (entry,) = document["keys"]
    assert entry["id"] == 1 and entry["active"] is True
    assert bytes.fromhex(entry["public_key"]) == keyring.active.public.raw
    assert entry["created_unix"] > 0
    assert "private" not in json.dumps(document)


def test_reload_gives_the_same_key(tmp_path: Path) -> None:
    first = Keyring.load_or_create(tmp_path)
    again = Keyring.load_or_create(tmp_path)
    assert again.active == first.active
    assert again.infos() == first.infos()
    (info,) = again.infos()
    assert (info.key_id, info.active, info.hpke_suite) == (1, True, SUITE_NAME)


def test_refuses_key_readable_by_others(tmp_path: Path) -> None:
    Keyring.load_or_create(tmp_path)
    (tmp_path / "keys" / "1.key").chmod(0o644)
    with pytest.raises(ConfigurationError) as err:
        Keyring.load_or_create(tmp_path)
    assert "\n" not in str(err.value) and "1.key" in str(err.value)


def test_refuses_missing_key_file(tmp_path: Path) -> None:
    Keyring.load_or_create(tmp_path)
    (tmp_path / "keys" / "1.key").unlink()
    with pytest.raises(ConfigurationError, match="missing"):
        Keyring.load_or_create(tmp_path)


def test_refuses_key_that_does_not_match_keyring(tmp_path: Path) -> None:
    Keyring.load_or_create(tmp_path)
    key_file = tmp_path / "keys" / "1.key"
    key_file.write_bytes(bytes(range(32)))
    with pytest.raises(ConfigurationError, match="does not match"):
        Keyring.load_or_create(tmp_path)


def test_refuses_malformed_keyring(tmp_path: Path) -> None:
    Keyring.load_or_create(tmp_path)
    (tmp_path / "keys" / "keyring.json").write_text("{not json")
    with pytest.raises(ConfigurationError, match="malformed"):
        Keyring.load_or_create(tmp_path)


def test_does_not_overwrite_keys_without_keyring(tmp_path: Path) -> None:
    Keyring.load_or_create(tmp_path)
    (tmp_path / "keys" / "keyring.json").unlink()
    with pytest.raises(ConfigurationError, match=r"no keyring\.json"):
        Keyring.load_or_create(tmp_path)


def test_create_false_requires_existing_keyring(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError):
        Keyring.load_or_create(tmp_path, create=False)
    assert not (tmp_path / "keys").exists()


def test_rotate_keeps_old_keys_decrypting(tmp_path: Path) -> None:
    keyring = Keyring.load_or_create(tmp_path)
    old = keyring.active
    sealed = seal_report(b"x" * 96, old.public, "camp")
    new = keyring.rotate()
    assert new.key_id == 2 and keyring.active == new
    assert stat.S_IMODE((tmp_path / "keys" / "2.key").stat().st_mode) == 0o600
    reloaded = Keyring.load_or_create(tmp_path)
    assert reloaded.active == new
    old_again = reloaded.get(1)
    assert old_again == old
    assert open_report(sealed, old_again, "camp") == b"x" * 96
    assert reloaded.get(3) is None
    assert [(i.key_id, i.active) for i in reloaded.infos()] == [(1, False), (2, True)]
    assert set(reloaded.private_keys()) == {1, 2}


def test_signing_key_is_created_owner_only_and_pinned_in_the_index(tmp_path: Path) -> None:
    keyring = Keyring.load_or_create(tmp_path)
    path = tmp_path / "keys" / "signing.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    document = json.loads((tmp_path / "keys" / "keyring.json").read_text())
    assert document["signing_public_key"] == keyring.signing.public_raw.hex()
    assert Keyring.load_or_create(tmp_path).signing == keyring.signing
    path.chmod(0o644)
    with pytest.raises(ConfigurationError, match=r"signing\.key"):
        Keyring.load_or_create(tmp_path)
    path.chmod(0o600)
    path.write_bytes(bytes(32))  # another key than the index names
    with pytest.raises(ConfigurationError, match="does not match"):
        Keyring.load_or_create(tmp_path)


def test_keyring_from_before_signatures_gets_a_signing_key(tmp_path: Path) -> None:
    Keyring.load_or_create(tmp_path)
    index = tmp_path / "keys" / "keyring.json"
    document = json.loads(index.read_text())
    del document["signing_public_key"]
    for entry in document["keys"]:
        del entry["state"], entry["kem"]
    index.write_text(json.dumps({**document, "version": 1}))
    (tmp_path / "keys" / "signing.key").unlink()
    with pytest.raises(ConfigurationError, match="missing"):
        Keyring.load_or_create(tmp_path, create=False)
    upgraded = Keyring.load_or_create(tmp_path)
    assert json.loads(index.read_text())["signing_public_key"] == upgraded.signing.public_raw.hex()
    assert [(i.key_id, i.state, i.kem) for i in upgraded.infos()] == [(1, "active", "x25519")]


def test_rotation_is_per_kem_and_destroy_overwrites_then_removes(tmp_path: Path) -> None:
    keyring = Keyring.load_or_create(tmp_path)
    hybrid = keyring.active_or_create(KEM_HYBRID)
    assert (hybrid.key_id, keyring.active.key_id) == (2, 1)  # the X25519 key stays active
    assert keyring.active_or_create(KEM_HYBRID) == hybrid
    keyring.rotate()
    assert [(i.key_id, i.state, i.kem) for i in keyring.infos()] == [
        (1, "retired", "x25519"),
        (2, "active", KEM_HYBRID),
        (3, "active", "x25519"),
    ]
    for key_id in (2, 3):
        with pytest.raises(KeyStateError, match="active"):
            keyring.destroy(key_id)
    key_file = tmp_path / "keys" / "1.key"
    written: list[bytes] = []
    real_unlink = Path.unlink

    def spy(path: Path, missing_ok: bool = False) -> None:
        written.append(path.read_bytes())  # what the file held just before removal
        real_unlink(path, missing_ok)

    original = keyring.get(1)
    assert original is not None
    Path.unlink = spy  # type: ignore[method-assign, assignment]
    try:
        keyring.destroy(1)
    finally:
        Path.unlink = real_unlink  # type: ignore[method-assign]
    assert not key_file.exists() and keyring.get(1) is None
    assert len(written) == 1 and len(written[0]) == 32 and written[0] != original.private_raw
    with pytest.raises(KeyStateError, match="destroyed"):
        keyring.destroy(1)
    reloaded = Keyring.load_or_create(tmp_path)  # a destroyed entry needs no file
    assert [(i.key_id, i.state) for i in reloaded.infos()] == [(1, "destroyed"), (2, "active"), (3, "active")]
    assert set(reloaded.private_keys()) == {2, 3}
