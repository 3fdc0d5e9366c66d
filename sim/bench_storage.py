"""Storage engines' throughput: aggregator store ingest and shuffler spool cost, SQLite against PostgreSQL.

The engines behind ``bench/store_ingest.py`` and ``bench/spool_postgres.py``: each takes a small
config and the DSN of a PostgreSQL server (a role that may create databases) and returns a result
dict; starting a throwaway server is the script's business. Results are in docs/storage.md and
docs/scaling.md.
"""

from __future__ import annotations

import asyncio
import os
import platform
import secrets
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import numpy as np
import numpy.typing as npt

from deniable.aggregator.ingest_plan import Counting, plan_ingest
from deniable.aggregator.store import AggregatorStore, SqliteAggregatorStore
from deniable.aggregator.store_postgres import PostgresAggregatorStore
from deniable.core.rng import default_rng
from deniable.shuffler.columns import ColumnReports, Columns
from deniable.shuffler.segments import SegmentSpool
from deniable.shuffler.spool import SpoolStore
from deniable.shuffler.spool_postgres import PostgresSpool
from deniable.v1 import deniable_pb2 as pb

CELLS = 3
CIPHERTEXT = 120
CAMPAIGN = "bench"
Batch = list[tuple[bytes, bytes]]
Opener = Callable[[], Awaitable[AggregatorStore]]


# ============================================================================ aggregator store ingest


@dataclass
class StoreIngestConfig:
    """Sizes of one store-ingest run: reports, batch size, stores at once, repeats."""

    reports: int = 100_000
    batch: int = 5_000
    in_flight: list[int] = field(default_factory=lambda: [1, 2])
    repeat: int = 3


def count_cells(payloads: Sequence[bytes]) -> npt.NDArray[np.int64]:
    """Histogram of the first payload byte, as a GRR tally would give."""
    return np.bincount(np.frombuffer(b"".join(payloads), dtype=np.uint8), minlength=CELLS).astype(np.int64)


def bench_campaign() -> pb.Campaign:
    """The one three-label GRR campaign every batch goes into."""
    labels = ["a", "b", "c"]
    return pb.Campaign(id=CAMPAIGN, question="q", kind=pb.CATEGORICAL, labels=labels, mechanism=pb.GRR)


def random_batches(reports: int, batch: int) -> list[Batch]:
    """Fresh random 16-byte report ids with 1-byte payloads, cut into batches."""
    ids = os.urandom(16 * reports)
    pairs = [(ids[16 * i : 16 * i + 16], bytes([i % CELLS])) for i in range(reports)]
    return [pairs[i : i + batch] for i in range(0, reports, batch)]


async def ingest_batches(store: AggregatorStore, batches: list[Batch], indexes: range) -> None:
    """Plan and apply the batches at ``indexes``, one after another, into ``store``."""
    for b in indexes:
        plan = plan_ingest(
            batch_id=f"b{b}",
            campaign_id=CAMPAIGN,
            digest=b"d",
            batch_size=len(batches[b]),
            valid_reports=batches[b],
            rejected={},
            counting=Counting(cells=CELLS, count_cells=count_cells),
        )
        await store.apply(plan)


async def timed_ingest(opener: Opener, batches: list[Batch], in_flight: int) -> float:
    """Seconds to ingest every batch with ``in_flight`` stores at once; checks the totals."""
    stores = [await opener() for _ in range(in_flight)]
    try:
        await stores[0].create_campaign(bench_campaign())
        started = time.perf_counter()
        shares = [range(k, len(batches), in_flight) for k in range(in_flight)]
        await asyncio.gather(*(ingest_batches(s, batches, i) for s, i in zip(stores, shares, strict=True)))
        elapsed = time.perf_counter() - started
        snap = await stores[0].snapshot(CAMPAIGN, CELLS)
        expected = sum(len(b) for b in batches)
        if snap.n != expected or snap.batches != len(batches):
            raise AssertionError(f"counted {snap.n} in {snap.batches} batches, expected {expected}")
        return elapsed
    finally:
        for store in stores:
            await store.close()


def database_dsn(dsn: str, name: str) -> str:
    """``dsn`` with its database replaced by ``name``."""
    return urlunsplit(urlsplit(dsn)._replace(path=f"/{name}"))


async def create_database(dsn: str, prefix: str) -> str:
    """A new empty database on the server of ``dsn`` (its role needs CREATEDB); its name."""
    name = f"deniable_{prefix}_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    return name


async def drop_database(dsn: str, name: str) -> None:
    """Drop a database made by ``create_database``, ending sessions still on it."""
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


def ingest_row(
    store: str, in_flight: int, repeat: int, seconds: float, batches: list[Batch]
) -> dict[str, Any]:
    """One result row, printed as it is made."""
    reports = sum(len(b) for b in batches)
    row = {
        "store": store,
        "in_flight": in_flight,
        "repeat": repeat,
        "seconds": seconds,
        "reports_per_s": reports / seconds,
        "ms_per_batch": 1000 * seconds / len(batches),
    }
    print(
        f"{store:8} in flight {in_flight}  {row['reports_per_s']:>9,.0f} reports/s"
        f"  {row['ms_per_batch']:6.1f} ms/batch",
        flush=True,
    )
    return row


async def ingest_both_stores(
    config: StoreIngestConfig, dsn: str, folder: Path, repeat: int, in_flight: int
) -> list[dict[str, Any]]:
    """The same fresh batches into a SQLite file and a fresh PostgreSQL database: one row each."""
    batches = random_batches(config.reports, config.batch)
    run = f"r{repeat}_k{in_flight}"
    name = await create_database(dsn, f"bench_{run}")

    async def sqlite() -> AggregatorStore:
        return SqliteAggregatorStore(folder / f"{run}.sqlite3")

    async def postgres() -> AggregatorStore:
        return await PostgresAggregatorStore.connect(database_dsn(dsn, name), pool_size=2)

    rows = []
    try:
        for store, opener in (("sqlite", sqlite), ("postgres", postgres)):
            seconds = await timed_ingest(opener, batches, in_flight)
            rows.append(ingest_row(store, in_flight, repeat, seconds, batches))
    finally:
        await drop_database(dsn, name)
    return rows


async def measure_store_ingest(config: StoreIngestConfig, dsn: str) -> dict[str, Any]:
    """Every (repeat, in flight) pair on both stores; the report without the load average."""
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="deniable-store-bench-") as tmp:
        for repeat in range(config.repeat):
            for in_flight in config.in_flight:
                results += await ingest_both_stores(config, dsn, Path(tmp), repeat, in_flight)
    return {"reports": config.reports, "batch": config.batch, "results": results}


def best_of_repeats(report: dict[str, Any]) -> dict[tuple[str, int], float]:
    """(store, in flight) → the best reports/s over the repeats."""
    best: dict[tuple[str, int], float] = {}
    for row in report["results"]:
        key = (row["store"], row["in_flight"])
        best[key] = max(best.get(key, 0.0), row["reports_per_s"])
    return best


def run_store_ingest(config: StoreIngestConfig, dsn: str) -> dict[str, Any]:
    """Time ``plan_ingest`` + ``AggregatorStore.apply`` on SQLite and on PostgreSQL at ``dsn``."""
    load = os.getloadavg()
    print(
        f"{platform_line()}, load average {load[0]:.2f};"
        f" {config.reports:,} reports in batches of {config.batch:,}",
        flush=True,
    )
    report = asyncio.run(measure_store_ingest(config, dsn))
    report["load_average_at_start"] = load[0]
    print("best of the repeats:")
    best = best_of_repeats(report)
    for in_flight in config.in_flight:
        for store in ("sqlite", "postgres"):
            print(f"  {store:8} in flight {in_flight}: {best[(store, in_flight)]:>9,.0f} reports/s")
    return report


def platform_line() -> str:
    """Machine, CPUs and Python version, for the first line of a run."""
    return f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"


# ============================================================================ shuffler spool


@dataclass
class SpoolConfig:
    """Sizes of one spool run: reports, reports per append request, reports per batch."""

    reports: int = 200_000
    request: int = 1000
    batch: int = 50_000


def measure_spool(spool: SpoolStore, config: SpoolConfig) -> dict[str, float]:
    """Microseconds per report of append, of forming batches, and of loading + deleting them."""
    payload = default_rng().bytes(CIPHERTEXT)
    chunk = ColumnReports.of(CAMPAIGN, Columns.of([1] * config.request, [payload] * config.request))
    start = time.perf_counter()
    for _ in range(config.reports // config.request):
        spool.append(chunk)
    appended = time.perf_counter()
    sizes = [config.batch] * (config.reports // config.batch)
    formed = spool.form_batch_sizes(CAMPAIGN, sizes, default_rng().permutation)
    formed_at = time.perf_counter()
    for b in formed:
        assert spool.load_wire(b.batch_id) is not None
        spool.delete_batch(b.batch_id)
    done = time.perf_counter()
    n = float(config.reports)
    return {
        "append_us": (appended - start) / n * 1e6,
        "form_us": (formed_at - appended) / n * 1e6,
        "load_delete_us": (done - formed_at) / n * 1e6,
        "total_us": (done - start) / n * 1e6,
    }


def run_spool(config: SpoolConfig, dsn: str) -> dict[str, Any]:
    """Cost per report of the SQLite segment spool and of the PostgreSQL spool (fresh database at ``dsn``)."""
    results: dict[str, Any] = {
        "load_average": os.getloadavg(),
        "reports": config.reports,
        "request": config.request,
        "batch": config.batch,
    }
    with tempfile.TemporaryDirectory() as tmp:
        sqlite = SegmentSpool(Path(tmp) / "spool.sqlite3")
        results["sqlite_segments"] = measure_spool(sqlite, config)
        sqlite.close()
    name = asyncio.run(create_database(dsn, "spool"))
    try:
        postgres = PostgresSpool(database_dsn(dsn, name))
        results["postgresql"] = measure_spool(postgres, config)
        postgres.close()
    finally:
        asyncio.run(drop_database(dsn, name))
    return results
