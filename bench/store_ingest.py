"""Ingest throughput of the aggregator stores: PostgreSQL against SQLite, the store layer alone.

    python bench/store_ingest.py [--reports 100000] [--batch 5000] [--in-flight 1 2]
                                 [--dsn postgresql://...] [--repeat 3] [--json bench-results/store.json]

What is timed: ``plan_ingest`` and ``AggregatorStore.apply`` of already decrypted reports
(16-byte report ids, 1-byte payloads, 3 count cells), batch after batch into one campaign, from
the first call to the last commit: plan (dedupe within the batch, count), dedupe against every
id seen before, commit. Decryption is not included
(see docs/performance.md for the whole pipeline). With ``--in-flight K`` there are K stores on
the same storage (K SQLite connections; K PostgreSQL pools, as K aggregator replicas would be),
each ingesting its share of the batches at the same time.

Both stores are durable: SQLite in WAL mode with synchronous=FULL, PostgreSQL with its default
fsync and synchronous_commit. Without ``--dsn`` a throwaway PostgreSQL server is started
(tests/support/postgres_server.py; needs scripts/system-deps.sh) on loopback with a temp data directory on
the same disk as the SQLite file. Results are in docs/storage.md.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import secrets
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import numpy as np
import numpy.typing as npt

from deniable.aggregator.ingest_plan import Counting, plan_ingest
from deniable.aggregator.store import AggregatorStore, SqliteAggregatorStore
from deniable.aggregator.store_postgres import PostgresAggregatorStore
from deniable.v1 import deniable_pb2 as pb

CELLS = 3
Opener = Callable[[], Awaitable[AggregatorStore]]


def _postgres_server_module() -> ModuleType:
    """tests/support/postgres_server.py, loaded by path (``tests`` is not a package)."""
    path = Path(__file__).resolve().parents[1] / "tests" / "support" / "postgres_server.py"
    spec = importlib.util.spec_from_file_location("deniable_tests_postgres_server", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _count_cells(payloads: Sequence[bytes]) -> npt.NDArray[np.int64]:
    """Histogram of the first payload byte, as a GRR tally would give."""
    return np.bincount(np.frombuffer(b"".join(payloads), dtype=np.uint8), minlength=CELLS).astype(np.int64)


def _campaign() -> pb.Campaign:
    return pb.Campaign(
        id="bench", question="q", kind=pb.CATEGORICAL, labels=["a", "b", "c"], mechanism=pb.GRR
    )


def _batches(reports: int, batch: int) -> list[list[tuple[bytes, bytes]]]:
    """Fresh random report ids, cut into batches."""
    ids = os.urandom(16 * reports)
    pairs = [(ids[16 * i : 16 * i + 16], bytes([i % CELLS])) for i in range(reports)]
    return [pairs[i : i + batch] for i in range(0, reports, batch)]


async def _run(opener: Opener, batches: list[list[tuple[bytes, bytes]]], in_flight: int) -> float:
    """Seconds to ingest every batch with ``in_flight`` stores at once; checks the totals."""
    stores = [await opener() for _ in range(in_flight)]
    try:
        await stores[0].create_campaign(_campaign())

        async def worker(k: int) -> None:
            for b in range(k, len(batches), in_flight):
                plan = plan_ingest(
                    batch_id=f"b{b}",
                    campaign_id="bench",
                    digest=b"d",
                    batch_size=len(batches[b]),
                    valid_reports=batches[b],
                    rejected={},
                    counting=Counting(cells=CELLS, count_cells=_count_cells),
                )
                await stores[k].apply(plan)

        started = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in range(in_flight)))
        elapsed = time.perf_counter() - started
        snap = await stores[0].snapshot("bench", CELLS)
        expected = sum(len(b) for b in batches)
        if snap.n != expected or snap.batches != len(batches):
            raise AssertionError(f"counted {snap.n} in {snap.batches} batches, expected {expected}")
        return elapsed
    finally:
        for store in stores:
            await store.close()


def _database_dsn(server: Any, dsn_base: str | None, name: str) -> str:
    """The DSN of database ``name`` on the throwaway server or on the ``--dsn`` server."""
    if server is not None:
        return str(server.dsn(name))
    parts = urlsplit(dsn_base or "")
    return urlunsplit(parts._replace(path=f"/{name}"))


async def _create_database(server: Any, dsn_base: str | None, prefix: str) -> str:
    """A new empty database for one run (on ``--dsn``: its role needs CREATEDB)."""
    if server is not None:
        return str(await server.create_database(prefix))
    name = f"deniable_{prefix}_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(dsn_base)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    return name


async def _drop_database(server: Any, dsn_base: str | None, name: str) -> None:
    """Drop a database made by ``_create_database``."""
    if server is not None:
        await server.drop_database(name)
        return
    admin = await asyncpg.connect(dsn_base)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def _measure(args: argparse.Namespace) -> dict[str, Any]:
    server = None
    dsn_base: str | None = args.dsn
    if dsn_base is None:
        module = _postgres_server_module()
        server = module.PostgresServer.start(durable=True)
    results: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="deniable-store-bench-") as tmp:
            for repeat in range(args.repeat):
                for in_flight in args.in_flight:
                    batches = _batches(args.reports, args.batch)
                    run = f"r{repeat}_k{in_flight}"
                    path = Path(tmp) / f"{run}.sqlite3"

                    async def sqlite(path: Path = path) -> AggregatorStore:
                        return SqliteAggregatorStore(path)

                    name = await _create_database(server, dsn_base, f"bench_{run}")
                    dsn = _database_dsn(server, dsn_base, name)

                    async def postgres(dsn: str = dsn, pool: int = 2) -> AggregatorStore:
                        return await PostgresAggregatorStore.connect(dsn, pool_size=pool)

                    for store_name, opener in (("sqlite", sqlite), ("postgres", postgres)):
                        seconds = await _run(opener, batches, in_flight)
                        row = {
                            "store": store_name,
                            "in_flight": in_flight,
                            "repeat": repeat,
                            "seconds": seconds,
                            "reports_per_s": args.reports / seconds,
                            "ms_per_batch": 1000 * seconds / len(batches),
                        }
                        results.append(row)
                        print(
                            f"{store_name:8} in flight {in_flight}  {row['reports_per_s']:>9,.0f} reports/s"
                            f"  {row['ms_per_batch']:6.1f} ms/batch",
                            flush=True,
                        )
                    await _drop_database(server, dsn_base, name)
    finally:
        if server is not None:
            server.stop()
    return {"reports": args.reports, "batch": args.batch, "results": results}


def main(argv: Sequence[str] | None = None) -> int:
    """Parse options, measure, print a summary (best of the repeats) and optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--reports", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=5_000)
    parser.add_argument("--in-flight", type=int, nargs="+", default=[1, 2], help="stores ingesting at once")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each configuration; best is shown")
    parser.add_argument(
        "--dsn", default=None, help="a server to use instead of a throwaway one (creates and drops databases)"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    load = os.getloadavg()
    print(
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()},"
        f" load average {load[0]:.2f}; {args.reports:,} reports in batches of {args.batch:,}",
        flush=True,
    )
    report = asyncio.run(_measure(args))
    report["load_average_at_start"] = load[0]
    print("best of the repeats:")
    for in_flight in args.in_flight:
        for store_name in ("sqlite", "postgres"):
            rows = [r for r in report["results"] if r["store"] == store_name and r["in_flight"] == in_flight]
            best = max(rows, key=lambda r: r["reports_per_s"])
            print(f"  {store_name:8} in flight {in_flight}: {best['reports_per_s']:>9,.0f} reports/s")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
