"""The ``deniable`` command: one entry point, one subcommand per job.

Errors reach the user as one line on stderr: exit 2 for configuration and usage errors, 1 for a
failed remote call.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import os
import pkgutil
import ssl
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import grpc

from deniable.cli.windows import parse_window
from deniable.core.campaigns import local_epsilon, mechanism_has_local_guarantee
from deniable.core.errors import ConfigurationError
from deniable.core.plumbing import mqtt
from deniable.core.plumbing.mqtt import BrokerAddress
from deniable.core.plumbing.tls import ClientTls, ServerTls
from deniable.sim import render
from deniable.sim.render import guarantee_words
from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:
    from deniable.shuffler.mqtt import MqttIngressConfig

DEFAULT_AGGREGATOR = "127.0.0.1:7700"
DEFAULT_SHUFFLER = "127.0.0.1:7701"
DEFAULT_SHUFFLER_OPERATOR = "127.0.0.1:7702"
DEFAULT_QUOTA = 1000
T = TypeVar("T")


def _env_int(name: str) -> int | None:
    """An integer from the environment (None when unset); a clear error when it is not one."""
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise SystemExit(f"deniable: error: ${name} must be an integer, not {text!r}") from None


def secret_from_env(name: str) -> str | None:
    """``$NAME``, else the stripped contents of the file ``$NAME_FILE`` (a mounted secret), else None."""
    value = os.environ.get(name)
    if value:
        return value
    path = os.environ.get(f"{name}_FILE")
    return read_secret(Path(path)) if path else None


def read_secret(path: Path) -> str | None:
    """A secret file's stripped contents (None if empty); one-line ConfigurationError if unreadable."""
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError as exc:
        raise ConfigurationError(f"cannot read the secret file {path}: {exc.strerror or exc}") from None


def store_dsn(flag: str | None, path: Path | None) -> str | None:
    """The aggregator's store DSN: --store, --store-file, $DENIABLE_STORE, $DENIABLE_STORE_FILE, in order.

    Files and the environment keep a PostgreSQL password out of argv (docs/storage.md, deploy/).
    """
    if flag:
        return flag
    if path is not None:
        return read_secret(path)
    return secret_from_env("DENIABLE_STORE")


def spool_store_dsn(flag: str | None, path: Path | None) -> str | None:
    """The shuffler's spool DSN, as ``store_dsn``: --spool-store, --spool-store-file,
    $DENIABLE_SPOOL_STORE, $DENIABLE_SPOOL_STORE_FILE, in order (None: SQLite)."""
    if flag:
        return flag
    if path is not None:
        return read_secret(path)
    return secret_from_env("DENIABLE_SPOOL_STORE")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


class CommandModule(Protocol):
    """A ``cli/cmd_*.py`` module: adds its subcommands; each sets ``handler`` (args -> exit code)."""

    def register(self, sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None: ...


def _command_modules() -> list[CommandModule]:
    """Every ``deniable.cli.cmd_*`` module, so a command group is one new file."""
    import deniable.cli

    found: list[CommandModule] = []
    for info in sorted(pkgutil.iter_modules(deniable.cli.__path__), key=lambda m: m.name):
        if info.name.startswith("cmd_"):
            found.append(importlib.import_module(f"deniable.cli.{info.name}"))
    return found


def build_parser() -> argparse.ArgumentParser:
    """All subcommands and their options."""
    parser = argparse.ArgumentParser(
        prog="deniable", description="Private telemetry in the shuffle model of DP."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run the whole pipeline on loopback with simulated devices")
    demo.add_argument(
        "--devices", type=_positive_int, default=20_000, help="simulated devices (default 20000)"
    )
    demo.add_argument("--epsilon0", type=_positive_float, default=2.0, help="local epsilon (default 2.0)")
    demo.add_argument("--mechanism", default=None, help="randomiser for the histogram campaign (default grr)")
    demo.add_argument(
        "--target-epsilon",
        type=_positive_float,
        default=None,
        help="plan ε0 (and the mechanisms unless --mechanism) for this central ε at n = --devices",
    )
    demo.add_argument("--delta", type=float, default=1e-6, help="central δ (default 1e-6)")
    demo.add_argument("--json", type=Path, default=None, help="write the results as JSON here")
    demo.add_argument("--plot", type=Path, default=None, help="write a PNG of estimates against the truth")
    demo.add_argument(
        "--workdir", type=Path, default=None, help="keep the services' data here (default: temp)"
    )
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    _add_mqtt_options(demo, "devices reach the shuffler through this MQTT broker instead of gRPC")
    demo.add_argument("--mqtt-ca", type=Path, default=None, help="TLS to the broker, trusting this CA file")
    demo.add_argument(
        "--mqtt-insecure", action="store_true", help="plaintext to the MQTT broker (tests only)"
    )

    aggregator = sub.add_parser("aggregator", help="the aggregator service").add_subparsers(
        dest="action", required=True
    )
    agg_serve = aggregator.add_parser("serve", help="run the aggregator until SIGTERM")
    agg_serve.add_argument("--listen", default=DEFAULT_AGGREGATOR)
    agg_serve.add_argument("--data-dir", type=Path, required=True)
    agg_serve.add_argument(
        "--decrypt-workers",
        type=int,
        default=None,
        help="decryption processes (default: one per core; 0: no pool, a thread)",
    )
    agg_serve.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus metrics here")
    _add_tracing_options(agg_serve)
    _add_server_tls_options(agg_serve)
    agg_serve.add_argument(
        "--key-drain-s",
        type=float,
        default=86_400.0,
        help="destroy a retired HPKE key this long after its last campaign closed (default one day)",
    )
    agg_serve.add_argument(
        "--retention-margin",
        type=float,
        default=7 * 86_400.0,
        metavar="SECONDS",
        help="keep report ids this long after a campaign's window ends, then forget them; later"
        " reports of it are rejected as CAMPAIGN_CLOSED (default 7 days)",
    )
    agg_serve.add_argument(
        "--nats",
        default=None,
        metavar="URL",
        help="also take batches from this NATS JetStream (nats://host:4222), as one more worker"
        " (default: gRPC IngestBatch only)",
    )
    agg_serve.add_argument(
        "--nats-ack-wait",
        type=_positive_float,
        default=60.0,
        help="seconds a worker may hold a batch unacknowledged before it is redelivered (default 60)",
    )
    agg_serve.add_argument(
        "--store",
        default=None,
        metavar="DSN",
        help="counts and campaigns in this PostgreSQL database (postgresql://user:pw@host:port/db);"
        " default: SQLite in the data directory. Prefer --store-file or the environment:"
        " argv is visible to every local user",
    )
    agg_serve.add_argument(
        "--store-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="read the store DSN from this file (a mounted secret); without either option:"
        " $DENIABLE_STORE, else the file $DENIABLE_STORE_FILE",
    )
    agg_serve.add_argument(
        "--key-group",
        type=int,
        default=_env_int("DENIABLE_KEY_GROUP"),
        metavar="GID",
        help="accept key files readable by this group, the process's own (Kubernetes fsGroup, ADR"
        " 0020); default $DENIABLE_KEY_GROUP, else owner-only (0600)",
    )

    shuffler = sub.add_parser("shuffler", help="the shuffler service").add_subparsers(
        dest="action", required=True
    )
    shuf_serve = shuffler.add_parser("serve", help="run the shuffler until SIGTERM")
    shuf_serve.add_argument("--listen", default=DEFAULT_SHUFFLER)
    shuf_serve.add_argument("--data-dir", type=Path, required=True)
    shuf_serve.add_argument("--upstream", default=DEFAULT_AGGREGATOR, help="aggregator address")
    shuf_serve.add_argument(
        "--forward-nats",
        default=None,
        metavar="URL",
        help="forward batches to this NATS JetStream (nats://host:4222) instead of gRPC;"
        " campaigns still come from --upstream (default: gRPC forwarding)",
    )
    shuf_serve.add_argument(
        "--spool-store",
        default=None,
        metavar="DSN",
        help="spool in this PostgreSQL database, shareable by several shufflers"
        " (postgresql://user@host:port/db; password from $PGPASSWORD or $PGPASSFILE);"
        " default: SQLite in the data directory. Prefer --spool-store-file or the environment:"
        " argv is visible to every local user",
    )
    shuf_serve.add_argument(
        "--spool-store-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="read the spool DSN from this file (a mounted secret); without either option:"
        " $DENIABLE_SPOOL_STORE, else the file $DENIABLE_SPOOL_STORE_FILE",
    )
    shuf_serve.add_argument("--metrics-port", type=int, default=None)
    _add_tracing_options(shuf_serve)
    _add_server_tls_options(shuf_serve)
    shuf_serve.add_argument(
        "--operator-listen",
        default=DEFAULT_SHUFFLER_OPERATOR,
        help="mutual-TLS port for operators and devices with certificates (default %(default)s)",
    )
    shuf_serve.add_argument(
        "--upstream-ca", type=Path, default=None, help="CA of the aggregator's certificate (default --tls-ca)"
    )
    shuf_serve.add_argument(
        "--quota-per-source",
        type=int,
        default=DEFAULT_QUOTA,
        help="reports one address (or device certificate) may spool per campaign per window;"
        " a campaign's own quota overrides it; 0: no limit (default %(default)s)",
    )
    shuf_serve.add_argument(
        "--quota-window", type=_positive_float, default=3600.0, help="quota window in seconds (default 3600)"
    )
    _add_mqtt_options(shuf_serve, "also take reports and announce campaigns on this MQTT broker")
    shuf_serve.add_argument(
        "--mqtt-shared",
        action="store_true",
        help="MQTT 5 shared subscription: shuffler replicas split the requests",
    )
    shuf_serve.add_argument(
        "--mqtt-username",
        default=None,
        help="broker login (password: $DENIABLE_MQTT_PASSWORD, or the file $DENIABLE_MQTT_PASSWORD_FILE)",
    )
    shuf_serve.add_argument(
        "--mqtt-ca", type=Path, default=None, help="TLS to the broker, trusting this CA file"
    )
    flush = shuffler.add_parser("flush", help="forward spooled reports now")
    flush.add_argument(
        "--shuffler",
        default=None,
        help=f"the shuffler's operator port (default {DEFAULT_SHUFFLER_OPERATOR};"
        f" with --insecure {DEFAULT_SHUFFLER})",
    )
    _add_client_tls_options(flush)
    flush.add_argument("--campaign", default="", help="only this campaign (default: all)")
    flush.add_argument(
        "--below-n-min",
        action="store_true",
        help="also forward batches smaller than n_min (first recorded at the aggregator, which states it;"
        " needs --campaign)",
    )
    flush.add_argument("--aggregator", default=DEFAULT_AGGREGATOR, help="where --below-n-min is recorded")

    campaign = sub.add_parser("campaign", help="create and list campaigns").add_subparsers(
        dest="action", required=True
    )
    create = campaign.add_parser("create", help="create a campaign at the aggregator")
    create.add_argument("--aggregator", default=DEFAULT_AGGREGATOR)
    create.add_argument("--id", required=True)
    create.add_argument("--question", required=True)
    create.add_argument("--kind", choices=["binary", "categorical"], required=True)
    create.add_argument("--labels", default="", help="comma-separated category labels (categorical)")
    create.add_argument("--mechanism", default=None, help="binary_rr or grr (default by kind)")
    how = create.add_mutually_exclusive_group(required=True)
    how.add_argument("--epsilon0", type=_positive_float, help="local ε0 of every report")
    how.add_argument(
        "--target-epsilon",
        type=_positive_float,
        help="central ε to plan ε0 for (with --expected-n; picks the mechanism unless --mechanism)",
    )
    create.add_argument("--expected-n", type=_positive_int, default=0, help="reports per shuffle (planning)")
    create.add_argument("--delta", type=float, default=1e-6)
    create.add_argument(
        "--n-min", type=_positive_int, default=0, help="smallest batch (default 1000; planned: --expected-n)"
    )
    create.add_argument(
        "--budget", type=float, default=0.0, help="per-device epsilon budget (default epsilon0)"
    )
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
        type=_positive_int,
        default=0,
        help="devices per released batch (default: --expected-n if planned, else n_min)",
    )
    create.add_argument("--json", action="store_true")
    _add_client_tls_options(create)
    close = campaign.add_parser(
        "close", help="end a campaign's window now (re-signed); the shuffler releases what it holds"
    )
    close.add_argument("campaign")
    close.add_argument("--aggregator", default=DEFAULT_AGGREGATOR)
    close.add_argument(
        "--shuffler", default=None, help="also tell this shuffler's operator port now (else it learns it)"
    )
    _add_client_tls_options(close)
    show_campaign = campaign.add_parser("show", help="one campaign's descriptor, with both guarantees")
    show_campaign.add_argument("campaign")
    show_campaign.add_argument("--aggregator", default=DEFAULT_AGGREGATOR)
    show_campaign.add_argument("--json", action="store_true")
    _add_client_tls_options(show_campaign)
    listing = campaign.add_parser("list", help="list campaigns")
    listing.add_argument("--aggregator", default=DEFAULT_AGGREGATOR)
    listing.add_argument("--json", action="store_true")
    _add_client_tls_options(listing)

    query = sub.add_parser("query", help="ask the aggregator").add_subparsers(dest="action", required=True)
    for name, text in (("binary-sum", "estimated number of yes answers"), ("histogram", "estimated counts")):
        q = query.add_parser(name, help=text)
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
            type=_positive_int,
            default=0,
            help="m for the manipulation budget (default: 1%% of the counted reports, at least 1)",
        )
        q.add_argument("--json", action="store_true")
        _add_client_tls_options(q)

    keys = sub.add_parser("keys", help="aggregator keys").add_subparsers(dest="action", required=True)
    show = keys.add_parser("show", help="show public keys and ids")
    show.add_argument("--aggregator", default=DEFAULT_AGGREGATOR)
    show.add_argument("--data-dir", type=Path, default=None, help="read the keyring on disk instead")
    show.add_argument("--json", action="store_true")
    _add_client_tls_options(show)
    rotate = keys.add_parser("rotate", help="new active HPKE key; the old one is kept until drained")
    rotate.add_argument("--aggregator", default=DEFAULT_AGGREGATOR)
    rotate.add_argument("--kem", choices=["x25519", "x25519-mlkem768"], default="x25519")
    _add_client_tls_options(rotate)
    destroy = keys.add_parser("destroy", help="overwrite and remove a retired key now (after draining)")
    destroy.add_argument("key_id", type=_positive_int)
    destroy.add_argument("--aggregator", default=DEFAULT_AGGREGATOR)
    _add_client_tls_options(destroy)

    for module in _command_modules():
        module.register(sub)
    from deniable.cli import config
    from deniable.core.plumbing.build import version

    config.install(parser, version())
    return parser


def _add_server_tls_options(parser: argparse.ArgumentParser) -> None:
    """``--tls-cert/--tls-key/--tls-ca`` or ``--insecure`` for a service."""
    parser.add_argument("--tls-cert", type=Path, default=None, help="this service's certificate (PEM)")
    parser.add_argument("--tls-key", type=Path, default=None, help="its private key (PEM)")
    parser.add_argument(
        "--tls-ca", type=Path, default=None, help="the CA that issues the peers' certificates"
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="plaintext, no credentials checked: every RPC open (tests only)",
    )


def _add_client_tls_options(parser: argparse.ArgumentParser) -> None:
    """``--tls-ca`` (+ ``--tls-cert/--tls-key``, the operator certificate) or ``--insecure``."""
    parser.add_argument(
        "--tls-ca", type=Path, default=None, help="the CA that issued the server's certificate"
    )
    parser.add_argument("--tls-cert", type=Path, default=None, help="client (operator) certificate (PEM)")
    parser.add_argument("--tls-key", type=Path, default=None, help="its private key (PEM)")
    parser.add_argument("--insecure", action="store_true", help="plaintext, to a service run with --insecure")


def _add_tracing_options(serve: argparse.ArgumentParser) -> None:
    """``--otel-endpoint`` / ``--otel-console``: OpenTelemetry spans of the gRPC calls (the [otel] extra)."""
    serve.add_argument(
        "--otel-endpoint",
        default=None,
        metavar="URL",
        help="export OpenTelemetry spans of the gRPC calls to this OTLP/gRPC collector (the otel extra)",
    )
    serve.add_argument(
        "--otel-console", action="store_true", help="print OpenTelemetry spans on stdout (debugging)"
    )


def _tracer_provider(service: str, args: argparse.Namespace) -> Any:
    """The service's TracerProvider if tracing was asked for, else None (OpenTelemetry stays unimported)."""
    if args.otel_endpoint is None and not args.otel_console:
        return None
    from deniable.core.plumbing.tracing import tracer_provider

    return tracer_provider(service, args.otel_endpoint, args.otel_console)


def server_tls(args: argparse.Namespace) -> ServerTls | None:
    """The service's TLS files from its options; one-line ConfigurationError if incomplete."""
    given = [args.tls_cert, args.tls_key, args.tls_ca]
    if args.insecure:
        if any(given):
            raise ConfigurationError("--insecure with --tls-cert/--tls-key/--tls-ca: choose one")
        return None
    if not all(given):
        raise ConfigurationError(
            "TLS needs --tls-cert, --tls-key and --tls-ca (make them with `deniable certs dev`),"
            " or --insecure for plaintext (tests only)"
        )
    return ServerTls(cert=args.tls_cert, key=args.tls_key, ca=args.tls_ca)


def client_tls(args: argparse.Namespace) -> ClientTls | None:
    """How this command reaches a service: TLS (None only with --insecure); one-line error otherwise."""
    given = [args.tls_ca, args.tls_cert, args.tls_key]
    if args.insecure:
        if any(given):
            raise ConfigurationError("--insecure with --tls-ca/--tls-cert/--tls-key: choose one")
        return None
    if args.tls_ca is None:
        raise ConfigurationError(
            "give --tls-ca (and --tls-cert/--tls-key for an operator certificate), or --insecure"
        )
    return ClientTls(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key)


async def _call(
    address: str,
    call: Callable[[Any], Awaitable[T]],
    service: str = "aggregator",
    tls: ClientTls | None = None,
) -> T:
    """Open a channel (TLS unless ``tls`` is None: the caller said --insecure), make one call, close."""
    from deniable.core.plumbing.tls import open_channel
    from deniable.v1 import deniable_pb2_grpc as pb_grpc

    channel = open_channel(address, tls, insecure=tls is None)
    try:
        stub: Any = (
            pb_grpc.AggregatorStub(channel) if service == "aggregator" else pb_grpc.ShufflerStub(channel)
        )
        return await call(stub)
    finally:
        await channel.close()


def _print_json(data: Any) -> None:
    print(render.dumps(data))


def _campaign_dict(c: pb.Campaign) -> dict[str, Any]:
    return {
        "id": c.id,
        "question": c.question,
        "kind": pb.DomainKind.Name(c.kind).lower(),
        "labels": list(c.labels),
        "mechanism": pb.Mechanism.Name(c.mechanism).lower(),
        "epsilon0": c.epsilon0,
        "local_guarantee": mechanism_has_local_guarantee(c),
        "local_epsilon": local_epsilon(c),
        "central_target_epsilon": c.target_epsilon
        or (None if mechanism_has_local_guarantee(c) else c.epsilon0),
        "delta": c.delta,
        "n_min": c.n_min,
        "batch_target": c.batch_target,
        "window_start_unix": c.window_start_unix,
        "window_end_unix": c.window_end_unix,
        "closed": c.closed,
        "key_id": c.key_id,
        "hpke_suite": c.hpke_suite,
        "ciphertext_length": c.ciphertext_length,
        "device_budget_epsilon": c.device_budget_epsilon,
        "target_epsilon": c.target_epsilon,
        "expected_n": c.expected_n,
        "params": dict(c.params),
        "signature": c.signature.hex(),
    }


def _flush_line(flushed: pb.FlushResponse) -> str:
    """What a flush did, and any campaign whose window closed with fewer than n_min held."""
    line = (
        f"forwarded {flushed.reports_forwarded} reports in {flushed.batches_forwarded} batches;"
        f" {flushed.reports_held} held"
    )
    for held in flushed.window_held:
        line += (
            f"\nwindow of {held.campaign_id} closed with {held.pending} reports, fewer than n_min"
            f" ({held.n_min}): held (release with --below-n-min --campaign {held.campaign_id})"
        )
    return line


def _print_campaign(c: pb.Campaign) -> None:
    """The descriptor in text: the question, the mechanism, and both guarantees apart."""
    print(f"{c.id}: {c.question}")
    mechanism = pb.Mechanism.Name(c.mechanism).lower()
    print(f"  mechanism: {mechanism} over {len(c.labels)} buckets ({', '.join(c.labels)})")
    print(f"  local guarantee: {guarantee_words(mechanism_has_local_guarantee(c), c.epsilon0)}")
    target = c.target_epsilon or (0.0 if mechanism_has_local_guarantee(c) else c.epsilon0)
    central = (
        f"ε ≤ {target:g}, δ = {c.delta:g} at n ≥ {c.expected_n or c.n_min}"
        if target
        else "from the smallest batch"
    )
    print(f"  central guarantee: {central}; n_min = {c.n_min} messages")
    print(f"  device budget: {c.device_budget_epsilon:g}")


def _add_mqtt_options(parser: argparse.ArgumentParser, what: str) -> None:
    """``--mqtt HOST:PORT`` and ``--mqtt-prefix`` (docs/mqtt.md)."""
    parser.add_argument("--mqtt", default=None, metavar="HOST:PORT", help=what)
    parser.add_argument(
        "--mqtt-prefix", default=mqtt.DEFAULT_PREFIX, help="MQTT topic prefix (default %(default)s)"
    )


def _mqtt_tls(ca: Path | None) -> ssl.SSLContext | None:
    """A context verifying the broker against ``ca`` (None: no CA given)."""
    if ca is None:
        return None
    try:
        return ssl.create_default_context(cafile=str(ca))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(f"cannot use {ca} as the MQTT broker's CA: {exc}") from exc


def _demo_broker(args: argparse.Namespace) -> BrokerAddress | None:
    """The demo's broker: TLS with ``--mqtt-ca``, plaintext only with ``--mqtt-insecure``."""
    if args.mqtt is None:
        return None
    if (args.mqtt_ca is None) == (not args.mqtt_insecure):
        raise ConfigurationError("with --mqtt give --mqtt-ca (TLS to the broker) or --mqtt-insecure")
    return dataclasses.replace(BrokerAddress.parse(args.mqtt), tls=_mqtt_tls(args.mqtt_ca))


def _mqtt_ingress(args: argparse.Namespace) -> MqttIngressConfig | None:
    """The shuffler's MQTT face from its options; ConfigurationError (one line) when unusable."""
    if args.mqtt is None:
        return None
    from deniable.shuffler.mqtt import MqttIngressConfig

    broker = BrokerAddress.parse(args.mqtt)
    tls = _mqtt_tls(args.mqtt_ca)
    password = secret_from_env("DENIABLE_MQTT_PASSWORD")
    broker = dataclasses.replace(broker, username=args.mqtt_username, password=password, tls=tls)
    return MqttIngressConfig(
        broker=broker, prefix=mqtt.check_prefix(args.mqtt_prefix), shared_subscription=args.mqtt_shared
    )


def _run(args: argparse.Namespace) -> int:
    from deniable.sim.render import answer_json, answer_table, manipulation_line, privacy_line

    handler = getattr(args, "handler", None)
    if handler is not None:
        return int(handler(args))
    if args.command == "demo":
        from deniable.sim.demo import run_demo

        run_demo(
            args.devices,
            args.epsilon0,
            args.json,
            args.plot,
            args.mechanism,
            args.workdir,
            progress=not args.no_progress,
            target_epsilon=args.target_epsilon,
            delta=args.delta,
            mqtt_broker=_demo_broker(args),
            mqtt_prefix=args.mqtt_prefix,
            mqtt_insecure=args.mqtt_insecure,
        )
        return 0
    if args.command == "aggregator":
        from deniable.aggregator import AggregatorConfig, serve_aggregator
        from deniable.aggregator.server import default_decrypt_workers

        asyncio.run(
            serve_aggregator(
                AggregatorConfig(
                    data_dir=args.data_dir,
                    listen=args.listen,
                    decrypt_workers=(
                        default_decrypt_workers() if args.decrypt_workers is None else args.decrypt_workers
                    ),
                    metrics_port=args.metrics_port,
                    tracer_provider=_tracer_provider("aggregator", args),
                    store=store_dsn(args.store, args.store_file),
                    key_group=args.key_group,
                    tls=server_tls(args),
                    insecure=args.insecure,
                    key_drain_s=args.key_drain_s,
                    retention_margin_s=args.retention_margin,
                    nats=args.nats,
                    nats_ack_wait_s=args.nats_ack_wait,
                    config_source=_source(args),
                )
            )
        )
        return 0
    if args.command == "shuffler" and args.action == "serve":
        from deniable.shuffler import ShufflerConfig, serve_shuffler

        asyncio.run(
            serve_shuffler(
                ShufflerConfig(
                    data_dir=args.data_dir,
                    upstream=args.upstream,
                    listen=args.listen,
                    spool_store=spool_store_dsn(args.spool_store, args.spool_store_file),
                    forward_nats=args.forward_nats,
                    metrics_port=args.metrics_port,
                    tracer_provider=_tracer_provider("shuffler", args),
                    mqtt=_mqtt_ingress(args),
                    tls=server_tls(args),
                    insecure=args.insecure,
                    operator_listen=None if args.insecure else args.operator_listen,
                    upstream_ca=args.upstream_ca,
                    quota_per_source=args.quota_per_source,
                    quota_window_s=args.quota_window,
                    config_source=_source(args),
                )
            )
        )
        return 0
    if args.command == "shuffler" and args.action == "flush":
        tls = client_tls(args)
        if args.below_n_min:
            if not args.campaign:
                raise ValueError("--below-n-min needs --campaign (it is authorised per campaign)")
            release = pb.ReleaseBelowNMinRequest(campaign_id=args.campaign)
            asyncio.run(_call(args.aggregator, lambda s: s.ReleaseBelowNMin(release, timeout=30), tls=tls))
            print(f"recorded at the aggregator: batches of {args.campaign} below n_min authorised")
        request = pb.FlushRequest(campaign_id=args.campaign, below_n_min=args.below_n_min)
        target = args.shuffler or (DEFAULT_SHUFFLER if tls is None else DEFAULT_SHUFFLER_OPERATOR)
        flushed: pb.FlushResponse = asyncio.run(
            _call(target, lambda s: s.Flush(request, timeout=300), "shuffler", tls)
        )
        print(_flush_line(flushed))
        return 0
    if args.command == "campaign" and args.action == "close":
        closing = pb.KeyCloseCampaignRequest(campaign_id=args.campaign)
        operator_tls = client_tls(args)
        closed: pb.Campaign = asyncio.run(
            _call(args.aggregator, lambda s: s.CloseCampaign(closing, timeout=30), tls=operator_tls)
        )
        print(
            f"closed {closed.id}: window ended at {closed.window_end_unix} (Unix time); description re-signed"
        )
        if args.shuffler:
            flush_one = pb.FlushRequest(campaign_id=args.campaign)
            done: pb.FlushResponse = asyncio.run(
                _call(args.shuffler, lambda s: s.Flush(flush_one, timeout=300), "shuffler", operator_tls)
            )
            print(_flush_line(done))
        return 0
    if args.command == "campaign" and args.action == "create":
        kind = pb.BINARY if args.kind == "binary" else pb.CATEGORICAL
        labels = [label.strip() for label in args.labels.split(",") if label.strip()]
        mechanism = pb.Mechanism.Value(args.mechanism.upper()) if args.mechanism else pb.MECHANISM_UNSPECIFIED
        if (args.target_epsilon is None) != (args.expected_n == 0):
            raise ValueError("--target-epsilon and --expected-n go together (or give --epsilon0 alone)")
        window_s, window_end = (0, 0) if args.window is None else parse_window(args.window, time.time())
        create = pb.CreateCampaignRequest(
            id=args.id,
            question=args.question,
            kind=kind,
            labels=labels,
            mechanism=mechanism,
            epsilon0=args.epsilon0 or 0.0,
            target_epsilon=args.target_epsilon or 0.0,
            expected_n=args.expected_n,
            delta=args.delta,
            n_min=args.n_min,
            device_budget_epsilon=args.budget,
            quota_per_source=args.quota_per_source,
            window_s=window_s,
            window_end_unix=window_end,
            batch_target=args.batch_target,
            kem=args.kem,
        )
        tls = client_tls(args)
        created: pb.Campaign = asyncio.run(
            _call(
                args.aggregator,
                lambda s: s.CreateCampaign(create, timeout=300 if args.expected_n else 30),
                tls=tls,
            )
        )
        if args.json:
            _print_json(_campaign_dict(created))
        else:
            print(
                f"created {created.id}: {len(created.labels)} buckets,"
                f" {guarantee_words(mechanism_has_local_guarantee(created), created.epsilon0)},"
                f" n_min = {created.n_min}, batch target {created.batch_target} messages,"
                f" window ends {created.window_end_unix} (Unix time), key {created.key_id}"
            )
            if created.target_epsilon:
                print(
                    f"planned: {pb.Mechanism.Name(created.mechanism).lower()},"
                    f" {guarantee_words(mechanism_has_local_guarantee(created), created.epsilon0)}"
                    f" for central ε ≤ {created.target_epsilon:g} at δ = {created.delta:g}"
                    f" in shuffles of n ≥ {created.expected_n}"
                )
        return 0
    if args.command == "campaign" and args.action == "list":
        listed: pb.ListCampaignsResponse = asyncio.run(
            _call(
                args.aggregator,
                lambda s: s.ListCampaigns(pb.ListCampaignsRequest(), timeout=30),
                tls=client_tls(args),
            )
        )
        if args.json:
            _print_json([_campaign_dict(c) for c in listed.campaigns])
        else:
            for c in listed.campaigns:
                words = guarantee_words(mechanism_has_local_guarantee(c), c.epsilon0)
                print(f"{c.id}\t{pb.Mechanism.Name(c.mechanism).lower()}\t{words}\t{c.question}")
        return 0
    if args.command == "campaign" and args.action == "show":
        shown: pb.Campaign = asyncio.run(
            _call(
                args.aggregator,
                lambda s: s.GetCampaign(pb.GetCampaignRequest(campaign_id=args.campaign), timeout=30),
                tls=client_tls(args),
            )
        )
        if args.json:
            _print_json(_campaign_dict(shown))
        else:
            _print_campaign(shown)
        return 0
    if args.command == "query":
        query = pb.QueryRequest(
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
        binary = args.action == "binary-sum"
        tls = client_tls(args)
        answer: pb.QueryResponse = asyncio.run(
            _call(
                args.aggregator,
                lambda s: (s.BinarySum if binary else s.Histogram)(query, timeout=60),
                tls=tls,
            )
        )
        if args.json:
            _print_json(answer_json(answer))
        else:
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
    if args.command == "keys":
        return _keys(args)
    raise AssertionError(f"unhandled command {args.command}")


def _source(args: argparse.Namespace) -> str:
    """Where a service's settings came from (file, environment, flags), for its start-up log."""
    source = getattr(args, "config_source", None)
    return "flags" if source is None else str(source.describe())


def _key_row(k: pb.KeyInfo) -> dict[str, Any]:
    return {
        "key_id": k.key_id,
        "public_key": k.public_key.hex(),
        "suite": k.hpke_suite,
        "kem": k.kem,
        "active": k.active,
        "state": k.state,
        "campaigns": list(k.campaigns),
    }


def _keys(args: argparse.Namespace) -> int:
    """``keys show|rotate|destroy``: the keyring as the aggregator (or its data directory) has it."""
    if args.action == "rotate":
        rotating = pb.KeyRotateRequest(kem=args.kem)
        info: pb.KeyInfo = asyncio.run(
            _call(args.aggregator, lambda s: s.RotateKey(rotating, timeout=30), tls=client_tls(args))
        )
        print(
            f"key {info.key_id} ({info.kem}) is active; earlier keys stay until their campaigns"
            " close and drain"
        )
        return 0
    if args.action == "destroy":
        destroying = pb.KeyDestroyRequest(key_id=args.key_id)
        info = asyncio.run(
            _call(args.aggregator, lambda s: s.DestroyKey(destroying, timeout=30), tls=client_tls(args))
        )
        print(f"key {info.key_id} destroyed (file overwritten and removed)")
        return 0
    if args.data_dir is not None:
        from deniable.aggregator.keys import Keyring

        keyring = Keyring.load_or_create(args.data_dir, create=False)
        listing = pb.ListKeysResponse(keys=keyring.infos(), signing_public_key=keyring.signing.public_raw)
    else:
        listing = asyncio.run(
            _call(
                args.aggregator, lambda s: s.ListKeys(pb.ListKeysRequest(), timeout=30), tls=client_tls(args)
            )
        )
    rows = [_key_row(k) for k in listing.keys]
    if args.json:
        _print_json({"signing_public_key": listing.signing_public_key.hex(), "keys": rows})
        return 0
    print(f"signing key (Ed25519, pin this in apps): {listing.signing_public_key.hex()}")
    for row in rows:
        campaigns = ",".join(row["campaigns"]) or "-"
        print(
            f"{row['key_id']}\t{row['state']}\t{row['kem']}\t{row['public_key'][:64]}\tcampaigns: {campaigns}"
        )
    return 0


# Which extra installs a module the CLI may need (the bare install is the device SDK only).
EXTRA_FOR_MODULE = {
    "numpy": "server",
    "prometheus_client": "server",
    "tqdm": "server",
    "grpc_health": "server",
    "asyncpg": "postgres",
    "aiomqtt": "mqtt",
    "paho": "mqtt",
    "matplotlib": "plot",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and run; a missing optional dependency is one line naming its extra."""
    try:
        return _main(argv)
    except ModuleNotFoundError as exc:
        extra = EXTRA_FOR_MODULE.get((exc.name or "").partition(".")[0])
        if extra is None:
            raise
        print(
            f"deniable: this command needs the [{extra}] extra ({exc.name} is not installed):"
            f" pip install 'deniable[{extra}]'",
            file=sys.stderr,
        )
        return 2


def _main(argv: Sequence[str] | None) -> int:
    """Parse arguments, run, and turn known failures into one-line errors."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from deniable.cli import config
    from deniable.core.plumbing.logs import configure_logging

    configure_logging(*config.log_settings(args))
    try:
        args.config_source = config.resolve(parser, argv, args)
        configure_logging(*config.log_settings(args))
        status = _run(args)
        sys.stdout.flush()  # a closed pipe fails here, inside the handlers below, not at exit
        return status
    except ConfigurationError as exc:
        print(f"deniable: configuration error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"deniable: {exc}", file=sys.stderr)
        return 2
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        details = exc.details() if hasattr(exc, "details") else str(exc)
        print(f"deniable: {getattr(code, 'name', 'error')}: {details}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (``deniable query ... | head -1``): stop quietly
        _silence_stdout()
        return 141


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    finally:
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
