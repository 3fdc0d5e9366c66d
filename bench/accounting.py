"""Accountant quality and speed: binary RR against the exact shuffled-RR epsilon.

    python bench/accounting.py [--quick] [--json bench-results/accounting.json]

For binary RR at n in {1e4 .. 1e7}, eps0 in {0.5, 1, 2, 4, 8}, delta in {1e-6, 1e-8}: the
accountant's epsilon, the exact epsilon of the worst configuration the search evaluated (a lower
bound on the exact shuffled-RR epsilon; at n = 1e4 the exhaustive value itself), their worst ratio
(an upper bound on the accountant's ratio to exact) and the wall time of a cold ``best_bound``.
For GRR at k in {8, 100, 1024}, n in {1e5, 1e6, 1e7}, eps0 in {1, 4}, delta 1e-6: the full
blanket now (at n, u blocked past the exact budget) against before (exact at n' < n), the
accountant's choice and the wall time of each. Timings depend on the machine's load (printed
first); nothing here is a test assertion. The engine: ``deniable.sim.bench_accounting.run_accounting``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from deniable.sim.bench_accounting import AccountingConfig, run_accounting
from deniable.sim.render import write_json


def main(argv: list[str] | None = None) -> int:
    """Parse options, measure both grids, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="n = 1e4 and 1e5, eps0 1 and 4 only")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    report = run_accounting(AccountingConfig.quick() if args.quick else AccountingConfig())
    write_json(report, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
