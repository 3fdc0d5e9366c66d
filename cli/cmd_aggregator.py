"""``deniable aggregator serve``: options → ``AggregatorConfig`` → ``serve_aggregator``."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from deniable.cli.options import (
    DEFAULT_AGGREGATOR,
    Subparsers,
    add_server_tls_options,
    add_tracing_options,
    config_source,
    env_int,
    group,
    positive_float,
    server_tls,
    store_dsn,
    tracer_provider,
)


def register(sub: Subparsers) -> None:
    """Add ``aggregator serve``."""
    serve = group(sub, "aggregator", "the aggregator service").add_parser(
        "serve", help="run the aggregator until SIGTERM"
    )
    serve.add_argument("--listen", default=DEFAULT_AGGREGATOR)
    serve.add_argument("--data-dir", type=Path, required=True)
    serve.add_argument(
        "--decrypt-workers",
        type=int,
        default=None,
        help="decryption processes (default: one per core; 0: no pool, a thread)",
    )
    serve.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics here")
    add_tracing_options(serve)
    add_server_tls_options(serve)
    _add_retention_options(serve)
    _add_nats_options(serve)
    _add_store_options(serve)
    serve.add_argument(
        "--key-group",
        type=int,
        default=env_int("DENIABLE_KEY_GROUP"),
        metavar="GID",
        help="accept key files readable by this group, the process's own (Kubernetes fsGroup, ADR"
        " 0020); default $DENIABLE_KEY_GROUP, else owner-only (0600)",
    )
    serve.set_defaults(handler=run)


def _add_retention_options(serve: argparse.ArgumentParser) -> None:
    """How long retired keys and report ids are kept."""
    serve.add_argument(
        "--key-drain-s",
        type=float,
        default=86_400.0,
        help="destroy a retired HPKE key this long after its last campaign closed (default one day)",
    )
    serve.add_argument(
        "--retention-margin",
        type=float,
        default=7 * 86_400.0,
        metavar="SECONDS",
        help="keep report ids this long after a campaign's window ends, then forget them; later"
        " reports of it are rejected as CAMPAIGN_CLOSED (default 7 days)",
    )
    serve.add_argument(
        "--close-grace",
        type=float,
        default=900.0,
        metavar="SECONDS",
        help="count a batch only if it arrives within this long of its campaign's window end or"
        " close; later ones are CAMPAIGN_CLOSED whatever the shuffler does (default 15 minutes)",
    )


def _add_nats_options(serve: argparse.ArgumentParser) -> None:
    """Batches from NATS JetStream besides gRPC."""
    serve.add_argument(
        "--nats",
        default=None,
        metavar="URL",
        help="also take batches from this NATS JetStream (nats://host:4222), as one more worker"
        " (default: gRPC IngestBatch only)",
    )
    serve.add_argument(
        "--nats-ack-wait",
        type=positive_float,
        default=60.0,
        help="seconds a worker may hold a batch unacknowledged before it is redelivered (default 60)",
    )


def _add_store_options(serve: argparse.ArgumentParser) -> None:
    """The PostgreSQL store's DSN, from a flag or (better) a file or the environment."""
    serve.add_argument(
        "--store",
        default=None,
        metavar="DSN",
        help="counts and campaigns in this PostgreSQL database (postgresql://user:pw@host:port/db);"
        " default: SQLite in the data directory. Prefer --store-file or the environment:"
        " argv is visible to every local user",
    )
    serve.add_argument(
        "--store-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="read the store DSN from this file (a mounted secret); without either option:"
        " $DENIABLE_STORE, else the file $DENIABLE_STORE_FILE",
    )


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM."""
    from deniable.aggregator import AggregatorConfig, serve_aggregator
    from deniable.aggregator.server import default_decrypt_workers

    config = AggregatorConfig(
        data_dir=args.data_dir,
        listen=args.listen,
        decrypt_workers=default_decrypt_workers() if args.decrypt_workers is None else args.decrypt_workers,
        metrics_port=args.metrics_port,
        tracer_provider=tracer_provider("aggregator", args),
        store=store_dsn(args.store, args.store_file),
        key_group=args.key_group,
        tls=server_tls(args),
        insecure=args.insecure,
        key_drain_s=args.key_drain_s,
        retention_margin_s=args.retention_margin,
        close_grace_s=args.close_grace,
        nats=args.nats,
        nats_ack_wait_s=args.nats_ack_wait,
        config_source=config_source(args),
    )
    asyncio.run(serve_aggregator(config))
    return 0
