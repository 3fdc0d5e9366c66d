"""The aggregator's HPKE keyring: private keys in ``keys/<id>.key`` (0600), metadata in JSON.

Rotation adds a new active key and keeps the old ones, so reports sealed to them still open.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from deniable.core.crypto import SUITE_NAME, KeyPair
from deniable.core.errors import ConfigurationError
from deniable.v1 import deniable_pb2 as pb

KEYRING_FILE: Final = "keyring.json"
KEYS_DIR: Final = "keys"
_FORMAT_VERSION: Final = 1


@dataclass(frozen=True)
class _Entry:
    """Public metadata of one key, as kept in keyring.json."""

    key_id: int
    public_key: bytes
    created_unix: int
    active: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.key_id,
            "public_key": self.public_key.hex(),
            "created_unix": self.created_unix,
            "active": self.active,
        }


class Keyring:
    """Every aggregator key pair by id, exactly one of them active (the one new campaigns use)."""

    def __init__(self, directory: Path, entries: list[_Entry], pairs: dict[int, KeyPair]) -> None:
        """Use ``load_or_create``; this only assembles an already validated keyring."""
        self._directory = directory
        self._entries = entries
        self._pairs = pairs
        self._lock = threading.Lock()

    @classmethod
    def load_or_create(cls, data_dir: Path, create: bool = True) -> Keyring:
        """Load ``data_dir/keys``; on first start (and ``create``) generate key 1.

        Raises ConfigurationError (one line) for a missing, unreadable or over-permissive key.
        """
        directory = data_dir / KEYS_DIR
        index = directory / KEYRING_FILE
        try:
            exists = index.exists()
        except OSError as exc:
            raise ConfigurationError(f"cannot read keyring {index}: {exc}") from exc
        if exists:
            return cls._load(directory, index)
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
        entry = _Entry(1, pair.public.raw, int(time.time()), True)
        keyring = cls(directory, [entry], {1: pair})
        try:
            pair.save(directory / "1.key")
            keyring._write_index()
        except OSError as exc:
            raise ConfigurationError(f"cannot write keys to {directory}: {exc}") from exc
        return keyring

    @classmethod
    def _load(cls, directory: Path, index: Path) -> Keyring:
        try:
            document = json.loads(index.read_text(encoding="utf-8"))
            raw_entries = document["keys"]
            entries = [
                _Entry(
                    key_id=int(item["id"]),
                    public_key=bytes.fromhex(item["public_key"]),
                    created_unix=int(item["created_unix"]),
                    active=bool(item["active"]),
                )
                for item in raw_entries
            ]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigurationError(f"keyring {index} is unreadable or malformed: {exc}") from exc
        if not entries or sum(e.active for e in entries) != 1:
            raise ConfigurationError(f"keyring {index} must list keys with exactly one active")
        if len({e.key_id for e in entries}) != len(entries):
            raise ConfigurationError(f"keyring {index} lists a key id twice")
        pairs: dict[int, KeyPair] = {}
        for entry in entries:
            path = directory / f"{entry.key_id}.key"
            try:
                pair = KeyPair.load(path, entry.key_id)
            except FileNotFoundError as exc:
                raise ConfigurationError(f"keyring names key {entry.key_id} but {path} is missing") from exc
            except PermissionError as exc:
                raise ConfigurationError(f"{exc}; run chmod 600 {path}") from exc
            except (OSError, ValueError) as exc:
                raise ConfigurationError(f"cannot load key {entry.key_id} from {path}: {exc}") from exc
            if pair.public.raw != entry.public_key:
                raise ConfigurationError(f"key file {path} does not match the public key in {index}")
            pairs[entry.key_id] = pair
        return cls(directory, entries, pairs)

    def _write_index(self) -> None:
        """Atomically replace keyring.json (write, fsync, rename)."""
        index = self._directory / KEYRING_FILE
        temporary = index.with_suffix(".json.tmp")
        body = json.dumps(
            {"version": _FORMAT_VERSION, "keys": [e.to_json() for e in self._entries]}, indent=2
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
        """The key new campaigns are created with."""
        with self._lock:
            entry = next(e for e in self._entries if e.active)
            return self._pairs[entry.key_id]

    def get(self, key_id: int) -> KeyPair | None:
        """The key pair with this id, or None if the aggregator never had it."""
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
                    hpke_suite=SUITE_NAME,
                    active=e.active,
                    created_unix=e.created_unix,
                )
                for e in sorted(self._entries, key=lambda e: e.key_id)
            ]

    def rotate(self) -> KeyPair:
        """Generate a new active key; old keys stay so reports sealed to them still decrypt."""
        with self._lock:
            new_id = max(e.key_id for e in self._entries) + 1
            pair = KeyPair.generate(new_id)
            previous = self._entries
            self._entries = [
                *(_Entry(e.key_id, e.public_key, e.created_unix, False) for e in previous),
                _Entry(new_id, pair.public.raw, int(time.time()), True),
            ]
            try:
                pair.save(self._directory / f"{new_id}.key")
                self._write_index()
            except OSError as exc:
                self._entries = previous
                raise ConfigurationError(f"cannot write rotated key to {self._directory}: {exc}") from exc
            self._pairs[new_id] = pair
            return pair
