"""The accountant's answers as tables: every analysis's bound on n shuffled reports, and the
privacy profile δ(ε), JSON-ready (the ``deniable privacy`` commands print them)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from deniable.core.mechanisms.base import LocalRandomiser

MAX_N = 10**9  # deniable.core.accounting.planner.MAX_N (not imported: parsing stays light)
MAX_DOMAIN = 4096  # deniable.core.accounting.planner.MAX_DOMAIN


def build_randomiser(
    mechanism: str, epsilon0: float, domain: int, delta: float, expected_n: int
) -> LocalRandomiser:
    """The named randomiser; shuffle-only protocols get the delta and expected n they calibrate to."""
    import inspect

    from deniable.core import mechanisms

    accepted = inspect.signature(mechanisms.mechanism_class(mechanism)).parameters
    params: dict[str, float] = {}
    if "delta" in accepted:
        params["delta"] = delta
    if "expected_n" in accepted:
        params["expected_n"] = float(expected_n)
    return mechanisms.create(mechanism, epsilon0=epsilon0, domain_size=domain, **params)


def amplification(mechanism: str, epsilon0: float, n: int, delta: float, domain: int) -> dict[str, Any]:
    """The mechanism's central guarantee and every valid analysis's own bound, JSON-ready."""
    randomiser = build_randomiser(mechanism, epsilon0, domain, delta, n)
    best = randomiser.central_guarantee(n, delta)
    rows = _analysis_rows(randomiser, mechanism, epsilon0, n, delta, domain)
    if best.amplified and best.analysis not in {row["analysis"] for row in rows}:
        rows.append(
            {
                "analysis": best.analysis,
                "epsilon": best.epsilon,
                "delta": best.delta,
                "amplified": best.amplified,
                "note": best.note,
                "citation": "",
                "validity": f"{mechanism}'s own analysis",
            }
        )
    return {
        "mechanism": mechanism,
        "epsilon0": epsilon0,
        "n": n,
        "domain_size": domain,
        "delta_requested": delta,
        "local_privacy": randomiser.local_privacy,
        "epsilon": best.epsilon,
        "delta": best.delta,
        "analysis": best.analysis,
        "amplified": best.amplified,
        "note": best.note,
        "analyses": rows,
    }


def _analysis_rows(
    randomiser: LocalRandomiser, mechanism: str, epsilon0: float, n: int, delta: float, domain: int
) -> list[dict[str, Any]]:
    """One row per published amplification analysis valid for a local randomiser (none otherwise)."""
    from deniable.core.accounting import analyses_for

    if not randomiser.local_privacy:
        return []
    rows: list[dict[str, Any]] = []
    for analysis in analyses_for(epsilon0, n, mechanism, domain):
        bound = analysis.bound(delta)
        rows.append(
            {
                "analysis": analysis.name,
                "epsilon": bound.epsilon,
                "delta": bound.delta,
                "amplified": bound.amplified,
                "note": bound.note,
                "citation": analysis.citation,
                "validity": analysis.validity,
            }
        )
    return rows


def profile_table(
    mechanism: str,
    epsilon0: float,
    n: int,
    domain: int,
    delta: float,
    expected_n: int,
    epsilons: list[float] | None,
    points: int,
) -> dict[str, Any]:
    """delta(eps) on a grid (or at the given eps), with the guarantee at ``delta``, JSON-ready."""
    randomiser = build_randomiser(mechanism, epsilon0, domain, delta, expected_n)
    guarantee = randomiser.central_guarantee(n, delta)
    if epsilons is None:  # up to twice the stated eps, where delta(eps) changes most
        top = epsilon0 if randomiser.local_privacy else 2 * epsilon0
        if guarantee.amplified and math.isfinite(guarantee.epsilon) and guarantee.epsilon > 0:
            top = min(top, 2 * guarantee.epsilon)
        epsilons = [top * j / points for j in range(1, points + 1)]
    for eps in epsilons:
        if not (math.isfinite(eps) and eps >= 0):
            raise ValueError(f"--epsilon must be a finite number >= 0, got {eps!r}")
    rows = [{"epsilon": eps, "delta": randomiser.privacy_profile(n, eps)} for eps in sorted(epsilons)]
    return {
        "mechanism": mechanism,
        "epsilon0": epsilon0,
        "n": n,
        "domain_size": domain,
        "local_privacy": randomiser.local_privacy,
        "params": randomiser.parameters(),
        "profile": rows,
        "guarantee": {
            "epsilon": guarantee.epsilon,
            "delta": guarantee.delta,
            "analysis": guarantee.analysis,
            "amplified": guarantee.amplified,
        },
    }


def plot_profile(result: dict[str, Any], path: str) -> None:
    """delta(eps) on a log scale, with the stated guarantee marked (the [plot] extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    eps = [row["epsilon"] for row in result["profile"]]
    deltas = [max(row["delta"], 1e-300) for row in result["profile"]]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.semilogy(eps, deltas, marker="o", markersize=3, label="δ(ε) (upper bound)")
    guarantee = result["guarantee"]
    if math.isfinite(guarantee["epsilon"]) and guarantee["delta"] > 0:
        ax.scatter([guarantee["epsilon"]], [guarantee["delta"]], color="C3", zorder=3, label="stated (ε, δ)")
    ax.set_xlabel("ε")
    ax.set_ylabel("δ")
    ax.set_title(
        f"{result['mechanism']}: ε0 = {result['epsilon0']:g}, n = {result['n']}, k = {result['domain_size']}"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
