"""``deniable console``: the operator console over ``deniable.console`` (ADR 0037), and
``deniable console hash-token``, the scrypt hash of a login token read from stdin."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from pathlib import Path

from deniable.cli.options import (
    DEFAULT_AGGREGATOR,
    Subparsers,
    add_client_tls_options,
    add_shuffler_tls_options,
    client_tls,
    shuffler_tls,
)


def register(sub: Subparsers) -> None:
    """Add ``console`` (serve) and ``console hash-token``."""
    console = sub.add_parser("console", help="web console for operators (read-only unless --allow-actions)")
    console.add_argument(
        "--aggregator", default=DEFAULT_AGGREGATOR, help="the aggregator (default %(default)s)"
    )
    console.add_argument(
        "--shuffler-operator",
        default=None,
        metavar="HOST:PORT",
        help="a shuffler's operator port (held reports)",
    )
    console.add_argument(
        "--listen", default="127.0.0.1:8080", help="HOST:PORT to serve on (default %(default)s)"
    )
    console.add_argument("--allow-actions", action="store_true", help="offer create/close/release/rotate")
    console.add_argument("--https-cert", type=Path, default=None, help="the console's own HTTPS certificate")
    console.add_argument("--https-key", type=Path, default=None, help="its private key")
    console.add_argument(
        "--login-hash-file",
        type=Path,
        default=None,
        help="file with a token's scrypt hash (console hash-token)",
    )
    add_client_tls_options(console, "the aggregator")
    add_shuffler_tls_options(console)
    console.set_defaults(handler=run)
    actions = console.add_subparsers(dest="action", required=False)
    hashing = actions.add_parser("hash-token", help="print the scrypt hash of a token read from stdin")
    hashing.set_defaults(handler=hash_token)


def run(args: argparse.Namespace) -> int:
    """Serve until Ctrl-C (refused in one line when the listen address needs TLS and a login)."""
    from deniable.console.server import ConsoleConfig, run_console

    tls = client_tls(args)
    args.shuffler = [args.shuffler_operator] if args.shuffler_operator else []  # shuffler_tls's check
    config = ConsoleConfig(
        aggregator=args.aggregator,
        operator_tls=tls,
        shuffler_operator=args.shuffler_operator,
        shuffler_tls=shuffler_tls(args, tls),
        listen=args.listen,
        allow_actions=args.allow_actions,
        https_cert=args.https_cert,
        https_key=args.https_key,
        login_hash_file=args.login_hash_file,
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_console(config))
    return 0


def hash_token(args: argparse.Namespace) -> int:
    """Read a token (first line of stdin) and print its hash for --login-hash-file."""
    from deniable.console.auth import hash_token as slow_hash

    token = sys.stdin.readline().rstrip("\n")
    if len(token) < 12:
        raise ValueError("the token must have at least 12 characters")
    print(slow_hash(token))
    return 0
