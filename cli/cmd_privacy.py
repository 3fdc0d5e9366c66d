"""``deniable privacy …``: the mechanisms on offer, the planner and the accountant's answers."""

from __future__ import annotations

import argparse
import math
import sys
from typing import TYPE_CHECKING

from deniable.admin.privacy import MAX_DOMAIN, MAX_N, amplification, plot_profile, profile_table
from deniable.cli.options import Subparsers, positive_float, positive_int
from deniable.sim import render

if TYPE_CHECKING:
    from deniable.core.accounting.planner import Plan


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


def _probability(text: str) -> float:
    """An argparse type: a number strictly between 0 and 1 (a δ)."""
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must lie in (0, 1), got {text}")
    return value


def _domain(text: str) -> int:
    """An argparse type: a domain size of at least 2."""
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"a domain has at least 2 values, got {text}")
    return value


def register(sub: Subparsers) -> None:
    """Add ``privacy mechanisms``, ``privacy plan``, ``privacy amplify`` and ``privacy profile``."""
    privacy = sub.add_parser("privacy", help="mechanisms, planning and accounting").add_subparsers(
        dest="action", required=True
    )
    mechanisms = privacy.add_parser("mechanisms", help="list the randomisers")
    mechanisms.set_defaults(handler=list_mechanisms)
    _add_plan(privacy)
    _add_amplify(privacy)
    _add_profile(privacy)


def _add_plan(privacy: Subparsers) -> None:
    """``privacy plan``: options of the planner."""
    plan = privacy.add_parser(
        "plan", help="the mechanism and epsilon0 that meet a central (ε, δ) at n with the smallest error"
    )
    plan.add_argument("--target-epsilon", type=positive_float, required=True, help="central ε to meet")
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
    plan.add_argument(
        "--max-bytes-per-device",
        type=float,
        default=4096.0,
        help="per-device budget: mean sealed bytes (4096); over-budget candidates win only if none fits",
    )
    plan.add_argument(
        "--max-messages-per-device", type=float, default=16.0, help="per-device budget: mean messages (16)"
    )
    plan.add_argument("--json", action="store_true")
    plan.set_defaults(handler=plan_command)


def _add_amplify(privacy: Subparsers) -> None:
    """``privacy amplify``: one mechanism, ε0 and n."""
    amplify = privacy.add_parser("amplify", help="central (ε, δ) of n shuffled reports, by every analysis")
    amplify.add_argument("--mechanism", required=True)
    amplify.add_argument("--epsilon0", type=positive_float, required=True)
    amplify.add_argument("--n", type=_shuffle_n, required=True)
    amplify.add_argument("--delta", type=_probability, default=1e-6, help="central δ (default 1e-6)")
    amplify.add_argument("--domain", type=_domain, default=2, help="number of categories k (default 2)")
    amplify.add_argument("--json", action="store_true")
    amplify.set_defaults(handler=amplify_command)


def _add_profile(privacy: Subparsers) -> None:
    """``privacy profile``: δ(ε) on a grid or at given ε."""
    profile = privacy.add_parser(
        "profile", help="the privacy profile δ(ε) of n shuffled reports (table, JSON or a plot)"
    )
    profile.add_argument("--mechanism", required=True)
    profile.add_argument(
        "--epsilon0", type=positive_float, required=True, help="local ε0 (shuffle-only: the central target)"
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
    profile.add_argument("--points", type=positive_int, default=20, help="grid points when no --epsilon")
    profile.add_argument("--json", action="store_true")
    profile.add_argument("--plot", type=str, default=None, help="write a PNG of δ(ε) to this path")
    profile.set_defaults(handler=profile_command)


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
    """Bytes with thousands separators, or a dash when unknown (NaN)."""
    return f"{value:,.0f}" if value == value else "—"


def _local_words(plan: Plan) -> str:
    """The chosen mechanism's local guarantee in words."""
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
    from deniable.core.accounting.planner import DeviceBudget, plan

    chosen = plan(
        args.target_epsilon,
        args.delta,
        args.n,
        args.domain,
        mechanisms=args.mechanism,
        require_local_dp=args.require_local_dp,
        budget=DeviceBudget(args.max_bytes_per_device, args.max_messages_per_device),
    )
    if args.json:
        print(render.dumps(chosen.to_dict()))
    else:
        print(plan_text(chosen))
    return 0


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
