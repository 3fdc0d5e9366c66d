"""Print the table of docs/amplification.md: central epsilon per analysis for a grid of (eps0, n).

Run ``python -m deniable.core.accounting.table`` (add ``--exact-budget 2e9`` to run the exact
binary RR analysis at every n instead of at the largest affordable n' <= n; slow beyond 1e5).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence

from deniable.core.accounting.accountant import best_bound, realised_probabilities
from deniable.core.amplification import _binary_rr
from deniable.core.amplification.analyses import (
    Analysis,
    BinaryRRExact,
    FMT21ClosedForm,
    FMT21NumericalClones,
    GRRBlanket,
    GRRFullBlanket,
)

# Which registered randomisers the table shows (options, not dispatch: any mechanism with
# keep/other probabilities works): a two-value one and a k-value one.
DEFAULT_BINARY = "binary_rr"
DEFAULT_KARY = "grr"


def _cell(analysis: Analysis, delta: float) -> str:
    bound = analysis.bound(delta)
    if not bound.amplified:
        return "— (local)"
    return f"{bound.epsilon:.4f}"


def _full_cell(analysis: GRRFullBlanket, delta: float) -> str:
    cell = _cell(analysis, delta)
    return cell if analysis.evaluated_n == analysis.n else f"{cell} (n'={analysis.evaluated_n})"


def rows(
    epsilons: Sequence[float],
    ns: Sequence[int],
    delta: float,
    exact_budget: int,
    grr_k: int,
    binary: str = DEFAULT_BINARY,
    kary: str = DEFAULT_KARY,
) -> list[list[str]]:
    """One row per (eps0, n): every analysis's epsilon at delta, at the realised probabilities of
    ``binary`` (2 values) and ``kary`` (grr_k values), and the accountant's pick for ``binary``."""
    table = []
    for eps0 in epsilons:
        keep2, other2 = (float(x) for x in realised_probabilities(binary, eps0, 2))
        keep_k, other_k = (float(x) for x in realised_probabilities(kary, eps0, grr_k))
        for n in ns:
            exact = BinaryRRExact(eps0, n, keep2, max_work=exact_budget)
            exact_cell = _cell(exact, delta)
            if exact.evaluated_n < n:
                floor = _binary_rr.exact_epsilon(keep2, n, delta, band=0)
                exact_cell = f"{exact_cell} (n'={exact.evaluated_n}); ≥ {floor:.4f}"
            best = best_bound(eps0, n, delta, binary, 2)
            table.append(
                [
                    f"{eps0:g}",
                    f"{n:.0e}".replace("e+0", "e"),
                    _cell(FMT21ClosedForm(eps0, n), delta),
                    _cell(FMT21NumericalClones(eps0, n), delta),
                    _cell(GRRBlanket(eps0, n, grr_k, keep_k, other_k), delta),
                    _full_cell(GRRFullBlanket(eps0, n, grr_k, keep_k, other_k), delta),
                    _cell(GRRBlanket(eps0, n, 2, keep2, other2), delta),
                    exact_cell,
                    f"{best.epsilon:.4f} ({best.analysis})" if best.amplified else "local",
                ]
            )
    return table


def main(argv: Sequence[str] | None = None) -> None:
    """Print the markdown table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--delta", type=float, default=1e-6)
    parser.add_argument("--eps0", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    parser.add_argument("--n", type=int, nargs="+", default=[10**3, 10**4, 10**5, 10**6])
    parser.add_argument("--exact-budget", type=float, default=2e7)
    parser.add_argument("--grr-k", type=int, default=10)
    parser.add_argument("--binary", default=DEFAULT_BINARY, help="two-value randomiser shown")
    parser.add_argument("--kary", default=DEFAULT_KARY, help="k-value randomiser shown (k = --grr-k)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    header = [
        "eps0",
        "n",
        "FMT21 closed form",
        "FMT21 clones (numerical)",
        f"GRR blanket k={args.grr_k}",
        f"GRR full blanket k={args.grr_k}",
        "GRR blanket k=2",
        "binary RR exact",
        f"accountant, {args.binary}",
    ]
    body = rows(
        args.eps0, args.n, args.delta, math.ceil(args.exact_budget), args.grr_k, args.binary, args.kary
    )
    print(f"delta = {args.delta:g}")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in body:
        print("| " + " | ".join(row) + " |")
    print(f"\n({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
