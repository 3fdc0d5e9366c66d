"""Write the golden vectors of docs/wire.md to tests/vectors/*.json.

Usage: python scripts/make_vectors.py [--out tests/vectors]   (rewrite every file)
       python scripts/make_vectors.py --check                  (exit 1 if a reproducible file differs)

Everything is derived from fixed keys, so a rerun reproduces every file byte for byte except the
HPKE ciphertexts: cryptography's HPKE draws its ephemeral key itself, so those vectors go in the
decryption direction (recipient key, info, plaintext, enc || ct). tests/test_wire_vectors.py
checks the committed files both ways against the code. multi_message.json (docs/wire.md §6.8,
the shuffle-only protocols) keeps the ciphertexts of its sealed report while they still open to
the plaintexts it computes, so it, mechanisms.json and plaintext.json are byte-reproducible:
``--check`` (and tests/test_wire_vectors.py) fail when a change to a randomiser leaves them stale.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

from deniable.core import mechanisms
from deniable.core.campaigns import layout_for
from deniable.core.crypto import SUITE_NAME, KeyPair, envelope_info, open_report, seal_report
from deniable.core.crypto.envelope import DecryptionError
from deniable.core.rng import Csprng
from deniable.core.wire import Plaintext, encode, plaintext_length
from deniable.v1 import deniable_pb2 as pb

ROOT = Path(__file__).resolve().parents[1]

# (name, epsilon0, domain_size, params): every local randomiser, small and larger domains.
MECHANISMS: list[tuple[str, float, int, dict[str, float]]] = [
    ("binary_rr", 1.0, 2, {}),
    ("grr", 1.0, 8, {}),
    ("grr", 0.5, 300, {}),
    ("sue", 1.0, 10, {}),
    ("oue", 2.0, 12, {}),
    ("subset_selection", 1.0, 10, {}),
    ("hadamard_response", 1.0, 8, {}),
    ("olh", 1.0, 20, {}),
]


class RecordingRng(Csprng):
    """A keyed Csprng that remembers every byte it hands out (the randomness of one report)."""

    def __init__(self, key: bytes) -> None:
        super().__init__(key=key)
        self.served = bytearray()

    def bytes(self, count: int) -> bytes:
        out = super().bytes(count)
        self.served += out
        return out


def fixed_key(label: str) -> bytes:
    """32 bytes derived from a label, for reproducible vectors only."""
    return hashlib.sha256(b"deniable test vector: " + label.encode()).digest()


def thresholds(randomiser: mechanisms.LocalRandomiser) -> dict[str, int]:
    """The integer thresholds / weights docs/wire.md defines, as the randomiser holds them."""
    names = (
        "_keep_threshold",
        "_keep_weight",
        "_total_weight",
        "own_threshold",
        "other_threshold",
        "include_threshold",
        "subset_size",
        "_inside_threshold",
        "order",
        "seeds",
        "g",
    )
    return {name.lstrip("_"): int(getattr(randomiser, name)) for name in names if hasattr(randomiser, name)}


def mechanism_vectors() -> list[dict[str, Any]]:
    """For each mechanism: parameters, thresholds, and (value, randomness, payload) cases."""
    out = []
    for name, epsilon0, d, params in MECHANISMS:
        randomiser = mechanisms.create(name, epsilon0=epsilon0, domain_size=d, **params)
        cases = []
        for case, value in enumerate(sorted({0, 1, d // 2, d - 1} | {v % d for v in range(3, 9)})):
            rng = RecordingRng(fixed_key(f"{name}/{d}/{case}"))
            payload = randomiser.randomise(value, rng)
            cases.append({"value": value, "randomness": rng.served.hex(), "payload": payload.hex()})
        out.append(
            {
                "mechanism": name,
                "proto": int(randomiser.proto),
                "epsilon0": epsilon0,
                "domain_size": d,
                "params": params,
                "payload_length": randomiser.payload_length,
                "thresholds": thresholds(randomiser),
                "cases": cases,
            }
        )
    return out


def plaintext_vectors() -> list[dict[str, Any]]:
    """Encoded plaintexts, and plaintexts a decoder must refuse."""
    good = []
    for case, (campaign, key_id, payload) in enumerate(
        [("c1", 1, b"\x01"), ("ui-language", 7, b"\x05"), ("a" * 63, 0xFFFFFFFF, bytes(range(40)))]
    ):
        report_id = hashlib.sha256(f"report id {case}".encode()).digest()[:16]
        length = plaintext_length(len(payload))
        data = encode(Plaintext(report_id, campaign, key_id, payload), length)
        good.append(
            {
                "report_id": report_id.hex(),
                "campaign_id": campaign,
                "key_id": key_id,
                "payload": payload.hex(),
                "plaintext_length": length,
                "plaintext": data.hex(),
            }
        )
    base = bytes.fromhex(good[0]["plaintext"])
    bad = [
        {"why": "version 2", "plaintext": (b"\x02" + base[1:]).hex()},
        {"why": "non-zero padding", "plaintext": (base[:-1] + b"\x01").hex()},
        {"why": "payload length past the end", "plaintext": (base[:86] + b"\x00\xff" + base[88:]).hex()},
        {
            "why": "campaign id field not zero after its length",
            "plaintext": (base[:25] + b"x" + base[26:]).hex(),
        },
        {"why": "campaign id not a valid id", "plaintext": (base[:23] + b"C1" + base[25:]).hex()},
    ]
    return [{"plaintext_length": good[0]["plaintext_length"], "valid": good, "invalid": bad}]


def envelope_vectors() -> dict[str, Any]:
    """One aggregator key, the HPKE info for two contexts, and sealed reports to open."""
    key_pair = KeyPair(key_id=3, private_raw=fixed_key("aggregator x25519"))
    sealed = []
    incarnated = fixed_key("incarnation")[:16]
    for campaign, payload, incarnation in [
        ("dark-mode", b"\x01", b""),
        ("ui-language", b"\x06", b""),
        ("dark-mode", b"\x00", incarnated),
    ]:
        report_id = hashlib.sha256(f"sealed {campaign} {incarnation.hex()}".encode()).digest()[:16]
        length = plaintext_length(len(payload))
        plaintext = encode(Plaintext(report_id, campaign, key_pair.key_id, payload), length)
        ciphertext = seal_report(plaintext, key_pair.public, campaign, incarnation)
        sealed.append(
            {
                "campaign_id": campaign,
                "key_id": key_pair.key_id,
                "incarnation": incarnation.hex(),
                "info": envelope_info(campaign, key_pair.key_id, incarnation).hex(),
                "plaintext": plaintext.hex(),
                "enc": ciphertext[:32].hex(),
                "ciphertext": ciphertext.hex(),
            }
        )
    return {
        "suite": SUITE_NAME,
        "mode": "base",
        "kem_id": 0x0020,
        "kdf_id": 0x0001,
        "aead_id": 0x0003,
        "recipient_private_key": key_pair.private_raw.hex(),
        "recipient_public_key": key_pair.public.raw.hex(),
        "sealed": sealed,
    }


def vector_campaign(
    campaign_id: str,
    randomiser: mechanisms.LocalRandomiser,
    key_pair: KeyPair,
    epsilon0: float,
    incarnation: bytes,
) -> pb.Campaign:
    """The campaign description a vector's device receives: a categorical question over a..d (cut to
    the domain), sealed to ``key_pair`` with the randomiser's size class."""
    layout = layout_for(randomiser)
    return pb.Campaign(
        id=campaign_id,
        question="Which one?",
        kind=pb.CATEGORICAL,
        labels=["a", "b", "c", "d"][: randomiser.domain_size],
        mechanism=randomiser.proto,  # type: ignore[arg-type]
        epsilon0=epsilon0,
        delta=1e-6,
        n_min=1,
        key_id=key_pair.key_id,
        public_key=key_pair.public.raw,
        hpke_suite=SUITE_NAME,
        payload_length=layout.payload_length,
        plaintext_length=layout.plaintext_length,
        ciphertext_length=layout.ciphertext_length,
        device_budget_epsilon=epsilon0,
        incarnation=incarnation,
    )


def report_vector() -> dict[str, Any]:
    """One whole report: the campaign description a device receives, its answer, every byte after."""
    key_pair = KeyPair(key_id=3, private_raw=fixed_key("aggregator x25519"))
    randomiser = mechanisms.create("grr", epsilon0=1.0, domain_size=4)
    campaign = vector_campaign("vector-grr", randomiser, key_pair, 1.0, fixed_key("report/incarnation")[:16])
    rng = RecordingRng(fixed_key("report/randomness"))
    payload = randomiser.randomise(2, rng)
    report_id = RecordingRng(fixed_key("report/id")).bytes(16)
    plaintext = encode(Plaintext(report_id, campaign.id, campaign.key_id, payload), campaign.plaintext_length)
    ciphertext = seal_report(plaintext, key_pair.public, campaign.id, campaign.incarnation)
    return {
        "campaign": campaign.SerializeToString(deterministic=True).hex(),
        "value": 2,
        "randomness": rng.served.hex(),
        "payload": payload.hex(),
        "report_id": report_id.hex(),
        "info": envelope_info(campaign.id, campaign.key_id, campaign.incarnation).hex(),
        "plaintext": plaintext.hex(),
        "recipient_private_key": key_pair.private_raw.hex(),
        "ciphertext": ciphertext.hex(),
    }


# (name, epsilon0, domain_size, params): every shuffle-only protocol (docs/wire.md §6.8), its
# parameters given as a signed campaign carries them (so no search runs), small enough that the
# Polya noise draws are often non-zero.
SHUFFLE_ONLY: list[tuple[str, float, int, dict[str, float]]] = [
    ("cheu_binary_sum", 1.0, 2, {"expected_n": 100, "flip_probability": 0.341796875}),
    ("sample_and_threshold", 1.0, 5, {"sample_rate": 0.393463134765625, "threshold": 45}),
    ("sample_and_threshold", 1.0, 300, {"sample_rate": 0.393463134765625, "threshold": 45}),
    ("balcer_cheu_histogram", 1.0, 5, {"expected_n": 1000, "skip_probability": 0.25}),
    ("multi_message_sum", 1.0, 2, {"expected_n": 20, "messages": 3, "noise_probability": 0.1}),
    ("multi_message_sum", 1.0, 2, {"expected_n": 1000, "messages": 4, "noise_probability": 0.004}),
    ("multi_message_sum_binomial", 1.0, 2, {"expected_n": 1000, "messages": 3, "noise_probability": 0.25}),
    ("multi_message_histogram", 1.0, 4, {"expected_n": 20, "messages": 3, "noise_probability": 0.05}),
    ("flooded_histogram", 1.0, 4, {"expected_n": 20, "flood": 2.0, "noise_probability": 0.1}),
    ("flooded_histogram", 1.0, 130, {"expected_n": 1000, "flood": 3.0, "noise_probability": 0.002}),
    # the Bernoulli flood of ADR 0035 (flood_shares 0), still a valid campaign
    (
        "flooded_histogram",
        1.0,
        4,
        {"expected_n": 40, "flood": 2.0, "flood_dispersion": 1.0, "noise_probability": 0.1},
    ),
]
# The sealed multi-message report: flooded_histogram with little noise (a few messages to seal).
REPORT_PROTOCOL = ("flooded_histogram", 1.0, 4, {"expected_n": 20, "flood": 2.0, "noise_probability": 0.05})
SHUFFLE_ONLY_CASES = 8  # answers per protocol: the smallest domains get several per value


def derived_integers(randomiser: mechanisms.LocalRandomiser) -> dict[str, int]:
    """The integers docs/wire.md §6.8 derives from a campaign's params, as the randomiser holds them."""
    out: dict[str, int] = {}
    for name, attribute in (
        ("flip_threshold", "_flip_threshold"),
        ("skip_threshold", "_skip_threshold"),
        ("flood_threshold", "_flood_threshold"),
        ("messages", "messages"),
        ("modulus", "modulus"),
    ):
        if hasattr(randomiser, attribute):
            out[name] = int(getattr(randomiser, attribute))
    for name, attribute in (("noise", "noise"), ("sample", "rate")):
        value = getattr(randomiser, attribute, None)
        if value is not None:
            out[f"{name}_numerator"], out[f"{name}_denominator"] = value.numerator, value.denominator
    return out


def invalid_messages(randomiser: mechanisms.LocalRandomiser) -> list[dict[str, str]]:
    """Messages of the right length the aggregator's tally refuses (PAYLOAD_OUT_OF_DOMAIN)."""
    width, d = randomiser.payload_length, randomiser.domain_size
    name = randomiser.name
    if name == "cheu_binary_sum":
        cases = [("value 2", 2)]
    elif name in ("sample_and_threshold", "balcer_cheu_histogram"):
        cases = [
            ("value above d (the null or presence value)", d + 1),
            ("largest value", (1 << 8 * width) - 1),
        ]
    elif name == "flooded_histogram":
        cases = [("value above 2d (the presence value)", 2 * d + 1), ("largest value", (1 << 8 * width) - 1)]
    else:
        q = getattr(randomiser, "modulus")  # noqa: B009 (split-and-mix only)
        share_bits = 8 * (width - (1 if name != "multi_message_histogram" else width_for_tag(d)))
        share_tag = 1 if name != "multi_message_histogram" else d - 1
        presence_tag = 0 if name != "multi_message_histogram" else d
        cases = [
            ("share not below q", share_tag << share_bits | q),
            ("presence message with a non-zero value", presence_tag << share_bits | 1),
            ("unknown tag", (presence_tag + 2) << share_bits),
        ]
    return [{"why": why, "message": value.to_bytes(width, "big").hex()} for why, value in cases]


def width_for_tag(domain_size: int) -> int:
    """Bytes of the bucket tag of multi_message_histogram (values 0..d)."""
    return max(1, (domain_size.bit_length() + 7) // 8)


def shuffle_only_vector(name: str, epsilon0: float, d: int, given: dict[str, float]) -> dict[str, Any]:
    """One protocol: its params as a campaign carries them, derived integers, answers, bad messages."""
    first = mechanisms.create(name, epsilon0=epsilon0, domain_size=d, **given)
    params = first.parameters()
    randomiser = mechanisms.create(name, epsilon0=epsilon0, domain_size=d, **params)  # as a device does
    width = randomiser.payload_length
    values = sorted({0, 1, d // 2, d - 1})
    cases = []
    for case in range(SHUFFLE_ONLY_CASES):
        value = values[case % len(values)]
        rng = RecordingRng(fixed_key(f"{name}/{d}/{params.get('expected_n', 0)}/{case}"))
        output = randomiser.randomise(value, rng)
        messages = [output[i : i + width].hex() for i in range(0, len(output), width)]
        cases.append({"value": value, "randomness": rng.served.hex(), "messages": messages})
    return {
        "mechanism": name,
        "proto": int(randomiser.proto),
        "epsilon0": epsilon0,
        "domain_size": d,
        "params": params,
        "payload_length": width,
        "derived": derived_integers(randomiser),
        "cases": cases,
        "invalid": invalid_messages(randomiser),
    }


def multi_message_report(previous: dict[str, Any] | None) -> dict[str, Any]:
    """One whole flooded_histogram answer, every message sealed apart with its own report id.

    A ciphertext of ``previous`` (the committed file) is kept when it still opens to the plaintext
    computed here, so regenerating an unchanged vector rewrites the same bytes.
    """
    key_pair = KeyPair(key_id=3, private_raw=fixed_key("aggregator x25519"))
    name, epsilon0, d, given = REPORT_PROTOCOL
    randomiser = mechanisms.create(name, epsilon0=epsilon0, domain_size=d, **given)
    randomiser = mechanisms.create(name, epsilon0=epsilon0, domain_size=d, **randomiser.parameters())
    layout = layout_for(randomiser)
    campaign = vector_campaign(
        "vector-flooded", randomiser, key_pair, epsilon0, fixed_key("multi/incarnation")[:16]
    )
    campaign.params.update(randomiser.parameters())
    rng = RecordingRng(fixed_key("multi/randomness"))
    messages = randomiser.split_messages(randomiser.randomise(1, rng))
    ids = RecordingRng(fixed_key("multi/ids"))
    old = {m["plaintext"]: m["ciphertext"] for m in (previous or {}).get("messages", [])}
    sealed = []
    for message in messages:
        report_id = ids.bytes(16)
        plaintext = encode(
            Plaintext(report_id, campaign.id, campaign.key_id, message), layout.plaintext_length
        )
        ciphertext = _reuse(old.get(plaintext.hex()), plaintext, key_pair, campaign)
        sealed.append(
            {
                "payload": message.hex(),
                "report_id": report_id.hex(),
                "plaintext": plaintext.hex(),
                "ciphertext": ciphertext.hex(),
            }
        )
    return {
        "campaign": campaign.SerializeToString(deterministic=True).hex(),
        "campaign_id": campaign.id,
        "key_id": campaign.key_id,
        "incarnation": campaign.incarnation.hex(),
        "value": 1,
        "randomness": rng.served.hex(),
        "info": envelope_info(campaign.id, campaign.key_id, campaign.incarnation).hex(),
        "recipient_private_key": key_pair.private_raw.hex(),
        "messages": sealed,
    }


def _reuse(old_hex: str | None, plaintext: bytes, key_pair: KeyPair, campaign: pb.Campaign) -> bytes:
    """The committed ciphertext if it opens to ``plaintext`` in this campaign, else a fresh seal."""
    if old_hex is not None:
        try:
            if open_report(bytes.fromhex(old_hex), key_pair, campaign.id, campaign.incarnation) == plaintext:
                return bytes.fromhex(old_hex)
        except DecryptionError:
            pass
    return seal_report(plaintext, key_pair.public, campaign.id, campaign.incarnation)


def multi_message_vectors(folder: Path) -> dict[str, Any]:
    """multi_message.json: every shuffle-only protocol's vectors and one sealed multi-message report."""
    path = folder / "multi_message.json"
    previous = json.loads(path.read_text()).get("report") if path.exists() else None
    return {
        "protocols": [shuffle_only_vector(*entry) for entry in SHUFFLE_ONLY],
        "report": multi_message_report(previous),
    }


def reproducible_files(folder: Path) -> dict[str, Any]:
    """The files a rerun must reproduce byte for byte (given the committed ciphertexts)."""
    return {
        "mechanisms.json": mechanism_vectors(),
        "plaintext.json": plaintext_vectors(),
        "multi_message.json": multi_message_vectors(folder),
    }


def render(content: Any) -> str:
    """The committed JSON text of a vector file."""
    return json.dumps(content, indent=1) + "\n"


def stale_files(folder: Path) -> list[str]:
    """Names of the reproducible vector files whose committed text differs from a fresh run."""
    return [
        name
        for name, content in reproducible_files(folder).items()
        if not (folder / name).exists() or (folder / name).read_text() != render(content)
    ]


def main() -> None:
    """Write the vector files, or with --check only report (exit 1) those a rerun would change."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "vectors")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is stale")
    args = parser.parse_args()
    if args.check:
        stale = stale_files(args.out)
        for name in stale:
            print(f"stale: {args.out / name} (run python scripts/make_vectors.py)")
        raise SystemExit(1 if stale else 0)
    args.out.mkdir(parents=True, exist_ok=True)
    files = {
        **reproducible_files(args.out),
        "envelope.json": envelope_vectors(),
        "report.json": report_vector(),
    }
    for name, content in files.items():
        (args.out / name).write_text(render(content))
        print(f"wrote {args.out / name}")


if __name__ == "__main__":
    main()
