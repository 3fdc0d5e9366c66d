"""Cost per report of the shuffler's spools: SQLite segments against PostgreSQL, the spool alone.

    python bench/spool_postgres.py [--reports 200000] [--request 1000] [--batch 50000]
                                   [--dsn postgresql://...] [--json bench-results/spool.json]

What is timed, per report: ``append`` in requests of ``--request`` reports (one durable
transaction each, as SubmitReports does), then ``form_batch_sizes`` into batches of ``--batch``
(permute + store the wire bytes), ``load_wire`` and ``delete_batch`` (forwarding without the
network). Both are durable (SQLite synchronous=FULL; PostgreSQL with fsync and synchronous_commit
on). Without ``--dsn`` a throwaway PostgreSQL server is started (tests/support/postgres_server.py).
Results are in docs/scaling.md.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from deniable.core.rng import default_rng
from deniable.shuffler.columns import ColumnReports, Columns
from deniable.shuffler.segments import SegmentSpool
from deniable.shuffler.spool import SpoolStore
from deniable.shuffler.spool_postgres import PostgresSpool

CIPHERTEXT = 120


def _postgres_server_module() -> ModuleType:
    """tests/support/postgres_server.py, loaded by path (``tests`` is not a package)."""
    path = Path(__file__).resolve().parents[1] / "tests" / "support" / "postgres_server.py"
    spec = importlib.util.spec_from_file_location("deniable_bench_postgres_server", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def measure(spool: SpoolStore, reports: int, request: int, batch: int) -> dict[str, float]:
    """Microseconds per report of append, of forming batches, and of loading + deleting them."""
    payload = default_rng().bytes(CIPHERTEXT)
    chunk = ColumnReports.of("bench", Columns.of([1] * request, [payload] * request))
    clock: Callable[[], float] = time.perf_counter
    start = clock()
    for _ in range(reports // request):
        spool.append(chunk)
    appended = clock()
    sizes = [batch] * (reports // batch)
    formed = spool.form_batch_sizes("bench", sizes, default_rng().permutation)
    formed_at = clock()
    for b in formed:
        assert spool.load_wire(b.batch_id) is not None
        spool.delete_batch(b.batch_id)
    done = clock()
    n = float(reports)
    return {
        "append_us": (appended - start) / n * 1e6,
        "form_us": (formed_at - appended) / n * 1e6,
        "load_delete_us": (done - formed_at) / n * 1e6,
        "total_us": (done - start) / n * 1e6,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reports", type=int, default=200_000)
    parser.add_argument("--request", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    settings = {k: v for k, v in vars(args).items() if k in ("reports", "request", "batch")}
    results: dict[str, object] = {"load_average": os.getloadavg(), **settings}
    with tempfile.TemporaryDirectory() as tmp:
        sqlite = SegmentSpool(Path(tmp) / "spool.sqlite3")
        results["sqlite_segments"] = measure(sqlite, args.reports, args.request, args.batch)
        sqlite.close()
    server = None
    dsn = args.dsn
    if dsn is None:
        server = _postgres_server_module().PostgresServer.start(durable=True)
        dsn = server.dsn(asyncio.run(server.create_database("spool")))
    try:
        spool = PostgresSpool(dsn)
        results["postgresql"] = measure(spool, args.reports, args.request, args.batch)
        spool.close()
    finally:
        if server is not None:
            server.stop()
    print(json.dumps(results, indent=2))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
