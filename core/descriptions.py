"""Verifying signed campaign descriptions with a public key only (no private key, no HPKE).

The aggregator signs every description (core/crypto/signing.py); devices and, since ADR 0032,
shufflers verify them. The shuffler may not import ``deniable.core.crypto`` (it holds key files
and HPKE), so the signed bytes and the check live here, where both sides can reach them.
"""

from __future__ import annotations

from typing import Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

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
