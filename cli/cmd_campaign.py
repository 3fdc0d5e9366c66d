"""``deniable campaign create|close|show|list|delete``: campaigns at the aggregator."""

from __future__ import annotations

import argparse
import asyncio
import time

from deniable.admin.campaigns import (
    CampaignSpec,
    campaign_dict,
    close_campaign,
    create_campaign,
    delete_campaign,
    get_campaign,
    list_campaigns,
)
from deniable.admin.shuffler import flush, release_below_n_min
from deniable.cli.options import (
    DEFAULT_AGGREGATOR,
    Subparsers,
    add_client_tls_options,
    add_shuffler_list_option,
    add_shuffler_tls_options,
    client_tls,
    group,
    positive_float,
    positive_int,
    shuffler_tls,
)
from deniable.cli.output import flush_line, print_json
from deniable.core.campaigns import mechanism_has_local_guarantee
from deniable.sim.render import guarantee_words
from deniable.v1 import deniable_pb2 as pb


def register(sub: Subparsers) -> None:
    """Add ``campaign create``, ``close``, ``show``, ``list`` and ``delete``."""
    campaign = group(sub, "campaign", "create and list campaigns")
    _add_create(campaign)
    close = campaign.add_parser(
        "close", help="end a campaign's window now (re-signed); the shuffler releases what it holds"
    )
    close.add_argument("campaign")
    close.add_argument("--aggregator", default=DEFAULT_AGGREGATOR)
    close.add_argument(
        "--shuffler", default=None, help="also tell this shuffler's operator port now (else it learns it)"
    )
    add_client_tls_options(close)
    add_shuffler_tls_options(close)
    close.set_defaults(handler=run_close)
    show = campaign.add_parser("show", help="one campaign's descriptor, with both guarantees")
    show.add_argument("campaign")
    show.add_argument("--aggregator", default=DEFAULT_AGGREGATOR)
    show.add_argument("--json", action="store_true")
    add_client_tls_options(show)
    show.set_defaults(handler=run_show)
    listing = campaign.add_parser("list", help="list campaigns")
    listing.add_argument("--aggregator", default=DEFAULT_AGGREGATOR)
    listing.add_argument("--json", action="store_true")
    add_client_tls_options(listing)
    listing.set_defaults(handler=run_list)
    _add_delete(campaign)


def _add_create(campaign: Subparsers) -> None:
    """``campaign create``: the question, the mechanism (or a plan for it) and the limits."""
    create = campaign.add_parser("create", help="create a campaign at the aggregator")
    create.add_argument("--aggregator", default=DEFAULT_AGGREGATOR)
    create.add_argument("--id", required=True)
    create.add_argument("--question", required=True)
    create.add_argument("--kind", choices=["binary", "categorical"], required=True)
    create.add_argument("--labels", default="", help="comma-separated category labels (categorical)")
    create.add_argument("--mechanism", default=None, help="binary_rr or grr (default by kind)")
    how = create.add_mutually_exclusive_group(required=True)
    how.add_argument("--epsilon0", type=positive_float, help="local ε0 of every report")
    how.add_argument(
        "--target-epsilon",
        type=positive_float,
        help="central ε to plan ε0 for (with --expected-n; picks the mechanism unless --mechanism)",
    )
    create.add_argument("--expected-n", type=positive_int, default=0, help="reports per shuffle (planning)")
    create.add_argument("--delta", type=float, default=1e-6)
    create.add_argument(
        "--n-min", type=positive_int, default=0, help="smallest batch (default 1000; planned: --expected-n)"
    )
    create.add_argument(
        "--budget", type=float, default=0.0, help="per-device epsilon budget (default epsilon0)"
    )
    _add_create_limits(create)
    create.add_argument("--json", action="store_true")
    add_client_tls_options(create)
    create.set_defaults(handler=run_create)


def _add_create_limits(create: argparse.ArgumentParser) -> None:
    """``campaign create``: quota, KEM, window and batch size."""
    create.add_argument(
        "--quota-per-source",
        type=int,
        default=0,
        help="reports one source may spool per window at a shuffler (default: the shuffler's)",
    )
    create.add_argument(
        "--kem",
        choices=["x25519", "x25519-mlkem768"],
        default="x25519",
        help="HPKE KEM devices seal to (x25519-mlkem768: post-quantum hybrid, 1136 bytes per report)",
    )
    create.add_argument(
        "--window",
        default=None,
        help="collection window: a duration from now (90m, 2h, 7d) or an ISO end time (default 7d)",
    )
    create.add_argument(
        "--batch-target",
        type=positive_int,
        default=0,
        help="devices per released batch (default: --expected-n if planned, else n_min)",
    )


def _add_delete(campaign: Subparsers) -> None:
    """``campaign delete``: a closed campaign, after the named shufflers hold nothing of it."""
    delete = campaign.add_parser(
        "delete", help="remove a closed campaign and its counts (refused while its window is open)"
    )
    delete.add_argument("campaign", help="campaign id")
    delete.add_argument(
        "--aggregator", default=DEFAULT_AGGREGATOR, help="the aggregator (default %(default)s)"
    )
    add_shuffler_list_option(
        delete, "refuse while this shuffler (operator port) holds reports of the campaign (repeatable)"
    )
    add_client_tls_options(delete)
    add_shuffler_tls_options(delete)
    delete.set_defaults(handler=run_delete)
    release = campaign.add_parser(
        "release-below-n-min",
        help="authorise batches of a campaign smaller than n_min (the aggregator's operator;"
        " the answer says so); then the shuffler's operator flushes with --below-n-min",
    )
    release.add_argument("campaign", help="campaign id")
    release.add_argument("--aggregator", default=DEFAULT_AGGREGATOR)
    add_client_tls_options(release)
    release.set_defaults(handler=run_release)


def _spec(args: argparse.Namespace) -> CampaignSpec:
    """The options as a ``CampaignSpec``."""
    return CampaignSpec(
        id=args.id,
        question=args.question,
        kind=args.kind,
        labels=args.labels.split(","),
        mechanism=args.mechanism,
        epsilon0=args.epsilon0,
        target_epsilon=args.target_epsilon,
        expected_n=args.expected_n,
        delta=args.delta,
        n_min=args.n_min,
        budget=args.budget,
        quota_per_source=args.quota_per_source,
        kem=args.kem,
        window=args.window,
        batch_target=args.batch_target,
    )


def run_create(args: argparse.Namespace) -> int:
    """Create the campaign and print its descriptor (and the plan, if one was asked for)."""
    request = _spec(args).request(time.time())
    created = asyncio.run(create_campaign(args.aggregator, request, client_tls(args)))
    if args.json:
        print_json(campaign_dict(created))
        return 0
    words = guarantee_words(mechanism_has_local_guarantee(created), created.epsilon0)
    print(
        f"created {created.id}: {len(created.labels)} buckets, {words},"
        f" n_min = {created.n_min}, batch target {created.batch_target} messages,"
        f" window ends {created.window_end_unix} (Unix time), key {created.key_id}"
    )
    if created.target_epsilon:
        print(
            f"planned: {pb.Mechanism.Name(created.mechanism).lower()}, {words}"
            f" for central ε ≤ {created.target_epsilon:g} at δ = {created.delta:g}"
            f" in shuffles of n ≥ {created.expected_n}"
        )
    return 0


def run_close(args: argparse.Namespace) -> int:
    """End the window; with --shuffler also flush that shuffler now."""
    tls = client_tls(args)
    closed = asyncio.run(close_campaign(args.aggregator, args.campaign, tls))
    print(f"closed {closed.id}: window ended at {closed.window_end_unix} (Unix time); description re-signed")
    if args.shuffler:
        print(flush_line(asyncio.run(flush(args.shuffler, shuffler_tls(args, tls), args.campaign))))
    return 0


def run_release(args: argparse.Namespace) -> int:
    """Record at the aggregator that the campaign's batches below n_min may be counted."""
    asyncio.run(release_below_n_min(args.aggregator, args.campaign, client_tls(args)))
    print(
        f"recorded at the aggregator: batches of {args.campaign} below n_min authorised"
        " (the shuffler's operator releases them: deniable shuffler flush --below-n-min)"
    )
    return 0


def run_show(args: argparse.Namespace) -> int:
    """One campaign's descriptor, as JSON or text."""
    shown = asyncio.run(get_campaign(args.aggregator, args.campaign, client_tls(args)))
    if args.json:
        print_json(campaign_dict(shown))
    else:
        print(campaign_text(shown))
    return 0


def run_list(args: argparse.Namespace) -> int:
    """Every campaign: JSON, or one line each."""
    campaigns = asyncio.run(list_campaigns(args.aggregator, client_tls(args)))
    if args.json:
        print_json([campaign_dict(c) for c in campaigns])
        return 0
    for c in campaigns:
        words = guarantee_words(mechanism_has_local_guarantee(c), c.epsilon0)
        print(f"{c.id}\t{pb.Mechanism.Name(c.mechanism).lower()}\t{words}\t{c.question}")
    return 0


def run_delete(args: argparse.Namespace) -> int:
    """Delete a closed campaign, first checking the named shufflers hold nothing of it."""
    tls = client_tls(args)
    deleted = asyncio.run(
        delete_campaign(args.aggregator, args.campaign, args.shuffler, tls, shuffler_tls(args, tls))
    )
    print(
        f"deleted {deleted.campaign_id}: {deleted.counted} counted reports"
        f" in {deleted.batches} batches removed"
    )
    return 0


def campaign_text(c: pb.Campaign) -> str:
    """The descriptor in text: the question, the mechanism, and both guarantees apart."""
    mechanism = pb.Mechanism.Name(c.mechanism).lower()
    target = c.target_epsilon or (0.0 if mechanism_has_local_guarantee(c) else c.epsilon0)
    central = (
        f"ε ≤ {target:g}, δ = {c.delta:g} at n ≥ {c.expected_n or c.n_min}"
        if target
        else "from the smallest batch"
    )
    return "\n".join(
        [
            f"{c.id}: {c.question}",
            f"  mechanism: {mechanism} over {len(c.labels)} buckets ({', '.join(c.labels)})",
            f"  local guarantee: {guarantee_words(mechanism_has_local_guarantee(c), c.epsilon0)}",
            f"  central guarantee: {central}; n_min = {c.n_min} messages",
            f"  device budget: {c.device_budget_epsilon:g}",
        ]
    )
