"""PostgreSQL-specific store behaviour: schema, isolation, configuration errors, the service on it.

The shared behaviour lives in the contract suite (test_store_contract.py), which runs on both stores.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg
import numpy as np
import numpy.typing as npt
import pytest
from support.processes import free_port

from deniable.aggregator import AggregatorConfig, start_aggregator
from deniable.aggregator.ingest_plan import Counting, plan_ingest
from deniable.aggregator.server import DATABASE_FILE, open_store
from deniable.aggregator.store import SqliteAggregatorStore
from deniable.aggregator.store_postgres import SCHEMA_VERSION, PostgresAggregatorStore
from deniable.cli.main import main
from deniable.core.errors import ConfigurationError
from deniable.core.plumbing.dsn import describe_dsn
from deniable.core.plumbing.service import insecure_channel
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc

if TYPE_CHECKING:  # the kit fixture's type only
    from support.aggregator_kit import Kit


def _campaign(campaign_id: str = "c1") -> pb.Campaign:
    return pb.Campaign(id=campaign_id, question="q", kind=pb.BINARY, mechanism=pb.BINARY_RR, epsilon0=1.0)


def _count_ones(payloads: Sequence[bytes]) -> npt.NDArray[np.int64]:
    return np.array([0, len(payloads)], dtype=np.int64)


async def test_schema_and_version_are_created_once(postgres_dsn: str) -> None:
    # Replicas starting together: the advisory lock serialises schema creation.
    stores = await asyncio.gather(
        *(PostgresAggregatorStore.connect(postgres_dsn, pool_size=1) for _ in range(4))
    )
    for store in stores:
        await store.close()
    db = await asyncpg.connect(postgres_dsn)
    try:
        assert [tuple(r) for r in await db.fetch("SELECT version FROM schema_version")] == [(SCHEMA_VERSION,)]
        tables = {r[0] for r in await db.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        assert {"campaigns", "counts", "rejections", "batches", "seen_reports", "schema_version"} <= tables
    finally:
        await db.close()


async def test_newer_schema_is_refused(postgres_dsn: str) -> None:
    store = await PostgresAggregatorStore.connect(postgres_dsn, pool_size=1)
    await store.close()
    db = await asyncpg.connect(postgres_dsn)
    try:
        await db.execute("UPDATE schema_version SET version = 99")
    finally:
        await db.close()
    with pytest.raises(ConfigurationError, match="schema version 99") as err:
        await PostgresAggregatorStore.connect(postgres_dsn, pool_size=1)
    assert "\n" not in str(err.value)


async def test_serializable_server_default_does_not_change_the_outcome(postgres_dsn: str) -> None:
    """The store sets READ COMMITTED itself: a stricter database default must not make a raced
    batch fail with a serialization error instead of being acknowledged as a duplicate."""
    db = await asyncpg.connect(postgres_dsn)
    try:
        name = await db.fetchval("SELECT current_database()")
        await db.execute(f'ALTER DATABASE "{name}" SET default_transaction_isolation = serializable')
    finally:
        await db.close()
    first = await PostgresAggregatorStore.connect(postgres_dsn, pool_size=2)
    second = await PostgresAggregatorStore.connect(postgres_dsn, pool_size=2)
    try:
        await first.create_campaign(_campaign())
        for i in range(4):
            valid = [(os.urandom(16), b"\x01") for _ in range(100)]
            outs = await asyncio.gather(
                *(
                    store.apply(
                        plan_ingest(
                            batch_id=f"b{i}",
                            campaign_id="c1",
                            digest=b"d",
                            batch_size=100,
                            valid_reports=valid,
                            rejected={},
                            counting=Counting(cells=2, count_cells=_count_ones),
                        )
                    )
                    for store in (first, second)
                )
            )
            assert sorted(o.duplicate_batch for o in outs) == [False, True]
        snap = await second.snapshot("c1", 2)
        assert (snap.counts, snap.batches) == ([0, 400], 4)
    finally:
        await first.close()
        await second.close()


def test_dsn_description_hides_the_password() -> None:
    assert describe_dsn("postgresql://agg:s3cret@db.internal:5433/counts?sslmode=require&password=x") == (
        "postgresql://agg@db.internal:5433/counts"
    )
    assert describe_dsn("postgres://db/counts") == "postgres://db/counts"


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("postgresql://agg:s3cret@127.0.0.1:{free_port}/counts", "cannot connect to PostgreSQL"),
        ("postgresql://agg:s3cret@127.0.0.1:notaport/counts", "cannot connect to PostgreSQL"),
        ("mysql://agg:s3cret@127.0.0.1/counts", "must be a postgresql:// DSN"),
        ("counts.sqlite3", "must be a postgresql:// DSN"),
    ],
)
async def test_unusable_store_stops_startup_in_one_line(tmp_path: Path, dsn: str, expected: str) -> None:
    """The port nobody listens on is picked when the test runs (the same test ids in every xdist worker)."""
    dsn = dsn.replace("{free_port}", str(free_port()))
    with pytest.raises(ConfigurationError) as err:
        await start_aggregator(
            AggregatorConfig(insecure=True, data_dir=tmp_path / "agg", listen="127.0.0.1:0", store=dsn)
        )
    message = str(err.value)
    assert expected in message and "\n" not in message and "s3cret" not in message, message


async def test_missing_database_is_a_configuration_error(postgres_dsn: str) -> None:
    dsn = postgres_dsn.rsplit("/", 1)[0] + "/no_such_database"
    with pytest.raises(ConfigurationError, match=r"no_such_database.*does not exist") as err:
        await open_store(dsn, Path("/nonexistent"))
    assert "\n" not in str(err.value)


def test_cli_serve_with_unreachable_store_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dsn = f"postgresql://agg:s3cret@127.0.0.1:{free_port()}/counts"
    code = main(
        [
            "aggregator",
            "serve",
            "--insecure",
            "--data-dir",
            str(tmp_path),
            "--listen",
            "127.0.0.1:0",
            "--store",
            dsn,
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "configuration error" in err[0] and "cannot connect to PostgreSQL" in err[0], err
    assert "s3cret" not in err[0]


async def test_open_store_default_is_sqlite_in_the_data_dir(tmp_path: Path) -> None:
    store = await open_store(None, tmp_path)
    try:
        assert isinstance(store, SqliteAggregatorStore) and store.path.parent == tmp_path
    finally:
        await store.close()


async def test_service_runs_on_postgres(tmp_path: Path, postgres_dsn: str, kit: Kit) -> None:
    running = await start_aggregator(
        AggregatorConfig(insecure=True, data_dir=tmp_path / "agg", listen="127.0.0.1:0", store=postgres_dsn)
    )
    try:
        assert isinstance(running.store, PostgresAggregatorStore)
        async with insecure_channel(running.address) as channel:
            stub = pb_grpc.AggregatorStub(channel)
            campaign = await stub.CreateCampaign(kit.binary_request(), timeout=30)
            sealed = [kit.seal(campaign, i % 2) for i in range(40)]
            batch = kit.batch_of(campaign.id, [s.report for s in sealed], "b1")
            first = await stub.IngestBatch(batch, timeout=30)
            again = await stub.IngestBatch(batch, timeout=30)
            answer = await stub.BinarySum(pb.QueryRequest(campaign_id=campaign.id), timeout=30)
        assert (first.counted, first.duplicate_batch, again.duplicate_batch) == (40, False, True)
        assert answer.n == 40
        assert [b.raw_count for b in answer.buckets] == [
            sum(s.payload == bytes([v]) for s in sealed) for v in (0, 1)
        ]
    finally:
        await running.stop(grace=1.0)
    assert not (tmp_path / "agg" / DATABASE_FILE).exists()
    # The counts are in PostgreSQL: another store (a replica) sees them.
    store = await PostgresAggregatorStore.connect(postgres_dsn, pool_size=1)
    try:
        assert (await store.snapshot(campaign.id, 2)).n == 40
    finally:
        await store.close()
