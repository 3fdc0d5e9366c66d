"""``deniable certs dev``: a development CA and a certificate per role (docs/security.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from deniable.cli.options import Subparsers
from deniable.core.plumbing.certs import DEV_ROLES, ROLE_URI_PREFIX, write_dev_certs


def register(sub: Subparsers) -> None:
    """Add ``certs dev``."""
    certs = sub.add_parser("certs", help="TLS certificates").add_subparsers(dest="action", required=True)
    dev = certs.add_parser(
        "dev", help="write a development CA and aggregator, shuffler, operator certificates"
    )
    dev.add_argument("--out", type=Path, required=True, help="directory to write into")
    dev.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="NAME",
        help="another DNS name or IP every certificate is valid for (repeatable; localhost,"
        " 127.0.0.1 and ::1 always are)",
    )
    dev.add_argument(
        "--device", action="store_true", help="also write a device certificate (device.pem/.key)"
    )
    dev.set_defaults(handler=dev_certs)


def dev_certs(args: argparse.Namespace) -> int:
    """Write the certificates and say what each is for."""
    roles = (*DEV_ROLES, "device") if args.device else DEV_ROLES
    out = write_dev_certs(args.out, hosts=args.host, roles=roles)
    print(f"wrote {out.ca} (the CA; its private key was not kept)")
    for role in roles:
        print(f"wrote {out.cert(role)} and {out.key(role)} (0600): role {ROLE_URI_PREFIX}{role}")
    return 0
