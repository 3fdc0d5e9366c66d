"""Ingest throughput of the aggregator stores: PostgreSQL against SQLite, the store layer alone.

    python bench/store_ingest.py [--reports 100000] [--batch 5000] [--in-flight 1 2]
                                 [--dsn postgresql://...] [--repeat 3] [--json bench-results/store.json]

What is timed: ``plan_ingest`` and ``AggregatorStore.apply`` of already decrypted reports
(16-byte report ids, 1-byte payloads, 3 count cells), batch after batch into one campaign, from
the first call to the last commit; with ``--in-flight K``, K stores on the same storage at once.
Both stores are durable. Without ``--dsn`` a throwaway PostgreSQL server is started
(tests/support/postgres_server.py; needs scripts/system-deps.sh); with it, its role needs
CREATEDB. The engine: ``deniable.sim.bench_storage.run_store_ingest``. Results: docs/storage.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from throwaway import postgres

from deniable.sim.bench_storage import StoreIngestConfig, run_store_ingest
from deniable.sim.render import write_json


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
    config = StoreIngestConfig(args.reports, args.batch, args.in_flight, args.repeat)
    with postgres(args.dsn) as dsn:
        report = run_store_ingest(config, dsn)
    write_json(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
