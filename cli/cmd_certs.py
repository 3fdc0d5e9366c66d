"""``deniable certs dev``: one development CA per party and a certificate per role (docs/security.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from deniable.cli.options import Subparsers
from deniable.core.plumbing.certs import CLIENT_CAS, DEV_ROLES, MQTT_BROKER, ROLE_URI_PREFIX, write_dev_certs
from deniable.core.plumbing.tls import PARTY_OF

HOLDERS = {
    "aggregator": "the aggregator service (serves; a client only of its own health port and NATS)",
    "aggregator-operator": "the aggregator's operators (client auth only); never the shuffler's party",
    "shuffler": "the shuffler service (serves devices; client of the aggregator)",
    "shuffler-operator": "the shuffler's operators and its preStop drain (client auth only)",
    "device": "a device (client auth only)",
}


def register(sub: Subparsers) -> None:
    """Add ``certs dev``."""
    certs = sub.add_parser("certs", help="TLS certificates").add_subparsers(dest="action", required=True)
    dev = certs.add_parser(
        "dev",
        help="write a CA per party (shuffler, aggregator) and a certificate per role",
        description="One CA per party: clients trust only the CA of the party they reach, and a"
        " service accepts a role only from its own party's CA (ADR 0030, docs/security.md).",
    )
    dev.add_argument("--out", type=Path, required=True, help="directory to write into")
    for service in ("shuffler", "aggregator"):
        dev.add_argument(
            f"--{service}-host",
            action="append",
            default=[],
            metavar="NAME",
            help=f"another DNS name or IP the {service} certificate is valid for (repeatable;"
            " localhost, 127.0.0.1 and ::1 always are)",
        )
    dev.add_argument(
        "--mqtt-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also write mqtt-broker.pem/.key, the MQTT broker's server certificate from the"
        " shuffler's CA, valid for NAME (repeatable)",
    )
    dev.add_argument(
        "--device",
        action="store_true",
        help="also write a device CA and certificate (device-ca.pem, device.pem/.key)",
    )
    dev.set_defaults(handler=dev_certs)


def dev_certs(args: argparse.Namespace) -> int:
    """Write the certificates and say who holds each."""
    roles = (*DEV_ROLES, "device") if args.device else DEV_ROLES
    hosts = {"shuffler": args.shuffler_host, "aggregator": args.aggregator_host}
    out = write_dev_certs(args.out, hosts=hosts, roles=roles, mqtt_hosts=args.mqtt_host)
    for party in sorted({PARTY_OF[role] for role in roles}):
        print(f"wrote {out.ca(party)} (the {party} party's CA; its private key was not kept)")
    for service, parties in CLIENT_CAS.items():
        print(f"wrote {out.clients_ca(service)} (the {service}'s --tls-ca: CAs of {', '.join(parties)})")
    for role in roles:
        print(
            f"wrote {out.cert(role)} and {out.key(role)} (0600): role {ROLE_URI_PREFIX}{role},"
            f" for {HOLDERS[role]}"
        )
    if args.mqtt_host:
        print(
            f"wrote {out.cert(MQTT_BROKER)} and {out.key(MQTT_BROKER)} (0600): the MQTT broker's TLS listener"
        )
    return 0
