"""Our GRR, OUE and OLH against pure-ldp and multi-freq-ldpy (n = 1,000,000, d = 1024, ε = 1).

    pip install -e ".[bench]"      # the libraries, only for this benchmark
    python bench/compare_libraries.py [--quick] [--devices N] [--json bench-results/libraries.json]

The same as ``deniable bench --compare-libraries``; the engine is ``deniable.sim.bench_libraries``.
A library that is not installed is reported and skipped. See docs/performance.md.
"""

from __future__ import annotations

import sys

from deniable.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["bench", "--compare-libraries", *sys.argv[1:]]))
