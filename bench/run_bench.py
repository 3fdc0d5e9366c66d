"""Throughput per stage and end to end against the machine's HPKE ceiling.

    python bench/run_bench.py [--quick] [--json bench-results/bench.json] [--reports N]

The same as ``deniable bench``; the engine is ``deniable.sim.bench``. See docs/performance.md.
"""

from __future__ import annotations

import sys

from deniable.cli.main import main

if __name__ == "__main__":  # the services run in spawned processes: keep this guard
    sys.exit(main(["bench", *sys.argv[1:]]))
