"""The aggregator's keyring: list (remotely or from its data directory), rotate, destroy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from deniable.admin.rpc import call
from deniable.core.plumbing.tls import Transport
from deniable.v1 import deniable_pb2 as pb


async def list_keys(aggregator: str, tls: Transport) -> pb.ListKeysResponse:
    """The HPKE keys and the signing public key, as the running aggregator has them."""
    return await call(aggregator, lambda s: s.ListKeys(pb.ListKeysRequest(), timeout=30), tls=tls)


def read_keys(data_dir: Path) -> pb.ListKeysResponse:
    """The same listing read from an aggregator's data directory (no service needed)."""
    from deniable.aggregator.keys import Keyring

    keyring = Keyring.load_or_create(data_dir, create=False)
    return pb.ListKeysResponse(keys=keyring.infos(), signing_public_key=keyring.signing.public_raw)


async def rotate_key(aggregator: str, kem: str, tls: Transport) -> pb.KeyInfo:
    """A new active HPKE key; earlier keys stay until their campaigns close and drain."""
    request = pb.KeyRotateRequest(kem=kem)
    return await call(aggregator, lambda s: s.RotateKey(request, timeout=30), tls=tls)


async def destroy_key(aggregator: str, key_id: int, tls: Transport) -> pb.KeyInfo:
    """Overwrite and remove a retired key now."""
    request = pb.KeyDestroyRequest(key_id=key_id)
    return await call(aggregator, lambda s: s.DestroyKey(request, timeout=30), tls=tls)


def key_row(k: pb.KeyInfo) -> dict[str, Any]:
    """One key as JSON-ready data."""
    return {
        "key_id": k.key_id,
        "public_key": k.public_key.hex(),
        "suite": k.hpke_suite,
        "kem": k.kem,
        "active": k.active,
        "state": k.state,
        "campaigns": list(k.campaigns),
    }
