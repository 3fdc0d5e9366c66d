"""Fixtures for the aggregator tests: store implementations, keyrings, real sealed reports."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from support.aggregator_kit import Kit, StoreFactory, StoreOpener

from deniable.aggregator.handlers import AggregatorHandlers
from deniable.aggregator.keys import Keyring
from deniable.aggregator.metrics import AggregatorMetrics
from deniable.aggregator.store import AggregatorStore, SqliteAggregatorStore
from deniable.aggregator.store_postgres import PostgresAggregatorStore

# ---------------------------------------------------------------- store implementations
#
# Every implementation of AggregatorStore appears here once; the contract suite runs on all.
# A factory is an async context manager giving an opener: each call opens the *same* backing
# storage again (for durability tests and for several stores/replicas on one database). The
# PostgreSQL factory needs a real server: if its binaries are missing the tests fail (never skip).
# The opener types and the report-building Kit: tests/support/aggregator_kit.py.

# postgres_server and postgres_dsn: tests/conftest.py (shared with the shuffler's spool tests).


@asynccontextmanager
async def _sqlite_opener(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreOpener]:
    path = tmp_path / "aggregator.sqlite3"

    async def open_store() -> AggregatorStore:
        return SqliteAggregatorStore(path)

    yield open_store


@asynccontextmanager
async def _postgres_opener(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreOpener]:
    server = request.getfixturevalue("postgres_server")
    name = await server.create_database()

    async def open_store() -> AggregatorStore:
        return await PostgresAggregatorStore.connect(server.dsn(name), pool_size=4)

    try:
        yield open_store
    finally:
        await server.drop_database(name)


STORE_FACTORIES: list[tuple[str, StoreFactory]] = [
    ("sqlite", _sqlite_opener),
    ("postgres", _postgres_opener),
]


@pytest.fixture(params=[name for name, _ in STORE_FACTORIES])
async def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreOpener]:
    """Opener for a fresh, empty store of each implementation; closes whatever it opened."""
    factory = dict(STORE_FACTORIES)[request.param]
    async with factory(request, tmp_path) as opener:
        opened: list[AggregatorStore] = []

        async def tracked() -> AggregatorStore:
            store = await opener()
            opened.append(store)
            return store

        try:
            yield tracked
        finally:
            for store in opened:
                await store.close()


@pytest.fixture
async def store(open_store: StoreOpener) -> AggregatorStore:
    """One open store of each implementation."""
    return await open_store()


# ---------------------------------------------------------------- keys, handlers, reports


@pytest.fixture
def keyring(tmp_path: Path) -> Keyring:
    """A fresh keyring in its own data directory."""
    return Keyring.load_or_create(tmp_path / "data")


@pytest.fixture
async def handlers(tmp_path: Path, keyring: Keyring) -> AsyncIterator[AggregatorHandlers]:
    """Handlers over a real SQLite store, decrypting on the default thread executor."""
    store = SqliteAggregatorStore(tmp_path / "handlers.sqlite3")
    yield AggregatorHandlers(store, keyring, AggregatorMetrics())
    await store.close()


@pytest.fixture
def kit() -> Kit:
    """Report-building helpers."""
    return Kit()
