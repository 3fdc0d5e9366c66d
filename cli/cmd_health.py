"""``deniable health``: one gRPC health check over TLS, for container HEALTHCHECKs and exec probes."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from deniable.admin.health import SERVICES, check
from deniable.cli.options import Subparsers
from deniable.core.errors import ConfigurationError
from deniable.core.plumbing.tls import INSECURE, ClientTls, Transport


def register(sub: Subparsers) -> None:
    """Add ``health``."""
    health = sub.add_parser("health", help="exit 0 if a service answers SERVING to a gRPC health check")
    health.add_argument("--address", required=True, help="host:port of the service")
    health.add_argument(
        "--service",
        choices=sorted(SERVICES),
        default="server",
        help="which health entry to ask (default: the whole server)",
    )
    health.add_argument("--timeout", type=float, default=3.0, help="seconds before giving up (default 3)")
    health.add_argument(
        "--tls-ca",
        type=Path,
        default=None,
        help="the CA of the party serving there (aggregator-ca.pem, shuffler-ca.pem)",
    )
    health.add_argument("--tls-cert", type=Path, default=None, help="client certificate (mutual TLS ports)")
    health.add_argument("--tls-key", type=Path, default=None, help="its private key")
    health.add_argument("--insecure", action="store_true", help="plaintext, to a service run with --insecure")
    health.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print the status; exit 0 when SERVING, 1 otherwise (unreachable, NOT_SERVING, timeout)."""
    if args.insecure == (args.tls_ca is not None) or (args.insecure and (args.tls_cert or args.tls_key)):
        raise ConfigurationError("give --tls-ca (with --tls-cert/--tls-key for mutual TLS) or --insecure")
    tls: Transport = (
        INSECURE if args.insecure else ClientTls(ca=args.tls_ca, cert=args.tls_cert, key=args.tls_key)
    )
    status = asyncio.run(check(args.address, SERVICES[args.service], tls, args.timeout))
    print(status)
    return 0 if status == "SERVING" else 1
