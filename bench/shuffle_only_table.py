"""Issue 15's table: every shuffle-only protocol's stated epsilon against its exact epsilon at
n in {1e4, 1e5, 1e6}, and the standard error per bucket against central Laplace at n = 1e5.

Run: python bench/shuffle_only_table.py  (about a minute on one core). Target eps = 1, delta = 1e-6.
The engine: ``deniable.sim.bench_accounting.run_shuffle_only_table``.
"""

from __future__ import annotations

import argparse
import sys

from deniable.sim.bench_accounting import ShuffleOnlyConfig, run_shuffle_only_table


def main() -> int:
    """Print both markdown tables."""
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    tables = run_shuffle_only_table(ShuffleOnlyConfig())
    print("\n".join(tables["epsilon_rows"]))
    print()
    print("\n".join(tables["error_rows"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
