"""Cost per report of the shuffler's spools: SQLite segments against PostgreSQL, the spool alone.

    python bench/spool_postgres.py [--reports 200000] [--request 1000] [--batch 50000]
                                   [--dsn postgresql://...] [--json bench-results/spool.json]

What is timed, per report: ``append`` in requests of ``--request`` reports (one durable
transaction each, as SubmitReports does), then ``form_batch_sizes`` into batches of ``--batch``
(permute + store the wire bytes), ``load_wire`` and ``delete_batch`` (forwarding without the
network). Both are durable. Without ``--dsn`` a throwaway PostgreSQL server is started
(tests/support/postgres_server.py); with it, its role needs CREATEDB (a fresh database per run).
The engine: ``deniable.sim.bench_storage.run_spool``. Results are in docs/scaling.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from throwaway import postgres

from deniable.sim.bench_storage import SpoolConfig, run_spool
from deniable.sim.render import dumps, write_json


def main() -> int:
    """Parse options, measure both spools, print the JSON and optionally write it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reports", type=int, default=200_000)
    parser.add_argument("--request", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with postgres(args.dsn) as dsn:
        results = run_spool(SpoolConfig(args.reports, args.request, args.batch), dsn)
    print(dumps(results))
    write_json(results, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
