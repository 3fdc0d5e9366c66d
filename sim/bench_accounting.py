"""Accountant quality and the shuffle-only protocols' table: the engines of ``bench/accounting.py``
and ``bench/shuffle_only_table.py``.

The accountant measurement compares ``best_bound`` with exact shuffled-RR values that only the
amplification maths' private helpers compute (``_binary_rr.grid_epsilon(...).lower``, the
uncached full blanket at n'); no public API gives them, so they are imported here, in a benchmark,
and nowhere else outside core. Timings depend on the machine's load; nothing is a test assertion.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from fractions import Fraction
from functools import partial
from typing import Any

from deniable.core import mechanisms
from deniable.core.accounting import BinaryRRExact, GRRFullBlanket, best_bound, realised_probabilities
from deniable.core.accounting.accountant import clear_cache
from deniable.core.accounting.planner import central_laplace, device_cost, expected_std_error
from deniable.core.amplification import _binary_rr
from deniable.core.amplification.analyses import (
    FULL_BLANKET_MAX_CELLS,
    GRID_TOLERANCE,
    _cached_full_blanket_epsilon,
    largest_affordable_n,
)
from deniable.core.amplification.protocols import (
    GRID,
    balcer_cheu_exact_guarantee,
    balcer_cheu_gamma,
    balcer_cheu_guarantee,
    multi_histogram_noise_delta,
    noise_delta,
    smallest_epsilon,
)

# ============================================================================ accountant vs exact


@dataclass
class AccountingConfig:
    """The grids: binary RR over (n, eps0, delta), GRR over (k, n, eps0) at one delta."""

    ns: list[int] = field(default_factory=lambda: [10**4, 10**5, 10**6, 10**7])
    eps0s: list[float] = field(default_factory=lambda: [0.5, 1.0, 2.0, 4.0, 8.0])
    deltas: list[float] = field(default_factory=lambda: [1e-6, 1e-8])
    grr_ks: list[int] = field(default_factory=lambda: [8, 100, 1024])
    grr_ns: list[int] = field(default_factory=lambda: [10**5, 10**6, 10**7])
    grr_eps0s: list[float] = field(default_factory=lambda: [1.0, 4.0])
    grr_delta: float = 1e-6

    @classmethod
    def quick(cls) -> AccountingConfig:
        """``--quick``: n = 1e4 and 1e5, eps0 1 and 4 only (GRR n up to 1e6)."""
        return cls(ns=[10**4, 10**5], eps0s=[1.0, 4.0], grr_ns=[10**5, 10**6])


def binary_rr_row(n: int, eps0: float, delta: float) -> dict[str, Any]:
    """Accountant eps (cold cache), the exact lower bound, their ratio and the accountant's seconds."""
    keep = float(realised_probabilities("binary_rr", eps0, 2)[0])
    clear_cache()
    start = time.perf_counter()
    bound = best_bound(eps0, n, delta, "binary_rr")
    seconds = time.perf_counter() - start
    if BinaryRRExact(eps0, n, keep).exhaustive:
        lower = _binary_rr.exact_epsilon(keep, n, delta)
    else:
        lower = _binary_rr.grid_epsilon(keep, n, delta, GRID_TOLERANCE).lower
    return {
        "n": n,
        "epsilon0": eps0,
        "delta": delta,
        "accountant": bound.epsilon,
        "analysis": bound.analysis,
        "exact_lower": lower,
        "ratio": bound.epsilon / lower if lower > 0 else None,
        "seconds": round(seconds, 3),
    }


def grr_row(k: int, n: int, eps0: float, delta: float) -> dict[str, Any]:
    """The full blanket now (at n, u blocked) against before (exact at n' < n), and the accountant."""
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
    return {
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


def printed(row: dict[str, Any]) -> dict[str, Any]:
    """``row``, after printing it as one JSON line (progress on long grids)."""
    print(json.dumps(row), flush=True)
    return row


def run_accounting(config: AccountingConfig) -> dict[str, Any]:
    """Both grids, row by row as they finish, then the worst ratio; ``{"grr": [...], "binary_rr": [...]}``."""
    print(f"load average at start: {os.getloadavg()}", flush=True)
    grr = [
        printed(grr_row(k, n, eps0, config.grr_delta))
        for k in config.grr_ks
        for n in config.grr_ns
        for eps0 in config.grr_eps0s
    ]
    rr = [
        printed(binary_rr_row(n, eps0, delta))
        for n in config.ns
        for eps0 in config.eps0s
        for delta in config.deltas
    ]
    worst = max(r["ratio"] for r in rr if r["ratio"] is not None)
    slowest = max(r["seconds"] for r in rr)
    print(f"worst accountant / exact-lower ratio: {worst:.5f}; slowest: {slowest:.2f} s")
    return {"grr": grr, "binary_rr": rr}


# ============================================================================ shuffle-only protocols


@dataclass
class ShuffleOnlyConfig:
    """Issue 15's table: target (eps, delta), the n of the epsilon rows, the n and d of the error rows."""

    epsilon: float = 1.0
    delta: float = 1e-6
    sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000)
    error_n: int = 100_000
    domains: tuple[int, ...] = (2, 32, 1024)


def balcer_cheu_rows(config: ShuffleOnlyConfig, n: int) -> list[str]:
    """balcer_cheu_histogram with the theorem's 1 - p (before issue 15) and as the project sets it now."""
    eps, delta = config.epsilon, config.delta
    gamma = Fraction(balcer_cheu_gamma(eps, delta, n), GRID)
    old = balcer_cheu_guarantee(gamma, n, delta).epsilon
    exact_old = balcer_cheu_exact_guarantee(gamma, n, delta).epsilon
    now = mechanisms.create("balcer_cheu_histogram", epsilon0=eps, domain_size=32, expected_n=n, delta=delta)
    stated = now.central_guarantee(n, delta).epsilon
    return [
        f"| balcer_cheu_histogram (theorem 1 - p, before) | {n} | {old:.4g} | {exact_old:.4g} | theorem |",
        f"| balcer_cheu_histogram (now) | {n} | {stated:.4g} | {stated:.4g} | exact two-bucket profile |",
    ]


def cheu_row(config: ShuffleOnlyConfig, n: int) -> str:
    """cheu_binary_sum: exact at n, or at the cost cap's n' (then an upper bound for n)."""
    cheu = mechanisms.create(
        "cheu_binary_sum", epsilon0=config.epsilon, domain_size=2, expected_n=n, delta=config.delta
    )
    bound = cheu.central_guarantee(n, config.delta)
    capped = "evaluated at n'" in bound.note
    exact = f"≤ {bound.epsilon:.4g}" if capped else f"{bound.epsilon:.4g}"
    where = (
        "exact profile at n' = 78,124 < n (cost cap), valid for n"
        if capped
        else "exact shuffled binary-RR profile at n"
    )
    return f"| cheu_binary_sum | {n} | {bound.epsilon:.4g} | {exact} | {where} |"


def multi_message_rows(config: ShuffleOnlyConfig, n: int) -> list[str]:
    """The multi-message sums and histogram: stated eps against the noise-only eps of the ideal protocol."""
    eps, delta = config.epsilon, config.delta
    rows = []
    for name in ("multi_message_sum", "multi_message_sum_binomial"):
        mech = mechanisms.create(name, epsilon0=eps, domain_size=2, expected_n=n, delta=delta)
        p, shares = float(mech.noise), mech.shape_devices  # type: ignore[attr-defined]
        stated = mech.central_guarantee(n, delta).epsilon
        ideal = smallest_epsilon(partial(noise_delta, n, p, polya_shares=shares), delta)
        rows.append(f"| {name} | {n} | {stated:.4g} | ≥ {ideal:.4g} | noise-only ε of the ideal sum |")
    mh = mechanisms.create("multi_message_histogram", epsilon0=eps, domain_size=32, expected_n=n, delta=delta)
    p = float(mh.noise)  # type: ignore[attr-defined]
    stated = mh.central_guarantee(n, delta).epsilon
    ideal = smallest_epsilon(partial(multi_histogram_noise_delta, n, p, n), delta)
    rows.append(
        f"| multi_message_histogram | {n} | {stated:.4g} | ≥ {ideal:.4g} | noise-only ε of the ideal sums |"
    )
    return rows


def sample_and_threshold_row(config: ShuffleOnlyConfig, n: int) -> str:
    """sample_and_threshold: n-free, stated only."""
    st = mechanisms.create(
        "sample_and_threshold", epsilon0=config.epsilon, domain_size=32, delta=config.delta
    )
    stated = st.central_guarantee(n, config.delta).epsilon
    return (
        f"| sample_and_threshold | {n} | {stated:.4g} | ≥ 0.52 at d = 32 (one pair, exact) |"
        " n-free; two changed buckets composed jointly (certified bound, ADR 0041) |"
    )


def epsilon_rows(config: ShuffleOnlyConfig) -> list[str]:
    """Markdown table: every shuffle-only protocol's stated epsilon against its exact one, per n."""
    rows = ["| protocol | n | stated ε | exact ε | note |", "| --- | --- | --- | --- | --- |"]
    for n in config.sizes:
        rows += balcer_cheu_rows(config, n)
        rows.append(cheu_row(config, n))
        rows += multi_message_rows(config, n)
        rows.append(sample_and_threshold_row(config, n))
    return rows


def error_rows(config: ShuffleOnlyConfig) -> list[str]:
    """Markdown table: standard error per bucket against central Laplace, and the device's cost."""
    n = config.error_n
    rows = [
        "| protocol | d | std error / bucket | central Laplace | ratio | messages / device"
        " | bytes / device |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for d in config.domains:
        laplace = central_laplace(config.epsilon, config.delta, d).std_error
        names = ["balcer_cheu_histogram", "multi_message_histogram", "sample_and_threshold"]
        if d == 2:
            names += ["cheu_binary_sum", "multi_message_sum", "multi_message_sum_binomial"]
        for name in names:
            sized = {} if name == "sample_and_threshold" else {"expected_n": float(n)}
            mech = mechanisms.create(
                name, epsilon0=config.epsilon, domain_size=d, delta=config.delta, **sized
            )
            se = expected_std_error(mech, n)
            cost = device_cost(mech)
            rows.append(
                f"| {name} | {d} | {se:.3g} | {laplace:.3g} | {se / laplace:.2f}× |"
                f" {cost['messages_per_device']:.6g} | {cost['bytes_per_device']:,.0f} |"
            )
    return rows


def run_shuffle_only_table(config: ShuffleOnlyConfig) -> dict[str, list[str]]:
    """Both markdown tables, as lists of lines: ``{"epsilon_rows": [...], "error_rows": [...]}``."""
    return {"epsilon_rows": epsilon_rows(config), "error_rows": error_rows(config)}
