"""``deniable keys show|rotate|destroy``: the aggregator's keyring."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from deniable.admin.keys import destroy_key, key_row, list_keys, read_keys, rotate_key
from deniable.cli.options import (
    DEFAULT_AGGREGATOR,
    Subparsers,
    add_client_tls_options,
    client_tls,
    group,
    positive_int,
)
from deniable.cli.output import print_json


def register(sub: Subparsers) -> None:
    """Add ``keys show``, ``keys rotate`` and ``keys destroy``."""
    keys = group(sub, "keys", "aggregator keys")
    show = keys.add_parser("show", help="show public keys and ids")
    show.add_argument("--aggregator", default=DEFAULT_AGGREGATOR)
    show.add_argument("--data-dir", type=Path, default=None, help="read the keyring on disk instead")
    show.add_argument("--json", action="store_true")
    add_client_tls_options(show)
    show.set_defaults(handler=run_show)
    rotate = keys.add_parser("rotate", help="new active HPKE key; the old one is kept until drained")
    rotate.add_argument("--aggregator", default=DEFAULT_AGGREGATOR)
    rotate.add_argument("--kem", choices=["x25519", "x25519-mlkem768"], default="x25519")
    add_client_tls_options(rotate)
    rotate.set_defaults(handler=run_rotate)
    destroy = keys.add_parser("destroy", help="overwrite and remove a retired key now (after draining)")
    destroy.add_argument("key_id", type=positive_int)
    destroy.add_argument("--aggregator", default=DEFAULT_AGGREGATOR)
    add_client_tls_options(destroy)
    destroy.set_defaults(handler=run_destroy)


def run_show(args: argparse.Namespace) -> int:
    """The keyring as the aggregator (or, with --data-dir, its data directory) has it."""
    if args.data_dir is not None:
        listing = read_keys(args.data_dir)
    else:
        listing = asyncio.run(list_keys(args.aggregator, client_tls(args)))
    rows = [key_row(k) for k in listing.keys]
    if args.json:
        print_json({"signing_public_key": listing.signing_public_key.hex(), "keys": rows})
        return 0
    print(f"signing key (Ed25519, pin this in apps): {listing.signing_public_key.hex()}")
    for row in rows:
        campaigns = ",".join(row["campaigns"]) or "-"
        print(
            f"{row['key_id']}\t{row['state']}\t{row['kem']}\t{row['public_key'][:64]}\tcampaigns: {campaigns}"
        )
    return 0


def run_rotate(args: argparse.Namespace) -> int:
    """Make a new active key."""
    info = asyncio.run(rotate_key(args.aggregator, args.kem, client_tls(args)))
    print(
        f"key {info.key_id} ({info.kem}) is active; earlier keys stay until their campaigns close and drain"
    )
    return 0


def run_destroy(args: argparse.Namespace) -> int:
    """Destroy a retired key now."""
    info = asyncio.run(destroy_key(args.aggregator, args.key_id, client_tls(args)))
    print(f"key {info.key_id} destroyed (file overwritten and removed)")
    return 0
