"""SQLite-specific store behaviour (the shared behaviour lives in the contract suite)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from deniable.aggregator import AggregatorConfig, start_aggregator
from deniable.aggregator.server import DATABASE_FILE
from deniable.aggregator.store import SCHEMA_VERSION, SqliteAggregatorStore
from deniable.core.errors import ConfigurationError


async def test_wal_mode_and_schema_version(tmp_path: Path) -> None:
    store = SqliteAggregatorStore(tmp_path / "a.sqlite3")
    await store.close()
    with sqlite3.connect(tmp_path / "a.sqlite3") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2


async def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "a.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA user_version = 99")
    with pytest.raises(ConfigurationError, match="schema version 99"):
        SqliteAggregatorStore(path)


async def test_corrupt_database_stops_startup(tmp_path: Path) -> None:
    data_dir = tmp_path / "agg"
    data_dir.mkdir()
    (data_dir / DATABASE_FILE).write_bytes(b"this is not a database" * 100)
    with pytest.raises(ConfigurationError) as err:
        await start_aggregator(AggregatorConfig(insecure=True, data_dir=data_dir, listen="127.0.0.1:0"))
    assert "\n" not in str(err.value)
