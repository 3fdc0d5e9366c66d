"""Campaign signatures: the aggregator's Ed25519 key signs every campaign description it serves.

Devices verify the signature with the key their app pins, so neither the shuffler that relays
descriptions nor anyone who can write to an MQTT broker can swap the HPKE key or weaken the
parameters. The signed bytes are specified in docs/security.md ("Campaign signatures").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from deniable.core.crypto.keyfile import check_private_file, write_private_file
from deniable.v1 import deniable_pb2 as pb

SIGNATURE_DOMAIN: Final = b"deniable/v1/campaign-signature\x00"
SIGNATURE_LENGTH: Final = 64
SIGNING_KEY_LENGTH: Final = 32


class CampaignSignatureError(Exception):
    """A campaign description is unsigned, altered, or signed by a key other than the pinned one."""


def canonical_campaign_bytes(campaign: pb.Campaign) -> bytes:
    """The signed bytes: the domain string, then the deterministic protobuf encoding of every field
    except ``signature`` (fields added to Campaign later are covered without any change here)."""
    unsigned = pb.Campaign()
    unsigned.CopyFrom(campaign)
    unsigned.ClearField("signature")
    return SIGNATURE_DOMAIN + unsigned.SerializeToString(deterministic=True)


def verify_key(key: bytes | str) -> Ed25519PublicKey:
    """A pinned signing public key from raw bytes or hex; ValueError if it is not 32 bytes."""
    raw = bytes.fromhex(key.strip()) if isinstance(key, str) else bytes(key)
    if len(raw) != SIGNING_KEY_LENGTH:
        raise ValueError(f"an Ed25519 signing public key is {SIGNING_KEY_LENGTH} bytes, got {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def verify_campaign(campaign: pb.Campaign, key: bytes | str | Ed25519PublicKey) -> None:
    """Raise CampaignSignatureError unless ``campaign`` carries a valid signature by ``key``."""
    public = key if isinstance(key, Ed25519PublicKey) else verify_key(key)
    if not campaign.signature:
        raise CampaignSignatureError(f"campaign {campaign.id[:80]!r} is not signed")
    if len(campaign.signature) != SIGNATURE_LENGTH:
        raise CampaignSignatureError(f"campaign {campaign.id[:80]!r}: malformed signature")
    try:
        public.verify(campaign.signature, canonical_campaign_bytes(campaign))
    except InvalidSignature:
        raise CampaignSignatureError(
            f"campaign {campaign.id[:80]!r}: signature does not verify with the pinned aggregator key"
            " (altered, or signed by another key)"
        ) from None


@dataclass(frozen=True)
class SigningKey:
    """The aggregator's Ed25519 signing key (raw 32-byte private key), separate from HPKE keys."""

    private_raw: bytes

    def __post_init__(self) -> None:
        if len(self.private_raw) != SIGNING_KEY_LENGTH:
            raise ValueError(f"an Ed25519 private key is {SIGNING_KEY_LENGTH} bytes")

    @classmethod
    def generate(cls) -> SigningKey:
        """A fresh signing key from the OS random source."""
        return cls(Ed25519PrivateKey.generate().private_bytes_raw())

    def _key(self) -> Ed25519PrivateKey:
        return Ed25519PrivateKey.from_private_bytes(self.private_raw)

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
