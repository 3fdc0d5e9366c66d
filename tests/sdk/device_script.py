"""A device as an app embeds the SDK: fetch a campaign, record one answer, send it (no event loop).

Run as ``python device_script.py SHUFFLER CAMPAIGN OUTBOX VALUE CA KEY [--block] [--https]``;
``--block`` makes every server-side package unimportable first, as in a bare ``pip install
deniable``; ``--https``: SHUFFLER is the HTTPS endpoint's URL and the device uses HttpTransport
(then grpc and cryptography are blocked too: the bare SDK seals and verifies on PyNaCl, ADR 0039).
Prints one JSON line.
"""

from __future__ import annotations

import importlib.abc
import json
import sys
from pathlib import Path

SERVER_ONLY = (
    "numpy",
    "scipy",
    "matplotlib",
    "asyncpg",
    "prometheus_client",
    "aiomqtt",
    "tqdm",
    "grpc_health",
)
HTTP_SERVER = ("aiohttp", "hypercorn", "h2", "h11")
"""The HTTP stacks of the services (the shuffler's HTTPS face, the load generator): never on a device."""


class _Block(importlib.abc.MetaPathFinder):
    """Refuses the server-only packages (and grpc when ``grpc_too``), as if they were not installed."""

    def __init__(self, grpc_too: bool) -> None:
        self.blocked = (*SERVER_ONLY, *HTTP_SERVER, "grpc", "cryptography") if grpc_too else SERVER_ONLY

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.partition(".")[0] in self.blocked:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)


def main() -> None:
    """Send one report and say what was acknowledged and which server packages got imported."""
    address, campaign_id, outbox_path, value, ca, signing_key = sys.argv[1:7]
    https = "--https" in sys.argv[7:]
    if "--block" in sys.argv[7:]:
        sys.meta_path.insert(0, _Block(https))
    from deniable.client import ClientTls, HttpTransport, Outbox, SyncReporter, Transport

    outbox = Outbox(outbox_path)
    tls = ClientTls(ca=Path(ca))
    transport: Transport
    if https:
        transport = HttpTransport(address, tls=tls)
    else:
        from deniable.client import GrpcTransport

        transport = GrpcTransport(address, tls=tls)
    with SyncReporter.fetch(
        campaign_id, transport, outbox, aggregator_key=signing_key, give_up_after_s=30
    ) as reporter:
        reporter.record(int(value))
        result = reporter.send_pending()
    outbox.close()
    watched = (*SERVER_ONLY, *HTTP_SERVER, "grpc", "cryptography") if https else (*SERVER_ONLY, *HTTP_SERVER)
    loaded = sorted(m for m in watched if m in sys.modules)
    print(json.dumps({"acknowledged": result.acknowledged, "pending": result.pending, "loaded": loaded}))


if __name__ == "__main__":
    main()
