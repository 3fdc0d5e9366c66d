"""The golden vectors of docs/wire.md (tests/vectors, from scripts/make_vectors.py), both ways:
our encoders reproduce every byte from the recorded inputs and randomness, our decoders accept
every valid vector and refuse every invalid one."""

from __future__ import annotations

import importlib.util
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
ROOT = Path(__file__).resolve().parents[1]


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


def _rebuilt(vector: dict[str, Any]) -> mechanisms.LocalRandomiser:
    """The vector's randomiser from its recorded parameters, with its protocol and payload length
    checked against the recorded ones."""
    randomiser = mechanisms.create(
        vector["mechanism"],
        epsilon0=vector["epsilon0"],
        domain_size=vector["domain_size"],
        **vector["params"],
    )
    assert int(randomiser.proto) == vector["proto"]
    assert randomiser.payload_length == vector["payload_length"]
    return randomiser


@pytest.mark.parametrize("vector", MECHANISM_VECTORS, ids=lambda v: f"{v['mechanism']}-{v['domain_size']}")
def test_mechanism_vectors(vector: dict[str, Any]) -> None:
    """Same thresholds; each recorded randomness gives the recorded payload and is used up; the
    aggregator's tally accepts every payload as in-domain."""
    randomiser = _rebuilt(vector)
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


# ----------------------------------------------------------------------- shuffle-only protocols (§6.8)

MULTI_VECTORS = load("multi_message.json")


def _make_vectors() -> Any:
    """scripts/make_vectors.py as a module (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("make_vectors", ROOT / "scripts" / "make_vectors.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "vector", MULTI_VECTORS["protocols"], ids=lambda v: f"{v['mechanism']}-{v['domain_size']}"
)
def test_shuffle_only_vectors(vector: dict[str, Any]) -> None:
    """Rebuilt from the campaign params alone (as a device and the aggregator do): the same
    derived integers; each recorded randomness gives exactly the recorded messages and is used
    up; the aggregator's tally accepts every message and refuses every invalid one."""
    randomiser = _rebuilt(vector)
    assert randomiser.parameters() == vector["params"]  # the params are a fixed point of the rebuild
    assert _make_vectors().derived_integers(randomiser) == vector["derived"]
    messages: list[bytes] = []
    for case in vector["cases"]:
        rng = StreamRng(bytes.fromhex(case["randomness"]))
        output = randomiser.randomise(case["value"], rng)
        assert [m.hex() for m in randomiser.split_messages(output)] == case["messages"]
        assert rng.used == len(rng.data)
        messages += [bytes.fromhex(m) for m in case["messages"]]
    assert not randomiser.tally(messages).invalid.any()
    refused = randomiser.tally([bytes.fromhex(case["message"]) for case in vector["invalid"]])
    assert refused.invalid.all()
    assert randomiser.tally([bytes.fromhex(vector["invalid"][0]["message"])[:-1]]).invalid.all()


def test_every_shuffle_only_protocol_has_vectors() -> None:
    """Every registered mechanism has golden vectors: local randomisers in mechanisms.json, the
    shuffle-only protocols (every multi-message one among them) in multi_message.json."""
    shuffle_only = {v["mechanism"] for v in MULTI_VECTORS["protocols"]}
    local = {v["mechanism"] for v in MECHANISM_VECTORS}
    assert shuffle_only | local == set(mechanisms.names())
    multi = {name for name in mechanisms.names() if mechanisms.mechanism_class(name).multi_message}
    assert multi and multi <= shuffle_only


def test_multi_message_report_end_to_end() -> None:
    """A whole flooded_histogram answer: the campaign validates; the recorded randomness gives the
    messages; each is a plaintext with its own report id, and its ciphertext opens to it."""
    vector = MULTI_VECTORS["report"]
    campaign = pb.Campaign.FromString(bytes.fromhex(vector["campaign"]))
    validate_campaign(campaign)
    randomiser = randomiser_for(campaign)
    assert randomiser.multi_message
    rng = StreamRng(bytes.fromhex(vector["randomness"]))
    messages = randomiser.split_messages(randomiser.randomise(vector["value"], rng))
    assert rng.used == len(rng.data)
    assert [m.hex() for m in messages] == [case["payload"] for case in vector["messages"]]
    assert envelope_info(campaign.id, campaign.key_id, campaign.incarnation).hex() == vector["info"]
    described = (campaign.id, campaign.key_id, campaign.incarnation.hex())
    assert described == (vector["campaign_id"], vector["key_id"], vector["incarnation"])
    key_pair = KeyPair(key_id=campaign.key_id, private_raw=bytes.fromhex(vector["recipient_private_key"]))
    assert len({case["report_id"] for case in vector["messages"]}) == len(messages)
    for message, case in zip(messages, vector["messages"], strict=True):
        plain = Plaintext(bytes.fromhex(case["report_id"]), campaign.id, campaign.key_id, message)
        assert encode(plain, campaign.plaintext_length).hex() == case["plaintext"]
        ciphertext = bytes.fromhex(case["ciphertext"])
        assert len(ciphertext) == campaign.ciphertext_length
        assert open_report(ciphertext, key_pair, campaign.id, campaign.incarnation).hex() == case["plaintext"]


def test_committed_vectors_are_what_the_script_makes() -> None:
    """mechanisms.json, plaintext.json and multi_message.json are byte for byte what
    ``python scripts/make_vectors.py`` writes now: a change to a randomiser's draws or encoding
    fails here until the vectors are regenerated (and docs/wire.md checked against them)."""
    assert _make_vectors().stale_files(VECTORS) == []


def test_the_staleness_check_can_fail(tmp_path: Path) -> None:
    """A vector file with one message changed is reported stale (the check above can fail)."""
    for name in ("mechanisms.json", "plaintext.json", "multi_message.json"):
        (tmp_path / name).write_text((VECTORS / name).read_text())
    edited = load("multi_message.json")
    edited["protocols"][0]["cases"][0]["messages"][0] = "ff"
    (tmp_path / "multi_message.json").write_text(json.dumps(edited, indent=1) + "\n")
    assert _make_vectors().stale_files(tmp_path) == ["multi_message.json"]
