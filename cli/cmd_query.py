"""``deniable query binary-sum|histogram``: estimates with intervals and the privacy statement."""

from __future__ import annotations

import argparse
import asyncio

from deniable.admin.queries import query
from deniable.cli.options import (
    DEFAULT_AGGREGATOR,
    Subparsers,
    add_client_tls_options,
    client_tls,
    group,
    positive_int,
)
from deniable.cli.output import print_json
from deniable.v1 import deniable_pb2 as pb


def register(sub: Subparsers) -> None:
    """Add ``query binary-sum`` and ``query histogram`` (the same options)."""
    queries = group(sub, "query", "ask the aggregator")
    for name, text in (("binary-sum", "estimated number of yes answers"), ("histogram", "estimated counts")):
        q = queries.add_parser(name, help=text)
        q.add_argument("campaign")
        q.add_argument("--aggregator", default=DEFAULT_AGGREGATOR)
        q.add_argument("--confidence", type=float, default=0.95)
        q.add_argument("--simultaneous", action="store_true", help="CIs that hold for all buckets at once")
        q.add_argument("--clip", action="store_true", help="post-process: negative estimates become 0")
        q.add_argument("--simplex", action="store_true", help="post-process: project onto {x >= 0, Σx = n}")
        q.add_argument(
            "--suppress-below", type=float, default=0.0, help="post-process: zero estimates under X"
        )
        q.add_argument("--top-k", type=int, default=0, help="post-process: keep the K largest buckets")
        q.add_argument(
            "--fake-reports",
            type=positive_int,
            default=0,
            help="m for the manipulation budget (default: 1%% of the counted reports, at least 1)",
        )
        q.add_argument("--json", action="store_true")
        add_client_tls_options(q)
        q.set_defaults(handler=run)


def _request(args: argparse.Namespace) -> pb.QueryRequest:
    """The options as a QueryRequest."""
    return pb.QueryRequest(
        campaign_id=args.campaign,
        confidence=args.confidence,
        fake_reports=args.fake_reports,
        simultaneous=args.simultaneous,
        post_processing=pb.PostProcessing(
            clip_non_negative=args.clip,
            project_simplex=args.simplex,
            suppress_below=args.suppress_below,
            top_k=args.top_k,
        ),
    )


def run(args: argparse.Namespace) -> int:
    """Ask, then print JSON or the table with the privacy and manipulation lines."""
    from deniable.sim.render import answer_json, answer_table, manipulation_line, privacy_line

    binary = args.action == "binary-sum"
    answer = asyncio.run(query(args.aggregator, _request(args), client_tls(args), binary=binary))
    if args.json:
        print_json(answer_json(answer))
        return 0
    if binary and len(answer.buckets) == 2:
        yes = answer.buckets[1]
        print(
            f"estimated yes answers: {yes.estimate:.1f} ± {yes.std_error:.1f}"
            f" ({answer.confidence * 100:g}% CI [{yes.ci_low:.1f}, {yes.ci_high:.1f}])"
            f" of n = {answer.n}"
        )
    print(answer_table(answer))
    print("privacy: " + privacy_line(answer.privacy))
    print(manipulation_line(answer))
    return 0
