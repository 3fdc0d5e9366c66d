"""Campaign signatures: the canonical bytes (a fixed test vector, docs/security.md), coverage of
every Campaign field, the signing key file, and the hybrid KEM seal/open."""

from __future__ import annotations

import stat
import struct
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.descriptor import FieldDescriptor

from deniable.core import primitives
from deniable.core.crypto import (
    HYBRID_SUITE_NAME,
    KEM_HYBRID,
    SIGNATURE_DOMAIN,
    CampaignSignatureError,
    DecryptionError,
    KeyPair,
    SigningKey,
    canonical_campaign_bytes,
    ciphertext_length,
    open_report,
    seal_report,
    verify_campaign,
)
from deniable.v1 import deniable_pb2 as pb


def _double(value: float) -> bytes:
    return struct.pack("<d", value)


def test_canonical_bytes_match_the_documented_vector() -> None:
    """The encoding docs/security.md specifies, byte by byte, for a small campaign."""
    campaign = pb.Campaign(id="c", kind=pb.BINARY, labels=["no", "yes"], epsilon0=1.0, key_id=7)
    campaign.params["b"] = 2.0
    campaign.params["a"] = 1.0  # inserted out of order: the encoding sorts map keys
    campaign.signature = b"\x01" * 64  # never part of the signed bytes
    expected = (
        b"deniable/v1/campaign-signature\x00"
        + b"\x0a\x01c"  # 1 id
        + b"\x18\x01"  # 3 kind = BINARY
        + b"\x22\x02no\x22\x03yes"  # 4 labels, one record each, in order
        + b"\x31"
        + _double(1.0)  # 6 epsilon0, fixed64 little-endian
        + b"\x58\x07"  # 11 key_id
        + b"\xaa\x01\x0c\x0a\x01a\x11"
        + _double(1.0)  # 21 params entry "a", sorted by key
        + b"\xaa\x01\x0c\x0a\x01b\x11"
        + _double(2.0)
    )
    assert canonical_campaign_bytes(campaign) == expected
    assert SIGNATURE_DOMAIN == b"deniable/v1/campaign-signature\x00"


def _full_campaign() -> pb.Campaign:
    """A campaign with every field set to a non-default value (fields added later included)."""
    campaign = pb.Campaign()
    for field in pb.Campaign.DESCRIPTOR.fields:
        if field.name != "signature":
            _change(campaign, field)
    return campaign


def _change(campaign: pb.Campaign, field: FieldDescriptor) -> None:
    """Give ``field`` a value it did not have (for maps and lists: add an element)."""
    name = field.name
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        mapping: Any = getattr(campaign, name)
        mapping[f"k{len(mapping)}"] = 1.5
        return
    # types-protobuf 7 dropped ``label``; the protobuf 5 runtime has no ``is_repeated`` yet.
    if field.label == FieldDescriptor.LABEL_REPEATED:  # type: ignore[attr-defined]
        getattr(campaign, name).append(f"v{len(getattr(campaign, name))}")
        return
    current = getattr(campaign, name)
    kind = field.type
    if kind in (FieldDescriptor.TYPE_STRING,):
        setattr(campaign, name, current + "x")
    elif kind == FieldDescriptor.TYPE_BYTES:
        setattr(campaign, name, current + b"x")
    elif kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        setattr(campaign, name, current + 0.25)
    elif kind == FieldDescriptor.TYPE_BOOL:
        setattr(campaign, name, not current)
    elif kind == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        values = [v.number for v in field.enum_type.values]
        setattr(campaign, name, values[(values.index(current) + 1) % len(values)] or values[1])
    elif kind == FieldDescriptor.TYPE_MESSAGE:
        getattr(campaign, name).SetInParent()
    else:  # integers
        setattr(campaign, name, current + 1)


@pytest.mark.parametrize("field", [f.name for f in pb.Campaign.DESCRIPTOR.fields if f.name != "signature"])
def test_changing_any_field_breaks_the_signature(field: str) -> None:
    """Every field of Campaign but the signature is signed, including fields added by others later."""
    key = SigningKey.generate()
    signed = key.sign_campaign(_full_campaign())
    verify_campaign(signed, key.public_raw)
    altered = pb.Campaign()
    altered.CopyFrom(signed)
    _change(altered, pb.Campaign.DESCRIPTOR.fields_by_name[field])
    assert altered != signed
    with pytest.raises(CampaignSignatureError, match="does not verify"):
        verify_campaign(altered, key.public_raw)


def test_unsigned_wrong_key_and_malformed_signatures_are_refused() -> None:
    key, other = SigningKey.generate(), SigningKey.generate()
    campaign = _full_campaign()
    with pytest.raises(CampaignSignatureError, match="not signed"):
        verify_campaign(campaign, key.public_raw)
    with pytest.raises(CampaignSignatureError, match="does not verify"):
        verify_campaign(other.sign_campaign(campaign), key.public_raw)
    truncated = key.sign_campaign(campaign)
    truncated.signature = truncated.signature[:63]
    with pytest.raises(CampaignSignatureError, match="malformed"):
        verify_campaign(truncated, key.public_raw)
    verify_campaign(key.sign_campaign(campaign), key.public_raw.hex())  # hex works too


def test_signatures_are_deterministic_and_re_signing_replaces_the_old_one() -> None:
    key = SigningKey.generate()
    campaign = _full_campaign()
    first = key.sign_campaign(campaign)
    assert key.sign_campaign(first) == first  # signing a signed copy: same bytes, same signature
    first.window_end_unix += 10
    assert key.sign_campaign(first).signature != first.signature


def test_signing_key_file_is_owner_only_and_round_trips(tmp_path: Path) -> None:
    key = SigningKey.generate()
    path = tmp_path / "signing.key"
    key.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert SigningKey.load(path) == key
    path.chmod(0o640)
    with pytest.raises(PermissionError):
        SigningKey.load(path)


@pytest.mark.skipif(
    primitives.active() == primitives.PYNACL,
    reason="the hybrid suite is cryptography's; PyNaCl refuses it (tests/core/test_crypto_backends.py)",
)
def test_hybrid_kem_seals_and_opens_with_its_documented_overhead() -> None:
    pair = KeyPair.generate(3, KEM_HYBRID)
    assert len(pair.private_raw) == 96 and len(pair.public.raw) == 1216
    assert pair.kem.suite_name == HYBRID_SUITE_NAME
    sealed = seal_report(b"p" * 40, pair.public, "c1")
    assert len(sealed) == ciphertext_length(40, HYBRID_SUITE_NAME) == 40 + 1136
    assert open_report(sealed, KeyPair(3, pair.private_raw), "c1") == b"p" * 40  # from stored bytes
    with pytest.raises(DecryptionError):
        open_report(sealed, KeyPair(3, KeyPair.generate(3, KEM_HYBRID).private_raw), "c1")
    with pytest.raises(DecryptionError):
        open_report(sealed, pair, "c2")
