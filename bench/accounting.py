"""Accountant quality and speed: binary RR against the exact shuffled-RR epsilon.

    python bench/accounting.py [--quick] [--json bench-results/accounting.json]

For binary RR at n in {1e4 .. 1e7}, eps0 in {0.5, 1, 2, 4, 8}, delta in {1e-6, 1e-8}: the
accountant's epsilon, the exact epsilon of the worst configuration the search evaluated (a lower
bound on the exact shuffled-RR epsilon; at n = 1e4 the exhaustive value itself), their worst ratio
(an upper bound on the accountant's ratio to exact) and the wall time of a cold ``best_bound``.
For GRR at k in {8, 100, 1024}, n in {1e5, 1e6, 1e7}, eps0 in {1, 4}, delta 1e-6: the full
blanket now (at n, u blocked past the exact budget) against before (exact at n' < n), the
accountant's choice and the wall time of each. Timings depend on the machine's load (printed
first); nothing here is a test assertion.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def binary_rr_rows(ns: list[int], eps0s: list[float], deltas: list[float]) -> list[dict[str, Any]]:
    """One row per (n, eps0, delta): accountant eps, exact lower bound, ratio, seconds."""
    from deniable.core.accounting import BinaryRRExact, best_bound, realised_probabilities
    from deniable.core.accounting.accountant import clear_cache
    from deniable.core.amplification import _binary_rr
    from deniable.core.amplification.analyses import GRID_TOLERANCE

    rows = []
    for n in ns:
        for eps0 in eps0s:
            keep = float(realised_probabilities("binary_rr", eps0, 2)[0])
            for delta in deltas:
                clear_cache()
                start = time.perf_counter()
                bound = best_bound(eps0, n, delta, "binary_rr")
                seconds = time.perf_counter() - start
                analysis = BinaryRRExact(eps0, n, keep)
                if analysis.exhaustive:
                    lower = _binary_rr.exact_epsilon(keep, n, delta)
                else:
                    lower = _binary_rr.grid_epsilon(keep, n, delta, GRID_TOLERANCE).lower
                rows.append(
                    {
                        "n": n,
                        "epsilon0": eps0,
                        "delta": delta,
                        "accountant": bound.epsilon,
                        "analysis": bound.analysis,
                        "exact_lower": lower,
                        "ratio": bound.epsilon / lower if lower > 0 else None,
                        "seconds": round(seconds, 3),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    return rows


def grr_rows(ks: list[int], ns: list[int], eps0s: list[float], delta: float) -> list[dict[str, Any]]:
    """One row per (k, n, eps0): the full blanket now (at n, u blocked) and before (exact at n')."""
    from deniable.core.accounting import GRRFullBlanket, best_bound, realised_probabilities
    from deniable.core.accounting.accountant import clear_cache
    from deniable.core.amplification.analyses import (
        FULL_BLANKET_MAX_CELLS,
        _cached_full_blanket_epsilon,
        largest_affordable_n,
    )

    rows = []
    for k in ks:
        for n in ns:
            for eps0 in eps0s:
                keep, other = (float(v) for v in realised_probabilities("grr", eps0, k))
                analysis = GRRFullBlanket(eps0, n, k, keep, other)
                clear_cache()
                _cached_full_blanket_epsilon.cache_clear()
                start = time.perf_counter()
                bound = best_bound(eps0, n, delta, "grr", k)
                seconds = time.perf_counter() - start
                old_n = largest_affordable_n(n, analysis._cells, FULL_BLANKET_MAX_CELLS)
                start = time.perf_counter()
                old = _cached_full_blanket_epsilon(eps0, keep, other, k, old_n, delta, False)
                old_seconds = time.perf_counter() - start
                rows.append(
                    {
                        "k": k,
                        "n": n,
                        "epsilon0": eps0,
                        "delta": delta,
                        "full_blanket": analysis.epsilon_for_delta(delta),
                        "full_blanket_evaluated_n": analysis.evaluated_n,
                        "old_full_blanket": old,
                        "old_evaluated_n": old_n,
                        "accountant": bound.epsilon,
                        "analysis": bound.analysis,
                        "accountant_evaluated_n": bound.evaluated_n,
                        "seconds": round(seconds, 3),
                        "old_seconds": round(old_seconds, 3),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="n = 1e4 and 1e5, eps0 1 and 4 only")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    print(f"load average at start: {os.getloadavg()}", flush=True)
    ns = [10**4, 10**5] if args.quick else [10**4, 10**5, 10**6, 10**7]
    eps0s = [1.0, 4.0] if args.quick else [0.5, 1.0, 2.0, 4.0, 8.0]
    grr = grr_rows([8, 100, 1024], [10**5, 10**6] if args.quick else [10**5, 10**6, 10**7], [1.0, 4.0], 1e-6)
    rr = binary_rr_rows(ns, eps0s, [1e-6, 1e-8])
    worst = max(r["ratio"] for r in rr if r["ratio"] is not None)
    print(
        f"worst accountant / exact-lower ratio: {worst:.5f}; slowest: {max(r['seconds'] for r in rr):.2f} s"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"grr": grr, "binary_rr": rr}, indent=2, allow_nan=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
