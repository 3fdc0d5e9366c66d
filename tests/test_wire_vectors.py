"""The golden vectors of docs/wire.md (tests/vectors, from scripts/make_vectors.py), both ways:
our encoders reproduce every byte from the recorded inputs and randomness, our decoders accept
every valid vector and refuse every invalid one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deniable.client.reporter import validate_campaign
from deniable.core import mechanisms
from deniable.core.campaigns import randomiser_for
from deniable.core.crypto import KeyPair, envelope_info, open_report
from deniable.core.crypto.envelope import DecryptionError
from deniable.core.rng import Csprng
from deniable.core.wire import MalformedPlaintext, Plaintext, decode, encode
from deniable.v1 import deniable_pb2 as pb

VECTORS = Path(__file__).with_name("vectors")


def load(name: str) -> Any:
    return json.loads((VECTORS / name).read_text())


class StreamRng(Csprng):
    """Serves exactly the recorded randomness, then refuses: a vector must use all of it."""

    def __init__(self, data: bytes) -> None:
        super().__init__(key=bytes(32))
        self.data, self.used = data, 0

    def bytes(self, count: int) -> bytes:
        if self.used + count > len(self.data):
            raise AssertionError("the randomiser read more randomness than the vector recorded")
        out = self.data[self.used : self.used + count]
        self.used += count
        return out


MECHANISM_VECTORS = load("mechanisms.json")


@pytest.mark.parametrize("vector", MECHANISM_VECTORS, ids=lambda v: f"{v['mechanism']}-{v['domain_size']}")
def test_mechanism_vectors(vector: dict[str, Any]) -> None:
    """Same thresholds; each recorded randomness gives the recorded payload and is used up; the
    aggregator's tally accepts every payload as in-domain."""
    randomiser = mechanisms.create(
        vector["mechanism"],
        epsilon0=vector["epsilon0"],
        domain_size=vector["domain_size"],
        **vector["params"],
    )
    assert int(randomiser.proto) == vector["proto"]
    assert randomiser.payload_length == vector["payload_length"]
    for name, value in vector["thresholds"].items():
        held = getattr(randomiser, name, None)
        assert int(held if held is not None else getattr(randomiser, "_" + name)) == value, name
    for case in vector["cases"]:
        rng = StreamRng(bytes.fromhex(case["randomness"]))
        assert randomiser.randomise(case["value"], rng).hex() == case["payload"]
        assert rng.used == len(rng.data)
    tally = randomiser.tally([bytes.fromhex(c["payload"]) for c in vector["cases"]])
    assert not tally.invalid.any()


def test_every_local_randomiser_has_vectors() -> None:
    """Every single-message mechanism a device may run without numpy is covered."""
    local = {"binary_rr", "grr", "sue", "oue", "subset_selection", "hadamard_response", "olh"}
    assert {v["mechanism"] for v in MECHANISM_VECTORS} == local


def test_plaintext_vectors() -> None:
    for group in load("plaintext.json"):
        for case in group["valid"]:
            plain = Plaintext(
                bytes.fromhex(case["report_id"]),
                case["campaign_id"],
                case["key_id"],
                bytes.fromhex(case["payload"]),
            )
            data = bytes.fromhex(case["plaintext"])
            assert encode(plain, case["plaintext_length"]) == data
            assert decode(data, case["plaintext_length"]) == plain
        for case in group["invalid"]:
            with pytest.raises(MalformedPlaintext):
                decode(bytes.fromhex(case["plaintext"]), group["plaintext_length"])


def test_envelope_vectors_open_and_bind_their_context() -> None:
    """HPKE in the decryption direction (our library draws the ephemeral key itself): the info
    bytes match, each ciphertext opens to its plaintext, and not under another campaign id nor
    another incarnation of its own id (a replay into a recreated campaign does not open)."""
    vector = load("envelope.json")
    key_pair = KeyPair(key_id=3, private_raw=bytes.fromhex(vector["recipient_private_key"]))
    assert key_pair.public.raw.hex() == vector["recipient_public_key"]
    assert any(case["incarnation"] for case in vector["sealed"])
    for case in vector["sealed"]:
        incarnation = bytes.fromhex(case["incarnation"])
        assert envelope_info(case["campaign_id"], case["key_id"], incarnation).hex() == case["info"]
        ciphertext = bytes.fromhex(case["ciphertext"])
        assert ciphertext[:32].hex() == case["enc"]
        assert open_report(ciphertext, key_pair, case["campaign_id"], incarnation).hex() == case["plaintext"]
        with pytest.raises(DecryptionError):
            open_report(ciphertext, key_pair, case["campaign_id"] + "x", incarnation)
        with pytest.raises(DecryptionError):
            open_report(ciphertext, key_pair, case["campaign_id"], incarnation[::-1] or bytes(16))


def test_report_vector_end_to_end() -> None:
    """The campaign description parses and validates; the recorded randomness, report id and
    key give exactly the recorded payload, plaintext and info; the ciphertext opens to it."""
    vector = load("report.json")
    campaign = pb.Campaign.FromString(bytes.fromhex(vector["campaign"]))
    validate_campaign(campaign)
    rng = StreamRng(bytes.fromhex(vector["randomness"]))
    payload = randomiser_for(campaign).randomise(vector["value"], rng)
    assert payload.hex() == vector["payload"]
    plain = Plaintext(bytes.fromhex(vector["report_id"]), campaign.id, campaign.key_id, payload)
    assert encode(plain, campaign.plaintext_length).hex() == vector["plaintext"]
    assert campaign.incarnation
    assert envelope_info(campaign.id, campaign.key_id, campaign.incarnation).hex() == vector["info"]
    key_pair = KeyPair(key_id=campaign.key_id, private_raw=bytes.fromhex(vector["recipient_private_key"]))
    assert key_pair.public.raw == campaign.public_key
    ciphertext = bytes.fromhex(vector["ciphertext"])
    assert len(ciphertext) == campaign.ciphertext_length
    assert open_report(ciphertext, key_pair, campaign.id, campaign.incarnation).hex() == vector["plaintext"]
