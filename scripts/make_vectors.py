"""Write the golden vectors of docs/wire.md to tests/vectors/*.json.

Usage: python scripts/make_vectors.py [--out tests/vectors]

Everything is derived from fixed keys, so a rerun reproduces every file byte for byte except the
HPKE ciphertexts: cryptography's HPKE draws its ephemeral key itself, so those vectors go in the
decryption direction (recipient key, info, plaintext, enc || ct). tests/test_wire_vectors.py
checks the committed files both ways against the code.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

from deniable.core import mechanisms
from deniable.core.campaigns import layout_for
from deniable.core.crypto import SUITE_NAME, KeyPair, envelope_info, seal_report
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


def report_vector() -> dict[str, Any]:
    """One whole report: the campaign description a device receives, its answer, every byte after."""
    key_pair = KeyPair(key_id=3, private_raw=fixed_key("aggregator x25519"))
    randomiser = mechanisms.create("grr", epsilon0=1.0, domain_size=4)
    layout = layout_for(randomiser)
    campaign = pb.Campaign(
        id="vector-grr",
        question="Which one?",
        kind=pb.CATEGORICAL,
        labels=["a", "b", "c", "d"],
        mechanism=pb.GRR,
        epsilon0=1.0,
        delta=1e-6,
        n_min=1,
        key_id=key_pair.key_id,
        public_key=key_pair.public.raw,
        hpke_suite=SUITE_NAME,
        payload_length=layout.payload_length,
        plaintext_length=layout.plaintext_length,
        ciphertext_length=layout.ciphertext_length,
        device_budget_epsilon=1.0,
        incarnation=fixed_key("report/incarnation")[:16],
    )
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


def main() -> None:
    """Write the four vector files."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "vectors")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    files = {
        "mechanisms.json": mechanism_vectors(),
        "plaintext.json": plaintext_vectors(),
        "envelope.json": envelope_vectors(),
        "report.json": report_vector(),
    }
    for name, content in files.items():
        (args.out / name).write_text(json.dumps(content, indent=1) + "\n")
        print(f"wrote {args.out / name}")


if __name__ == "__main__":
    main()
