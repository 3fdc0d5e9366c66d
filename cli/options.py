"""Option groups and argument types shared by several commands, declared once.

Server TLS, client TLS, tracing, MQTT and store DSN options, the value checks argparse applies,
and turning those options into the library's configuration objects (``ServerTls``, ``ClientTls``…).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import ssl
from pathlib import Path
from typing import Any, TypeAlias

from deniable.core.errors import ConfigurationError
from deniable.core.plumbing import mqtt
from deniable.core.plumbing.tls import INSECURE, ClientTls, Plaintext, ServerTls, Transport

Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

DEFAULT_AGGREGATOR = "127.0.0.1:7700"
DEFAULT_SHUFFLER = "127.0.0.1:7701"
DEFAULT_SHUFFLER_OPERATOR = "127.0.0.1:7702"
DEFAULT_QUOTA = 1000


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number above 0."""
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def env_int(name: str) -> int | None:
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
    return _dsn(flag, path, "DENIABLE_STORE")


def spool_store_dsn(flag: str | None, path: Path | None) -> str | None:
    """The shuffler's spool DSN, as ``store_dsn``: --spool-store, --spool-store-file,
    $DENIABLE_SPOOL_STORE, $DENIABLE_SPOOL_STORE_FILE, in order (None: SQLite)."""
    return _dsn(flag, path, "DENIABLE_SPOOL_STORE")


def _dsn(flag: str | None, path: Path | None, env_name: str) -> str | None:
    """The flag, else the file, else the environment variable (or its ``_FILE``)."""
    if flag:
        return flag
    if path is not None:
        return read_secret(path)
    return secret_from_env(env_name)


def group(sub: Subparsers, name: str, help_text: str) -> Subparsers:
    """The subcommand group ``name`` (``campaign``, ``shuffler``…), created on first use, so that
    several command modules can add actions to one group."""
    parser = sub.choices.get(name)
    if parser is None:
        return sub.add_parser(name, help=help_text).add_subparsers(dest="action", required=True)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise AssertionError(f"no subcommands under {name}")


def add_server_tls_options(parser: argparse.ArgumentParser) -> None:
    """``--tls-cert/--tls-key/--tls-ca`` or ``--insecure`` for a service."""
    parser.add_argument("--tls-cert", type=Path, default=None, help="this service's certificate (PEM)")
    parser.add_argument("--tls-key", type=Path, default=None, help="its private key (PEM)")
    parser.add_argument(
        "--tls-ca",
        type=Path,
        default=None,
        help="bundle of the CAs whose client certificates this service accepts, one per party"
        " (`deniable certs dev`: <service>-clients-ca.pem); a role counts only from its own party's CA",
    )
    add_insecure_option(parser, "plaintext, no credentials checked: every RPC open (tests only)")


def add_insecure_option(parser: argparse.ArgumentParser, text: str) -> None:
    """``--insecure``: command line only (a file or environment setting is refused, cli/config.py)."""
    parser.add_argument("--insecure", action="store_true", help=f"{text}; command line only")


def add_client_tls_options(parser: argparse.ArgumentParser, peer: str = "the service") -> None:
    """``--tls-ca`` (+ ``--tls-cert/--tls-key``, the operator certificate) or ``--insecure``."""
    parser.add_argument(
        "--tls-ca",
        type=Path,
        default=None,
        help=f"the CA of the party you reach, and only it ({peer}'s: <party>-ca.pem), so that"
        " only that party's serving certificate is accepted",
    )
    parser.add_argument(
        "--tls-cert",
        type=Path,
        default=None,
        help="client (operator) certificate (PEM) of the role the RPC needs",
    )
    parser.add_argument("--tls-key", type=Path, default=None, help="its private key (PEM)")
    add_insecure_option(parser, "plaintext, to a service run with --insecure")


def add_shuffler_tls_options(parser: argparse.ArgumentParser) -> None:
    """``--shuffler-tls-ca/-cert/-key``: how a command that talks to the aggregator also reaches
    shufflers' operator ports (the shuffler party's CA and a ``shuffler-operator`` certificate)."""
    parser.add_argument(
        "--shuffler-tls-ca", type=Path, default=None, help="with --shuffler: the shuffler party's CA"
    )
    parser.add_argument(
        "--shuffler-tls-cert",
        type=Path,
        default=None,
        help="with --shuffler: shuffler-operator certificate",
    )
    parser.add_argument("--shuffler-tls-key", type=Path, default=None, help="its private key")


def shuffler_tls(args: argparse.Namespace, tls: Transport) -> Transport:
    """How to reach the shufflers of ``--shuffler``: plaintext if ``tls`` is, else the shuffler options."""
    given = [args.shuffler_tls_ca, args.shuffler_tls_cert, args.shuffler_tls_key]
    if isinstance(tls, Plaintext):
        if any(given):
            raise ConfigurationError("--insecure with --shuffler-tls-ca/-cert/-key: choose one")
        return tls
    if not args.shuffler:
        return tls
    if args.shuffler_tls_ca is None or args.shuffler_tls_cert is None:
        raise ConfigurationError(
            "--shuffler needs --shuffler-tls-ca, --shuffler-tls-cert and --shuffler-tls-key: the"
            " shuffler party's CA and a shuffler-operator certificate (the aggregator's operator"
            " certificate is not accepted there)"
        )
    return ClientTls(ca=args.shuffler_tls_ca, cert=args.shuffler_tls_cert, key=args.shuffler_tls_key)


def add_tracing_options(serve: argparse.ArgumentParser) -> None:
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


def add_mqtt_options(parser: argparse.ArgumentParser, what: str) -> None:
    """``--mqtt HOST:PORT``, ``--mqtt-ca``, ``--mqtt-insecure`` and ``--mqtt-prefix`` (docs/mqtt.md)."""
    parser.add_argument("--mqtt", default=None, metavar="HOST:PORT", help=what)
    parser.add_argument(
        "--mqtt-prefix", default=mqtt.DEFAULT_PREFIX, help="MQTT topic prefix (default %(default)s)"
    )
    parser.add_argument("--mqtt-ca", type=Path, default=None, help="TLS to the broker, trusting this CA file")
    parser.add_argument(
        "--mqtt-insecure",
        action="store_true",
        help="plaintext MQTT (tests only; command line only): --mqtt needs this or --mqtt-ca",
    )


def mqtt_broker(args: argparse.Namespace) -> mqtt.BrokerAddress:
    """The broker of ``--mqtt``: TLS with ``--mqtt-ca``, plaintext only with ``--mqtt-insecure``."""
    if (args.mqtt_ca is None) == (not args.mqtt_insecure):
        raise ConfigurationError(
            "with --mqtt give --mqtt-ca (TLS to the broker) or --mqtt-insecure (plaintext, by name)"
        )
    return dataclasses.replace(mqtt.BrokerAddress.parse(args.mqtt), tls=mqtt_tls(args.mqtt_ca))


def add_shuffler_list_option(parser: argparse.ArgumentParser, text: str) -> None:
    """``--shuffler HOST:PORT``, repeatable: the shufflers' operator ports a command consults."""
    parser.add_argument("--shuffler", action="append", default=[], metavar="HOST:PORT", help=text)


def tracer_provider(service: str, args: argparse.Namespace) -> Any:
    """The service's TracerProvider if tracing was asked for, else None (OpenTelemetry stays unimported)."""
    if args.otel_endpoint is None and not args.otel_console:
        return None
    from deniable.core.plumbing.tracing import tracer_provider as build

    return build(service, args.otel_endpoint, args.otel_console)


def server_tls(args: argparse.Namespace) -> ServerTls | None:
    """The service's TLS files from its options; one-line ConfigurationError if incomplete."""
    if _plaintext(args, "--tls-cert/--tls-key/--tls-ca", [args.tls_cert, args.tls_key, args.tls_ca]):
        return None
    if not all([args.tls_cert, args.tls_key, args.tls_ca]):
        raise ConfigurationError(
            "TLS needs --tls-cert, --tls-key and --tls-ca (make them with `deniable certs dev`),"
            " or --insecure for plaintext (tests only)"
        )
    return ServerTls(cert=args.tls_cert, key=args.tls_key, ca=args.tls_ca)


def client_tls(args: argparse.Namespace) -> Transport:
    """How this command reaches a service: TLS, or ``INSECURE`` with --insecure; one-line error otherwise."""
    if _plaintext(args, "--tls-ca/--tls-cert/--tls-key", [args.tls_ca, args.tls_cert, args.tls_key]):
        return INSECURE
    if args.tls_ca is None:
        raise ConfigurationError(
            "give --tls-ca, the CA of the party you reach (and --tls-cert/--tls-key for an operator"
            " certificate), or --insecure"
        )
    return ClientTls(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key)


def _plaintext(args: argparse.Namespace, flags: str, given: list[Path | None]) -> bool:
    """True with --insecure (ConfigurationError if TLS files were given too), else False."""
    if args.insecure and any(given):
        raise ConfigurationError(f"--insecure with {flags}: choose one")
    return bool(args.insecure)


def shuffler_operator_address(given: str | None, tls: Transport) -> str:
    """The shuffler to ask: ``given``, else its operator port (its device port with --insecure)."""
    return given or (DEFAULT_SHUFFLER if isinstance(tls, Plaintext) else DEFAULT_SHUFFLER_OPERATOR)


def mqtt_tls(ca: Path | None) -> ssl.SSLContext | None:
    """A context verifying the broker against ``ca`` (None: no CA given)."""
    if ca is None:
        return None
    try:
        return ssl.create_default_context(cafile=str(ca))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(f"cannot use {ca} as the MQTT broker's CA: {exc}") from exc


def config_source(args: argparse.Namespace) -> str:
    """Where a service's settings came from (file, environment, flags), for its start-up log."""
    source = getattr(args, "config_source", None)
    return "flags" if source is None else str(source.describe())
