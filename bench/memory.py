"""Peak RSS of the shuffler holding and permuting 1,000,000 reports and of the aggregator ingesting them.

    python bench/memory.py [--quick] [--devices N] [--json bench-results/memory.json]

The same as ``deniable bench --memory``; the engine is ``deniable.sim.bench_memory``. Each
service runs in its own process; the stated limits and the verdict are printed. See
docs/performance.md.
"""

from __future__ import annotations

import sys

from deniable.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--memory", *sys.argv[1:]]))
