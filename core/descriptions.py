"""Verifying signed campaign descriptions with a public key only (no private key, no HPKE).

The aggregator signs every description (core/crypto/signing.py); devices and, since ADR 0032,
shufflers verify them. The shuffler may not import ``deniable.core.crypto`` (it holds key files
and HPKE), so the signed bytes and the check live here, where both sides can reach them.
Verification goes through ``deniable.core.primitives``: cryptography or PyNaCl (ADR 0039).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from deniable.core import primitives
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


@dataclass(frozen=True)
class VerifyKey:
    """A pinned Ed25519 signing public key (32 raw bytes), verified by the active backend."""

    raw: bytes

    def __post_init__(self) -> None:
        if len(self.raw) != SIGNING_KEY_LENGTH:
            raise ValueError(
                f"an Ed25519 signing public key is {SIGNING_KEY_LENGTH} bytes, got {len(self.raw)}"
            )

    def verifies(self, signature: bytes, message: bytes) -> bool:
        """Whether ``signature`` is this key's valid Ed25519 signature of ``message``."""
        return primitives.ed25519_verify(self.raw, signature, message)


def verify_key(key: bytes | str) -> VerifyKey:
    """A pinned signing public key from raw bytes or hex; ValueError if it is not 32 bytes."""
    raw = bytes.fromhex(key.strip()) if isinstance(key, str) else bytes(key)
    return VerifyKey(raw)


def verify_campaign(campaign: pb.Campaign, key: bytes | str | VerifyKey) -> None:
    """Raise CampaignSignatureError unless ``campaign`` carries a valid signature by ``key``."""
    public = key if isinstance(key, VerifyKey) else verify_key(key)
    if not campaign.signature:
        raise CampaignSignatureError(f"campaign {campaign.id[:80]!r} is not signed")
    if len(campaign.signature) != SIGNATURE_LENGTH:
        raise CampaignSignatureError(f"campaign {campaign.id[:80]!r}: malformed signature")
    if not public.verifies(campaign.signature, canonical_campaign_bytes(campaign)):
        raise CampaignSignatureError(
            f"campaign {campaign.id[:80]!r}: signature does not verify with the pinned aggregator key"
            " (altered, or signed by another key)"
        )
