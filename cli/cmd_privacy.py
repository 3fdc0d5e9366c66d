"""``deniable privacy …``: the mechanisms on offer, the planner and the accountant's answers."""

from __future__ import annotations

import argparse
import math
import sys
from typing import TYPE_CHECKING, Any

from deniable.sim import render

if TYPE_CHECKING:
    from deniable.core.accounting.planner import Plan
    from deniable.core.mechanisms.base import LocalRandomiser


MAX_N = 10**9  # deniable.core.accounting.planner.MAX_N (not imported: parsing stays light)
MAX_DOMAIN = 4096  # deniable.core.accounting.planner.MAX_DOMAIN


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _shuffle_n(text: str) -> int:
    """A number of reports: a positive integer (1e6 notation accepted); ``_check_limits`` caps it."""
    try:
        number = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}") from None
    if not (math.isfinite(number) and number == int(number) and number >= 1):
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return int(number)


def _check_limits(args: argparse.Namespace) -> None:
    """ValueError (one line, exit 2) for an n or domain whose cost and memory would be unbounded."""
    for flag in ("n", "expected_n"):
        value = getattr(args, flag, None)
        if value is not None and value > MAX_N:
            raise ValueError(
                f"--{flag.replace('_', '-')} {value:.3g} is above the supported maximum {MAX_N:.0e}"
            )
    if getattr(args, "domain", 2) > MAX_DOMAIN:
        raise ValueError(f"--domain {args.domain} is above the supported maximum {MAX_DOMAIN}")


def _positive_float(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _probability(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must lie in (0, 1), got {text}")
    return value


def _domain(text: str) -> int:
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"a domain has at least 2 values, got {text}")
    return value


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``privacy mechanisms``, ``privacy plan``, ``privacy amplify`` and ``privacy profile``."""
    privacy = sub.add_parser("privacy", help="mechanisms, planning and accounting").add_subparsers(
        dest="action", required=True
    )
    mechanisms = privacy.add_parser("mechanisms", help="list the randomisers")
    mechanisms.set_defaults(handler=list_mechanisms)

    plan = privacy.add_parser(
        "plan", help="the mechanism and epsilon0 that meet a central (ε, δ) at n with the smallest error"
    )
    plan.add_argument("--target-epsilon", type=_positive_float, required=True, help="central ε to meet")
    plan.add_argument("--delta", type=_probability, default=1e-6, help="central δ (default 1e-6)")
    plan.add_argument("--n", type=_shuffle_n, required=True, help="reports shuffled together")
    plan.add_argument("--domain", type=_domain, required=True, help="number of categories k (2: binary)")
    plan.add_argument(
        "--mechanism", action="append", default=None, help="only this mechanism (repeatable; default all)"
    )
    plan.add_argument(
        "--require-local-dp",
        action="store_true",
        help="only local randomisers: every report stays ε0-DP even if the shuffler and aggregator misbehave",
    )
    plan.add_argument("--json", action="store_true")
    plan.set_defaults(handler=plan_command)

    amplify = privacy.add_parser("amplify", help="central (ε, δ) of n shuffled reports, by every analysis")
    amplify.add_argument("--mechanism", required=True)
    amplify.add_argument("--epsilon0", type=_positive_float, required=True)
    amplify.add_argument("--n", type=_shuffle_n, required=True)
    amplify.add_argument("--delta", type=_probability, default=1e-6, help="central δ (default 1e-6)")
    amplify.add_argument("--domain", type=_domain, default=2, help="number of categories k (default 2)")
    amplify.add_argument("--json", action="store_true")

    profile = privacy.add_parser(
        "profile", help="the privacy profile δ(ε) of n shuffled reports (table, JSON or a plot)"
    )
    profile.add_argument("--mechanism", required=True)
    profile.add_argument(
        "--epsilon0", type=_positive_float, required=True, help="local ε0 (shuffle-only: the central target)"
    )
    profile.add_argument("--n", type=_shuffle_n, required=True, help="devices shuffled together")
    profile.add_argument("--domain", type=_domain, default=2, help="number of categories k (default 2)")
    profile.add_argument(
        "--delta",
        type=_probability,
        default=1e-6,
        help="δ shuffle-only protocols calibrate to (default 1e-6)",
    )
    profile.add_argument(
        "--expected-n",
        type=_shuffle_n,
        default=None,
        help="shuffle-only protocols: planned n (default --n)",
    )
    profile.add_argument(
        "--epsilon", type=float, action="append", default=None, help="ε to evaluate (repeatable)"
    )
    profile.add_argument("--points", type=_positive_int, default=20, help="grid points when no --epsilon")
    profile.add_argument("--json", action="store_true")
    profile.add_argument("--plot", type=str, default=None, help="write a PNG of δ(ε) to this path")
    profile.set_defaults(handler=profile_command)
    amplify.set_defaults(handler=amplify_command)


def list_mechanisms(args: argparse.Namespace) -> int:
    """One line per registered randomiser."""
    from deniable.core import mechanisms

    for name, summary in mechanisms.summaries().items():
        local = mechanisms.mechanism_class(name).local_privacy
        guarantee = "local ε0 + central" if local else "central only (no local DP)"
        print(f"{name:26} {guarantee:27} {summary}")
    return 0


def _table(header: list[str], rows: list[list[str]], details: list[str] | None = None) -> str:
    """Left-aligned columns; ``details[i]`` (if non-empty) goes on an indented line under row i."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(header, widths, strict=True)).rstrip(),
        "  ".join("-" * w for w in widths),
    ]
    for index, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if details and details[index]:
            lines.append("    " + details[index])
    return "\n".join(lines)


def plan_text(plan: Plan) -> str:
    """The plan as people read it: the candidates table, the baseline and the choice."""
    rows, details = [], []
    for c in plan.candidates:
        if not c.feasible:
            rows.append([c.mechanism, "—", "—", "—", "—", "—", "—", "—"])
            details.append(c.note)
            continue
        params = ", ".join(f"{k}={v:.6g}" for k, v in sorted(c.params.items()))
        mark = " *" if c.mechanism == plan.mechanism else ""
        rows.append(
            [
                c.mechanism + mark,
                f"ε0 = {c.epsilon0:.4f}" if c.local_privacy else "none",
                f"{c.central_epsilon:.4f}",
                f"{c.expected_std_error:.2f}",
                f"{c.expected_std_error / plan.central_laplace.std_error:.1f}×",
                f"{c.messages_per_device:.6g}",
                _bytes(c.bytes_per_device),
                c.analysis,
            ]
        )
        details.append("; ".join(part for part in (params, c.note) if part))
    laplace = plan.central_laplace
    return "\n".join(
        [
            f"target central (ε, δ) = ({plan.target_epsilon:g}, {plan.delta:g}) for n = {plan.n} shuffled"
            f" reports, k = {plan.domain_size}",
            f"std error of one count at n: {plan.truth_assumption}",
            "",
            _table(
                [
                    "mechanism",
                    "local",
                    "central ε",
                    "std error",
                    "vs Laplace",
                    "msgs/device",
                    "bytes/device",
                    "analysis",
                ],
                rows,
                details,
            ),
            "",
            f"central Laplace baseline (trusted curator, same ε): std error {laplace.std_error:.3f}",
            f"  {laplace.note}; neighbours: {laplace.neighbouring}",
            f"chosen: {plan.mechanism}, {_local_words(plan)} → central ε = {plan.central_epsilon:.4f}"
            f" at δ = {plan.delta:g} ({plan.analysis})",
            f"  std error {plan.expected_std_error:.2f} = {plan.ratio_to_central:.1f}× central Laplace",
            *_alternative_lines(plan),
        ]
    )


def _bytes(value: float) -> str:
    return f"{value:,.0f}" if value == value else "—"


def _local_words(plan: Plan) -> str:
    if plan.chosen.local_privacy:
        return f"local ε0 = {plan.epsilon0:.4f}"
    return f"no local guarantee (shuffle-only; ε0 = {plan.epsilon0:.4f} is the central target)"


def _alternative_lines(plan: Plan) -> list[str]:
    """What the choice trades: the best local randomiser and its error ratio, if one exists."""
    if plan.chosen.local_privacy:
        return []
    alternative = plan.local_alternative
    if alternative is None:
        return ["  no local randomiser meets the target: every option gives up local DP"]
    ratio = alternative.expected_std_error / plan.expected_std_error
    return [
        f"  trades local DP for accuracy: the best local option, {alternative.mechanism}"
        f" (local ε0 = {alternative.epsilon0:.4f}), has std error {alternative.expected_std_error:.2f}"
        f" = {ratio:.1f}× the chosen one (--require-local-dp picks it)"
    ]


def plan_command(args: argparse.Namespace) -> int:
    """``privacy plan``: print or emit the plan."""
    _check_limits(args)
    from deniable.core.accounting.planner import plan

    chosen = plan(
        args.target_epsilon,
        args.delta,
        args.n,
        args.domain,
        mechanisms=args.mechanism,
        require_local_dp=args.require_local_dp,
    )
    if args.json:
        print(render.dumps(chosen.to_dict()))
    else:
        print(plan_text(chosen))
    return 0


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
    from deniable.core.accounting import analyses_for

    randomiser = build_randomiser(mechanism, epsilon0, domain, delta, n)
    best = randomiser.central_guarantee(n, delta)
    rows: list[dict[str, Any]] = []
    if randomiser.local_privacy:
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


def amplify_command(args: argparse.Namespace) -> int:
    """``privacy amplify``: the tightest guarantee and the table of every analysis."""
    _check_limits(args)
    result = amplification(args.mechanism, args.epsilon0, args.n, args.delta, args.domain)
    if args.json:
        print(render.dumps(result))
        return 0
    rows = [
        [
            row["analysis"],
            f"{row['epsilon']:.4g}" if row["amplified"] else f"{row['epsilon']:g} (local)",
            f"{row['delta']:g}",
            row["note"].removeprefix(row["analysis"]).strip(),
        ]
        for row in result["analyses"]
    ]
    local = "local ε0" if result["local_privacy"] else "parameter ε0 (shuffle-only protocol)"
    print(
        f"{args.mechanism}, {local} = {args.epsilon0:g}, n = {args.n}, k = {args.domain}, δ = {args.delta:g}"
    )
    if rows:
        print(_table(["analysis", "central ε", "δ", "note"], rows))
    print(
        f"tightest: central (ε, δ) = ({result['epsilon']:.4g}, {result['delta']:g}) by {result['analysis']}"
    )
    return 0


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
    """delta(eps) on a log scale, with the stated guarantee marked."""
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


def profile_command(args: argparse.Namespace) -> int:
    """``privacy profile``: delta(eps) as a table, JSON, and optionally a PNG."""
    _check_limits(args)
    try:
        result = profile_table(
            args.mechanism,
            args.epsilon0,
            args.n,
            args.domain,
            args.delta,
            args.expected_n or args.n,
            args.epsilon,
            args.points,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.plot:
        plot_profile(result, args.plot)
    if args.json:
        print(render.dumps(result))
        return 0
    local = "local ε0" if result["local_privacy"] else "parameter ε0 (shuffle-only protocol)"
    print(f"{args.mechanism}, {local} = {args.epsilon0:g}, n = {args.n}, k = {args.domain}")
    print(
        _table(["ε", "δ(ε)"], [[f"{row['epsilon']:.4f}", f"{row['delta']:.3e}"] for row in result["profile"]])
    )
    guarantee = result["guarantee"]
    print(f"stated at δ = {args.delta:g}: central ε = {guarantee['epsilon']:.4f} ({guarantee['analysis']})")
    if args.plot:
        print(f"plot: {args.plot}")
    return 0
