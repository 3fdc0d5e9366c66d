"""``deniable status``: a summary of a running deployment through the operator surfaces (TLS +
operator certificate, ADR 0021); ``deniable.admin.status.gather_status`` collects it."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

from deniable.admin.status import gather_status
from deniable.cli.options import (
    DEFAULT_AGGREGATOR,
    Subparsers,
    add_client_tls_options,
    add_shuffler_list_option,
    add_shuffler_tls_options,
    client_tls,
    shuffler_tls,
)


def register(sub: Subparsers) -> None:
    """Add ``status``."""
    status = sub.add_parser("status", help="summary of a running deployment (campaigns, spools, keys)")
    status.add_argument(
        "--aggregator", default=DEFAULT_AGGREGATOR, help="the aggregator (default %(default)s)"
    )
    add_shuffler_list_option(status, "a shuffler's operator port to include (repeatable; default: none)")
    status.add_argument("--json", action="store_true", help="print JSON instead of text (default: off)")
    add_client_tls_options(status)
    add_shuffler_tls_options(status)
    status.set_defaults(handler=run_status)


def _when(unix: float | None) -> str:
    """A Unix time as UTC text, or a dash for none."""
    return "-" if not unix else time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(unix))


def render(status: dict[str, Any]) -> str:
    """The human summary of ``gather_status``'s dict."""
    agg = status["aggregator"]
    lines = [f"aggregator {agg['address']} (deniable {agg['version']}) at {_when(agg['now_unix'])}"]
    lines.append(f"campaigns ({len(status['campaigns'])}):")
    for c in status["campaigns"]:
        window = "no end" if c["window_end_unix"] is None else _when(c["window_end_unix"])
        lines.append(
            f"  {c['id']}  {c['mechanism']}  {'closed' if c['closed'] else 'open'}, window ends {window}"
        )
        held = c["held_at_shufflers"]
        holding = "unknown (no --shuffler)" if not status["shufflers"] else "0"
        if held is not None:
            holding = f"{held['pending']} pending + {held['in_flight']} in flight"
        lines.append(
            f"    held at shufflers: {holding}; batch target {c['batch_target']}, n_min {c['n_min']}"
        )
        lines.append(
            f"    counted {c['counted']} in {c['batches']} batches (smallest {c['smallest_batch']});"
            f" last batch {_when(c['last_batch_unix'])}"
        )
        rejected = ", ".join(f"{k} {v}" for k, v in c["rejected"].items()) or "none"
        lines.append(f"    rejected: {rejected}; key {c['key_id']}")
    lines.append("keys:")
    for k in status["keys"]:
        lines.append(
            f"  {k['key_id']}  {k['state']}  {k['kem']}  campaigns: {','.join(k['campaigns']) or '-'}"
        )
    for s in status["shufflers"]:
        if "error" in s:
            lines.append(f"shuffler {s['address']}: unreachable ({s['error']})")
        else:
            lines.append(
                f"shuffler {s['address']}: {sum(r['pending'] + r['in_flight'] for r in s['campaigns'])} held"
            )
    return "\n".join(lines)


def run_status(args: argparse.Namespace) -> int:
    """Print the deployment's summary (text or JSON)."""
    tls = client_tls(args)
    status = asyncio.run(gather_status(args.aggregator, args.shuffler, tls, shuffler_tls(args, tls)))
    print(json.dumps(status, indent=2) if args.json else render(status))
    return 0
