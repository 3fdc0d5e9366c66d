"""``deniable status``, ``deniable campaign delete`` and ``deniable shuffler spool``: operating a
running deployment through the operator surfaces (TLS + operator certificate, ADR 0021)."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

import grpc

from deniable.core.errors import ConfigurationError
from deniable.core.plumbing.tls import ClientTls
from deniable.v1 import deniable_pb2 as pb


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``status``, ``campaign delete`` and ``shuffler spool``."""
    from deniable.cli.main import DEFAULT_AGGREGATOR, _add_client_tls_options

    status = sub.add_parser("status", help="summary of a running deployment (campaigns, spools, keys)")
    status.add_argument(
        "--aggregator", default=DEFAULT_AGGREGATOR, help="the aggregator (default %(default)s)"
    )
    _add_shuffler_option(status, "a shuffler's operator port to include (repeatable; default: none)")
    status.add_argument("--json", action="store_true", help="print JSON instead of text (default: off)")
    _add_client_tls_options(status)
    status.set_defaults(handler=run_status)

    delete = _group(sub, "campaign").add_parser(
        "delete", help="remove a closed campaign and its counts (refused while its window is open)"
    )
    delete.add_argument("campaign", help="campaign id")
    delete.add_argument(
        "--aggregator", default=DEFAULT_AGGREGATOR, help="the aggregator (default %(default)s)"
    )
    _add_shuffler_option(
        delete, "refuse while this shuffler (operator port) holds reports of the campaign (repeatable)"
    )
    _add_client_tls_options(delete)
    delete.set_defaults(handler=run_delete)

    spool = _group(sub, "shuffler").add_parser("spool", help="reports a shuffler holds, per campaign")
    spool.add_argument(
        "--shuffler", default=None, help="operator port (default 127.0.0.1:7702; --insecure: 7701)"
    )
    spool.add_argument("--json", action="store_true", help="print JSON instead of text (default: off)")
    _add_client_tls_options(spool)
    spool.set_defaults(handler=run_spool)


def _add_shuffler_option(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument("--shuffler", action="append", default=[], metavar="HOST:PORT", help=text)


def _group(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """The subcommand group ``name`` (e.g. ``campaign``) declared in cli/main.py."""
    for action in sub.choices[name]._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise AssertionError(f"no subcommands under {name}")


async def _stats(address: str, tls: ClientTls | None) -> pb.ShufflerStatsResponse:
    from deniable.cli.main import _call

    return await _call(address, lambda s: s.Stats(pb.ShufflerStatsRequest(), timeout=30), "shuffler", tls)


async def gather_status(aggregator: str, shufflers: Sequence[str], tls: ClientTls | None) -> dict[str, Any]:
    """The deployment as one JSON-able dict; an unreachable shuffler is reported, not fatal."""
    from deniable.cli.main import _call

    answer: pb.StatusResponse = await _call(
        aggregator, lambda s: s.Status(pb.StatusRequest(), timeout=30), tls=tls
    )
    spools = await asyncio.gather(*(_stats(a, tls) for a in shufflers), return_exceptions=True)
    held: dict[str, dict[str, int]] = {}
    shuffler_rows: list[dict[str, Any]] = []
    for address, spool in zip(shufflers, spools, strict=True):
        if isinstance(spool, BaseException):
            shuffler_rows.append({"address": address, "error": _error(spool)})
            continue
        shuffler_rows.append({"address": address, "campaigns": spool_rows(spool)})
        for row in spool.campaigns:
            total = held.setdefault(row.campaign_id, {"pending": 0, "in_flight": 0})
            total["pending"] += row.pending
            total["in_flight"] += row.in_flight
    return {
        "aggregator": {"address": aggregator, "version": answer.version, "now_unix": answer.now_unix},
        "campaigns": [_campaign_row(c, held.get(c.campaign.id)) for c in answer.campaigns],
        "keys": [
            {"key_id": k.key_id, "state": k.state, "kem": k.kem, "campaigns": list(k.campaigns)}
            for k in answer.keys
        ],
        "shufflers": shuffler_rows,
    }


def spool_rows(spool: pb.ShufflerStatsResponse) -> list[dict[str, Any]]:
    """One row per campaign a shuffler holds reports of."""
    return [
        {"campaign": r.campaign_id, "pending": r.pending, "in_flight": r.in_flight} for r in spool.campaigns
    ]


def _error(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"


def _campaign_row(row: pb.StatusCampaign, held: dict[str, int] | None) -> dict[str, Any]:
    c = row.campaign
    return {
        "id": c.id,
        "question": c.question,
        "mechanism": pb.Mechanism.Name(c.mechanism).lower(),
        "n_min": c.n_min,
        "batch_target": c.batch_target or c.expected_n or c.n_min,
        "window_end_unix": c.window_end_unix or None,
        "closed": row.closed,
        "counted": row.counted,
        "batches": row.batches,
        "smallest_batch": row.smallest_batch,
        "last_batch_unix": row.last_batch_unix or None,
        "rejected": {r.reason: r.count for r in row.rejected},
        "key_id": c.key_id,
        "held_at_shufflers": held,
    }


def _when(unix: float | None) -> str:
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
    from deniable.cli.main import client_tls

    status = asyncio.run(gather_status(args.aggregator, args.shuffler, client_tls(args)))
    print(json.dumps(status, indent=2) if args.json else render(status))
    return 0


def run_spool(args: argparse.Namespace) -> int:
    """Print what one shuffler holds per campaign."""
    from deniable.cli.main import DEFAULT_SHUFFLER, DEFAULT_SHUFFLER_OPERATOR, client_tls

    tls = client_tls(args)
    address = args.shuffler or (DEFAULT_SHUFFLER if tls is None else DEFAULT_SHUFFLER_OPERATOR)
    rows = spool_rows(asyncio.run(_stats(address, tls)))
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows or [{"campaign": "(nothing held)", "pending": 0, "in_flight": 0}]:
            print(f"{row['campaign']}\t{row['pending']} pending\t{row['in_flight']} in flight")
    return 0


def run_delete(args: argparse.Namespace) -> int:
    """Delete a closed campaign, first checking the named shufflers hold nothing of it."""
    from deniable.cli.main import _call, client_tls

    tls = client_tls(args)

    async def work() -> pb.StatusDeleteCampaignResponse:
        for address in args.shuffler:
            for row in (await _stats(address, tls)).campaigns:
                if row.campaign_id == args.campaign and row.pending + row.in_flight:
                    raise ConfigurationError(
                        f"shuffler {address} still holds {row.pending + row.in_flight} reports of"
                        f" {args.campaign}: flush it (deniable shuffler flush) before deleting"
                    )
        request = pb.StatusDeleteCampaignRequest(campaign_id=args.campaign)
        return await _call(args.aggregator, lambda s: s.DeleteCampaign(request, timeout=60), tls=tls)

    deleted = asyncio.run(work())
    print(
        f"deleted {deleted.campaign_id}: {deleted.counted} counted reports"
        f" in {deleted.batches} batches removed"
    )
    return 0
