"""SQLite connections the way every Deniable store uses them: WAL, fsync on commit.

``synchronous=FULL`` in WAL mode makes every commit durable before it returns, which is what
"acknowledge only after the write is durable" relies on.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from deniable.core.errors import ConfigurationError


def open_database(path: Path) -> sqlite3.Connection:
    """Open (creating) a SQLite file in WAL mode; ConfigurationError if the place is unusable."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")
        connection.execute("PRAGMA foreign_keys=ON")
        connection.execute("CREATE TABLE IF NOT EXISTS _deniable_probe (x INTEGER)")
        connection.execute("DROP TABLE _deniable_probe")
    except (OSError, sqlite3.Error) as exc:
        raise ConfigurationError(f"cannot use database {path}: {exc}") from exc
    return connection
