"""Campaign signatures: the aggregator's Ed25519 key signs every campaign description it serves.

Devices verify the signature with the key their app pins, so neither the shuffler that relays
descriptions nor anyone who can write to an MQTT broker can swap the HPKE key or weaken the
parameters. The signed bytes are specified in docs/security.md ("Campaign signatures").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from deniable.core.crypto.keyfile import check_private_file, write_private_file
from deniable.core.descriptions import (  # the public half lives where shufflers reach it
    SIGNATURE_DOMAIN,
    SIGNATURE_LENGTH,
    SIGNING_KEY_LENGTH,
    CampaignSignatureError,
    canonical_campaign_bytes,
    verify_campaign,
    verify_key,
)
from deniable.v1 import deniable_pb2 as pb

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

SIGNING_NEEDS = "signing campaigns needs cryptography: pip install 'deniable[server]'"


def _ed25519() -> type[Ed25519PrivateKey]:
    """cryptography's Ed25519 private key class; a hint naming the extra if it is not installed."""
    try:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(SIGNING_NEEDS, name="cryptography") from exc
    return Ed25519PrivateKey


__all__ = [
    "SIGNATURE_DOMAIN",
    "SIGNATURE_LENGTH",
    "SIGNING_KEY_LENGTH",
    "CampaignSignatureError",
    "SigningKey",
    "canonical_campaign_bytes",
    "verify_campaign",
    "verify_key",
]


@dataclass(frozen=True)
class SigningKey:
    """The aggregator's Ed25519 signing key (raw 32-byte private key), separate from HPKE keys.

    Signing is the aggregator's (and tests'): it uses cryptography, which the bare SDK lacks.
    """

    private_raw: bytes

    def __post_init__(self) -> None:
        if len(self.private_raw) != SIGNING_KEY_LENGTH:
            raise ValueError(f"an Ed25519 private key is {SIGNING_KEY_LENGTH} bytes")

    @classmethod
    def generate(cls) -> SigningKey:
        """A fresh signing key from the OS random source."""
        return cls(_ed25519().generate().private_bytes_raw())

    def _key(self) -> Ed25519PrivateKey:
        return _ed25519().from_private_bytes(self.private_raw)

    @property
    def public_raw(self) -> bytes:
        """The 32-byte public key apps pin."""
        return self._key().public_key().public_bytes_raw()

    def sign_campaign(self, campaign: pb.Campaign) -> pb.Campaign:
        """A copy of ``campaign`` carrying this key's signature over its canonical bytes."""
        signed = pb.Campaign()
        signed.CopyFrom(campaign)
        signed.signature = self._key().sign(canonical_campaign_bytes(campaign))
        return signed

    def save(self, path: Path) -> None:
        """Write the private key readable by its owner only (mode 0600)."""
        write_private_file(path, self.private_raw)

    @classmethod
    def load(cls, path: Path, trusted_group: int | None = None) -> SigningKey:
        """Read the private key, refusing a file that others can read or write (core/crypto/keyfile.py)."""
        check_private_file(path, "signing key", trusted_group)
        raw = path.read_bytes()
        if len(raw) != SIGNING_KEY_LENGTH:
            raise ValueError(f"signing key {path} is not a {SIGNING_KEY_LENGTH}-byte Ed25519 key")
        return cls(raw)
