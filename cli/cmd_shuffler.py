"""``deniable shuffler serve|flush|spool``: run a shuffler, forward what it holds now, show it."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

from deniable.admin.shuffler import flush, spool, spool_rows
from deniable.cli.options import (
    DEFAULT_AGGREGATOR,
    DEFAULT_QUOTA,
    DEFAULT_SHUFFLER,
    DEFAULT_SHUFFLER_OPERATOR,
    Subparsers,
    add_client_tls_options,
    add_mqtt_options,
    add_server_tls_options,
    add_tracing_options,
    client_tls,
    config_source,
    group,
    mqtt_broker,
    positive_float,
    secret_from_env,
    server_tls,
    shuffler_operator_address,
    spool_store_dsn,
    tracer_provider,
)
from deniable.cli.output import flush_line
from deniable.core.plumbing import mqtt

if TYPE_CHECKING:
    from deniable.shuffler.mqtt import MqttIngressConfig


def register(sub: Subparsers) -> None:
    """Add ``shuffler serve``, ``shuffler flush`` and ``shuffler spool``."""
    shuffler = group(sub, "shuffler", "the shuffler service")
    _add_serve(shuffler)
    _add_flush(shuffler)
    spooled = shuffler.add_parser("spool", help="reports a shuffler holds, per campaign")
    spooled.add_argument(
        "--shuffler", default=None, help="operator port (default 127.0.0.1:7702; --insecure: 7701)"
    )
    spooled.add_argument("--json", action="store_true", help="print JSON instead of text (default: off)")
    add_client_tls_options(spooled)
    spooled.set_defaults(handler=run_spool)


def _add_serve(shuffler: Subparsers) -> None:
    """``shuffler serve`` and its options."""
    serve = shuffler.add_parser("serve", help="run the shuffler until SIGTERM")
    serve.add_argument("--listen", default=DEFAULT_SHUFFLER)
    serve.add_argument("--data-dir", type=Path, required=True)
    serve.add_argument("--upstream", default=DEFAULT_AGGREGATOR, help="aggregator address")
    serve.add_argument(
        "--forward-nats",
        default=None,
        metavar="URL",
        help="forward batches to this NATS JetStream (nats://host:4222) instead of gRPC;"
        " campaigns still come from --upstream (default: gRPC forwarding)",
    )
    _add_spool_store_options(serve)
    serve.add_argument("--metrics-port", type=int, default=None)
    add_tracing_options(serve)
    add_server_tls_options(serve)
    serve.add_argument(
        "--operator-listen",
        default=DEFAULT_SHUFFLER_OPERATOR,
        help="mutual-TLS port for operators and devices with certificates (default %(default)s)",
    )
    serve.add_argument(
        "--upstream-ca", type=Path, default=None, help="CA of the aggregator's certificate (default --tls-ca)"
    )
    _add_quota_options(serve)
    _add_mqtt_ingress_options(serve)
    serve.set_defaults(handler=run_serve)


def _add_spool_store_options(serve: argparse.ArgumentParser) -> None:
    """The PostgreSQL spool's DSN, from a flag or (better) a file or the environment."""
    serve.add_argument(
        "--spool-store",
        default=None,
        metavar="DSN",
        help="spool in this PostgreSQL database, shareable by several shufflers"
        " (postgresql://user@host:port/db; password from $PGPASSWORD or $PGPASSFILE);"
        " default: SQLite in the data directory. Prefer --spool-store-file or the environment:"
        " argv is visible to every local user",
    )
    serve.add_argument(
        "--spool-store-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="read the spool DSN from this file (a mounted secret); without either option:"
        " $DENIABLE_SPOOL_STORE, else the file $DENIABLE_SPOOL_STORE_FILE",
    )


def _add_quota_options(serve: argparse.ArgumentParser) -> None:
    """Reports one source may spool per campaign per window."""
    serve.add_argument(
        "--quota-per-source",
        type=int,
        default=DEFAULT_QUOTA,
        help="reports one address (or device certificate) may spool per campaign per window;"
        " a campaign's own quota overrides it; 0: no limit (default %(default)s)",
    )
    serve.add_argument(
        "--quota-window", type=positive_float, default=3600.0, help="quota window in seconds (default 3600)"
    )


def _add_mqtt_ingress_options(serve: argparse.ArgumentParser) -> None:
    """The shuffler's MQTT face (docs/mqtt.md)."""
    add_mqtt_options(serve, "also take reports and announce campaigns on this MQTT broker")
    serve.add_argument(
        "--mqtt-shared",
        action="store_true",
        help="MQTT 5 shared subscription: shuffler replicas split the requests",
    )
    serve.add_argument(
        "--mqtt-username",
        default=None,
        help="broker login (password: $DENIABLE_MQTT_PASSWORD, or the file $DENIABLE_MQTT_PASSWORD_FILE)",
    )


def _add_flush(shuffler: Subparsers) -> None:
    """``shuffler flush`` and its options."""
    flushing = shuffler.add_parser("flush", help="forward spooled reports now")
    flushing.add_argument(
        "--shuffler",
        default=None,
        help=f"the shuffler's operator port (default {DEFAULT_SHUFFLER_OPERATOR};"
        f" with --insecure {DEFAULT_SHUFFLER})",
    )
    add_client_tls_options(flushing)
    flushing.add_argument("--campaign", default="", help="only this campaign (default: all)")
    flushing.add_argument(
        "--below-n-min",
        action="store_true",
        help="also forward batches smaller than n_min; the aggregator counts them only once its own"
        " operator authorised it (deniable campaign release-below-n-min), and says so",
    )
    flushing.set_defaults(handler=run_flush)


def run_serve(args: argparse.Namespace) -> int:
    """Serve until SIGTERM."""
    from deniable.shuffler import ShufflerConfig, serve_shuffler

    config = ShufflerConfig(
        data_dir=args.data_dir,
        upstream=args.upstream,
        listen=args.listen,
        spool_store=spool_store_dsn(args.spool_store, args.spool_store_file),
        forward_nats=args.forward_nats,
        metrics_port=args.metrics_port,
        tracer_provider=tracer_provider("shuffler", args),
        mqtt=_mqtt_ingress(args),
        tls=server_tls(args),
        insecure=args.insecure,
        operator_listen=None if args.insecure else args.operator_listen,
        upstream_ca=args.upstream_ca,
        quota_per_source=args.quota_per_source,
        quota_window_s=args.quota_window,
        config_source=config_source(args),
    )
    asyncio.run(serve_shuffler(config))
    return 0


def _mqtt_ingress(args: argparse.Namespace) -> MqttIngressConfig | None:
    """The shuffler's MQTT face from its options; ConfigurationError (one line) when unusable."""
    if args.mqtt is None:
        return None
    from deniable.shuffler.mqtt import MqttIngressConfig

    password = secret_from_env("DENIABLE_MQTT_PASSWORD")
    broker = dataclasses.replace(mqtt_broker(args), username=args.mqtt_username, password=password)
    return MqttIngressConfig(
        broker=broker, prefix=mqtt.check_prefix(args.mqtt_prefix), shared_subscription=args.mqtt_shared
    )


def run_flush(args: argparse.Namespace) -> int:
    """Flush (below n_min too if asked) and say what moved."""
    tls = client_tls(args)
    target = shuffler_operator_address(args.shuffler, tls)
    flushed = asyncio.run(flush(target, tls, args.campaign, args.below_n_min))
    print(flush_line(flushed))
    return 0


def run_spool(args: argparse.Namespace) -> int:
    """Print what one shuffler holds per campaign."""
    tls = client_tls(args)
    rows = spool_rows(asyncio.run(spool(shuffler_operator_address(args.shuffler, tls), tls)))
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        for row in rows or [{"campaign": "(nothing held)", "pending": 0, "in_flight": 0}]:
            print(f"{row['campaign']}\t{row['pending']} pending\t{row['in_flight']} in flight")
    return 0
