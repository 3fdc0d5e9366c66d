"""The aggregator's keyring: HPKE private keys in ``keys/<id>.key`` and the Ed25519 campaign signing
key in ``keys/signing.key`` (all 0600), public metadata in ``keys/keyring.json``.

Rotation adds a new active key per KEM and retires the old one, which stays so reports sealed to
it still open; once every campaign sealed to it is closed and drained, ``destroy`` overwrites and
removes its file (the entry stays, marked destroyed).
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

from deniable.core.crypto import KEM_X25519, KeyPair, SigningKey, kem_named
from deniable.core.errors import ConfigurationError
from deniable.v1 import deniable_pb2 as pb

KEYRING_FILE: Final = "keyring.json"
KEYS_DIR: Final = "keys"
SIGNING_FILE: Final = "signing.key"
ACTIVE: Final = "active"
RETIRED: Final = "retired"
DESTROYED: Final = "destroyed"
_STATES: Final = (ACTIVE, RETIRED, DESTROYED)
_FORMAT_VERSION: Final = 2


class KeyStateError(Exception):
    """A key operation that the key's state forbids (destroying the active key, an unknown id)."""


@dataclass(frozen=True)
class _Entry:
    """Public metadata of one key, as kept in keyring.json."""

    key_id: int
    public_key: bytes
    created_unix: int
    state: str = ACTIVE
    kem: str = KEM_X25519

    @property
    def active(self) -> bool:
        """Whether new campaigns of this KEM use the key."""
        return self.state == ACTIVE

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.key_id,
            "public_key": self.public_key.hex(),
            "created_unix": self.created_unix,
            "active": self.active,
            "state": self.state,
            "kem": self.kem,
        }

    @classmethod
    def from_json(cls, item: dict[str, Any]) -> _Entry:
        """An entry of keyring.json (version 1 entries have no state or KEM)."""
        state = str(item.get("state", ACTIVE if item["active"] else RETIRED))
        if state not in _STATES:
            raise ValueError(f"unknown key state {state!r}")
        return cls(
            key_id=int(item["id"]),
            public_key=bytes.fromhex(item["public_key"]),
            created_unix=int(item["created_unix"]),
            state=state,
            kem=kem_named(str(item.get("kem", KEM_X25519))).name,
        )


class Keyring:
    """Every aggregator key pair by id, one active per KEM (the one new campaigns use), and the
    campaign signing key."""

    def __init__(
        self, directory: Path, entries: list[_Entry], pairs: dict[int, KeyPair], signing: SigningKey
    ) -> None:
        """Use ``load_or_create``; this only assembles an already validated keyring."""
        self._directory = directory
        self._entries = entries
        self._pairs = pairs
        self.signing = signing
        self._lock = threading.Lock()

    @classmethod
    def load_or_create(cls, data_dir: Path, create: bool = True, key_group: int | None = None) -> Keyring:
        """Load ``data_dir/keys``; on first start (and ``create``) generate key 1.

        Raises ConfigurationError (one line) for a missing, unreadable or over-permissive key; key files
        may be shared with ``key_group`` only (the pod's fsGroup, ADR 0020).
        """
        directory = data_dir / KEYS_DIR
        index = directory / KEYRING_FILE
        try:
            exists = index.exists()
        except OSError as exc:
            raise ConfigurationError(f"cannot read keyring {index}: {exc}") from exc
        if exists:
            return cls._load(directory, index, create, key_group)
        if not create:
            raise ConfigurationError(f"no keyring at {index}; start the aggregator once to create one")
        return cls._create(directory)

    @classmethod
    def _create(cls, directory: Path) -> Keyring:
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            orphans = sorted(p.name for p in directory.glob("*.key"))
        except OSError as exc:
            raise ConfigurationError(f"cannot create key directory {directory}: {exc}") from exc
        if orphans:
            raise ConfigurationError(
                f"{directory} holds private keys ({', '.join(orphans)}) but no {KEYRING_FILE};"
                " restore it or move the keys away"
            )
        pair = KeyPair.generate(1)
        entry = _Entry(1, pair.public.raw, int(time.time()))
        keyring = cls(directory, [entry], {1: pair}, SigningKey.generate())
        try:
            pair.save(directory / "1.key")
            keyring.signing.save(directory / SIGNING_FILE)
            keyring._write_index()
        except OSError as exc:
            raise ConfigurationError(f"cannot write keys to {directory}: {exc}") from exc
        return keyring

    @classmethod
    def _load(cls, directory: Path, index: Path, create: bool, key_group: int | None) -> Keyring:
        try:
            document = json.loads(index.read_text(encoding="utf-8"))
            entries = [_Entry.from_json(item) for item in document["keys"]]
            pinned = document.get("signing_public_key")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigurationError(f"keyring {index} is unreadable or malformed: {exc}") from exc
        active = [e.kem for e in entries if e.active]
        if active.count(KEM_X25519) != 1 or len(set(active)) != len(active):
            raise ConfigurationError(
                f"keyring {index} must list exactly one active key per KEM (x25519 among them)"
            )
        if len({e.key_id for e in entries}) != len(entries):
            raise ConfigurationError(f"keyring {index} lists a key id twice")
        pairs = cls._load_pairs(directory, index, entries, key_group)
        signing = cls._load_signing(directory, index, pinned, create, key_group)
        keyring = cls(directory, entries, pairs, signing)
        if pinned is None and create:  # record the signing key of an upgraded keyring
            try:
                keyring._write_index()
            except OSError as exc:
                raise ConfigurationError(f"cannot update keyring {index}: {exc}") from exc
        return keyring

    @staticmethod
    def _load_signing(
        directory: Path, index: Path, pinned: object, create: bool, key_group: int | None
    ) -> SigningKey:
        """The signing key; a keyring from before signatures gets one (when ``create``)."""
        path = directory / SIGNING_FILE
        if pinned is None and not path.exists() and create:
            signing = SigningKey.generate()
            try:
                signing.save(path)
            except OSError as exc:
                raise ConfigurationError(f"cannot write signing key {path}: {exc}") from exc
            return signing
        try:
            signing = SigningKey.load(path, key_group)
        except (OSError, ValueError) as exc:
            missing = f"keyring {index} has no signing key: {path} is missing"
            raise _key_file_error(exc, path, missing, f"cannot load signing key {path}") from exc
        if pinned is not None and pinned != signing.public_raw.hex():
            raise ConfigurationError(f"signing key {path} does not match the one in {index}")
        return signing

    @staticmethod
    def _load_pairs(
        directory: Path, index: Path, entries: list[_Entry], key_group: int | None
    ) -> dict[int, KeyPair]:
        """Every key pair not destroyed, checked against its public key."""
        pairs: dict[int, KeyPair] = {}
        for entry in entries:
            if entry.state == DESTROYED:
                continue
            path = directory / f"{entry.key_id}.key"
            try:
                pair = KeyPair.load(path, entry.key_id, key_group)
            except (OSError, ValueError) as exc:
                missing = f"keyring names key {entry.key_id} but {path} is missing"
                raise _key_file_error(
                    exc, path, missing, f"cannot load key {entry.key_id} from {path}"
                ) from exc
            if pair.public.raw != entry.public_key or pair.kem.name != entry.kem:
                raise ConfigurationError(f"key file {path} does not match the public key in {index}")
            pairs[entry.key_id] = pair
        return pairs

    def _write_index(self) -> None:
        """Atomically replace keyring.json (write, fsync, rename)."""
        index = self._directory / KEYRING_FILE
        temporary = index.with_suffix(".json.tmp")
        body = json.dumps(
            {
                "version": _FORMAT_VERSION,
                "signing_public_key": self.signing.public_raw.hex(),
                "keys": [e.to_json() for e in self._entries],
            },
            indent=2,
        )
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, body.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, index)
        directory_fd = os.open(self._directory, os.O_RDONLY)
        try:
            os.fsync(directory_fd)
        finally:
            os.close(directory_fd)

    @property
    def active(self) -> KeyPair:
        """The X25519 key new campaigns are created with by default."""
        pair = self.active_for(KEM_X25519)
        assert pair is not None  # checked on load
        return pair

    def active_for(self, kem: str) -> KeyPair | None:
        """The active key of ``kem``, or None if the keyring has none yet."""
        with self._lock:
            entry = next((e for e in self._entries if e.active and e.kem == kem), None)
            return None if entry is None else self._pairs[entry.key_id]

    def active_or_create(self, kem: str) -> KeyPair:
        """The active key of ``kem``, made on first use (the hybrid KEM's first campaign)."""
        return self.active_for(kem) or self.rotate(kem)

    def get(self, key_id: int) -> KeyPair | None:
        """The key pair with this id, or None if the aggregator never had it (or destroyed it)."""
        with self._lock:
            return self._pairs.get(key_id)

    def private_keys(self) -> dict[int, bytes]:
        """Raw private keys by id: plain data for decrypt workers in other processes."""
        with self._lock:
            return {key_id: pair.private_raw for key_id, pair in self._pairs.items()}

    def infos(self) -> list[pb.KeyInfo]:
        """Public description of every key, oldest first."""
        with self._lock:
            return [
                pb.KeyInfo(
                    key_id=e.key_id,
                    public_key=e.public_key,
                    hpke_suite=kem_named(e.kem).suite_name,
                    active=e.active,
                    created_unix=e.created_unix,
                    state=e.state,
                    kem=e.kem,
                )
                for e in sorted(self._entries, key=lambda e: e.key_id)
            ]

    def state_of(self, key_id: int) -> str | None:
        """The key's state, or None for an id the keyring never had."""
        with self._lock:
            return next((e.state for e in self._entries if e.key_id == key_id), None)

    def rotate(self, kem: str = KEM_X25519) -> KeyPair:
        """Generate a new active key of ``kem``; its predecessor is retired and still decrypts."""
        kem = kem_named(kem).name
        with self._lock:
            new_id = max(e.key_id for e in self._entries) + 1
            pair = KeyPair.generate(new_id, kem)
            previous = self._entries
            self._entries = [
                *(replace(e, state=RETIRED) if e.active and e.kem == kem else e for e in previous),
                _Entry(new_id, pair.public.raw, int(time.time()), ACTIVE, kem),
            ]
            try:
                pair.save(self._directory / f"{new_id}.key")
                self._write_index()
            except OSError as exc:
                self._entries = previous
                raise ConfigurationError(f"cannot write rotated key to {self._directory}: {exc}") from exc
            self._pairs[new_id] = pair
            return pair

    def destroy(self, key_id: int) -> None:
        """Overwrite a retired key's file, fsync, remove it; the entry stays, marked destroyed.

        KeyStateError for an unknown, active or already destroyed key. The caller checks that no
        open campaign is sealed to it.
        """
        with self._lock:
            entry = next((e for e in self._entries if e.key_id == key_id), None)
            if entry is None or entry.state != RETIRED:
                state = "unknown" if entry is None else entry.state
                raise KeyStateError(f"key {key_id} is {state}: only a retired key can be destroyed")
            path = self._directory / f"{key_id}.key"
            _shred(path)
            self._pairs.pop(key_id, None)
            self._entries = [replace(e, state=DESTROYED) if e.key_id == key_id else e for e in self._entries]
            self._write_index()


def _shred(path: Path) -> None:
    """Overwrite the file with random bytes of its length, fsync, then remove it and fsync the folder."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, os.urandom(os.fstat(fd).st_size))
        os.fsync(fd)
    finally:
        os.close(fd)
    path.unlink()
    directory_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory_fd)
    finally:
        os.close(directory_fd)


def _key_file_error(exc: Exception, path: Path, missing: str, unreadable: str) -> ConfigurationError:
    """One line for a key file that cannot be loaded: missing, open to others, or unreadable."""
    if isinstance(exc, FileNotFoundError):
        return ConfigurationError(missing)
    if isinstance(exc, PermissionError):
        return ConfigurationError(f"{exc}; run chmod 600 {path}")
    return ConfigurationError(f"{unreadable}: {exc}")
