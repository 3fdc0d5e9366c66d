"""The two crypto backends (ADR 0039): cryptography (services) and PyNaCl (the bare device SDK).

Both must give the same bytes: RFC 9180 A.2.1 (HPKE base, X25519 / HKDF-SHA256 / ChaCha20Poly1305)
and RFC 8439's ChaCha20 block, every golden vector of tests/vectors, one backend's seal opening
with the other, the same keyed CSPRNG stream; and both must refuse a tampered ciphertext or
signature. The whole envelope, signing and rng test files also run with the PyNaCl backend forced
(``DENIABLE_CRYPTO_BACKEND=pynacl``, see docs/adr/0039-device-crypto-on-pynacl.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from deniable.core import primitives
from deniable.core.crypto import (
    KEM_HYBRID,
    DecryptionError,
    KeyPair,
    PublicKey,
    SigningKey,
    open_report,
    seal_report,
)
from deniable.core.crypto.envelope import HYBRID_NEEDS
from deniable.core.crypto.hpke_base import derive_key_pair, open_sealed, seal
from deniable.core.descriptions import CampaignSignatureError, verify_campaign
from deniable.core.rng import Csprng
from deniable.v1 import deniable_pb2 as pb

VECTORS = Path(__file__).resolve().parents[1] / "vectors"
BACKENDS = list(primitives.BACKENDS)

# RFC 9180 A.2.1: DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, ChaCha20Poly1305, mode 0 (base).
RFC_INFO = bytes.fromhex("4f6465206f6e2061204772656369616e2055726e")
RFC_IKM_E = bytes.fromhex("909a9b35d3dc4713a5e72a4da274b55d3d3821a37e5d099e74a647db583a904b")
RFC_SK_RM = bytes.fromhex("8057991eef8f1f1af18f4a9491d16a1ce333f695d4db8e38da75975c4478e0fb")
RFC_PK_RM = bytes.fromhex("4310ee97d88cc1f088a5576c77ab0cf5c3ac797f3d95139c6c84b5429c59662a")
RFC_ENC = bytes.fromhex("1afa08d3dec047a643885163f1180476fa7ddb54c6a8029ea33f95796bf2ac4a")
RFC_PT = bytes.fromhex("4265617574792069732074727574682c20747275746820626561757479")
RFC_AAD_0 = bytes.fromhex("436f756e742d30")  # "Count-0": the first encryption of the context
RFC_CT_0 = bytes.fromhex(
    "1c5250d8034ec2b784ba2cfd69dbdb8af406cfe3ff938e131f0def8c8b60b4db21993c62ce81883d2dd1b51a28"
)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each backend in turn, the previous one restored afterwards."""
    previous = primitives.use(request.param)
    yield request.param
    primitives.use(previous)


def _on(name: str) -> str:
    """Switch to ``name``; returns the previous backend (for ``primitives.use`` in a finally)."""
    return primitives.use(name)


def test_rfc9180_a21_seal_with_the_rfc_ephemeral_gives_the_rfc_bytes(backend: str) -> None:
    """DeriveKeyPair(ikmE) gives the RFC's enc; seal with it gives enc || ct exactly; open inverts."""
    ephemeral, enc = derive_key_pair(RFC_IKM_E)
    assert enc == RFC_ENC
    assert primitives.x25519_public(RFC_SK_RM) == RFC_PK_RM
    assert seal(RFC_PK_RM, RFC_INFO, RFC_PT, RFC_AAD_0, ephemeral=ephemeral) == RFC_ENC + RFC_CT_0
    assert open_sealed(RFC_SK_RM, RFC_INFO, RFC_ENC + RFC_CT_0, RFC_AAD_0) == RFC_PT
    with pytest.raises(ValueError, match="authenticate"):
        open_sealed(RFC_SK_RM, RFC_INFO, RFC_ENC + RFC_CT_0, b"Count-1")


def test_rfc8439_chacha20_block_and_keystream_chunks_agree() -> None:
    """RFC 8439 2.3.2 (key 00..1f, nonce 000000090000004a00000000, counter 1) is the first block of
    chunk ``nonce`` on both backends, and whole chunks are byte-identical to raw ChaCha20."""
    key = bytes(range(32))
    nonce = bytes.fromhex("000000090000004a00000000")
    block = bytes.fromhex(
        "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
        "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e"
    )
    index = int.from_bytes(nonce, "little")
    chunks = {}
    for name in BACKENDS:
        previous = _on(name)
        try:
            chunks[name] = primitives.keystream_chunk(key, index)
        finally:
            primitives.use(previous)
    assert chunks["cryptography"] == chunks["pynacl"]
    assert chunks["pynacl"][:64] == block
    raw = Cipher(algorithms.ChaCha20(key, (1).to_bytes(4, "little") + nonce), mode=None).encryptor()
    assert chunks["pynacl"] == raw.update(bytes(primitives.KEYSTREAM_CHUNK))


def test_the_keyed_csprng_stream_is_the_same_on_both_backends() -> None:
    """Reads crossing chunk boundaries, and a large one, give the same bytes and integers."""
    streams = []
    for name in BACKENDS:
        previous = _on(name)
        try:
            rng = Csprng(key=b"\x42" * 32)
            streams.append((rng.bytes(70_000), rng.bytes(3), rng.bytes(200_000), rng.randbelow(10**40)))
        finally:
            primitives.use(previous)
    assert streams[0] == streams[1]


def test_every_golden_envelope_vector_opens_on_both_backends(backend: str) -> None:
    """envelope.json and report.json (sealed by cryptography's HPKE) open to the recorded plaintexts."""
    envelope = json.loads((VECTORS / "envelope.json").read_text())
    key_pair = KeyPair(0, bytes.fromhex(envelope["recipient_private_key"]))
    assert key_pair.public.raw.hex() == envelope["recipient_public_key"]
    for case in envelope["sealed"]:
        pair = KeyPair(case["key_id"], key_pair.private_raw)
        sealed = bytes.fromhex(case["ciphertext"])
        opened = open_report(sealed, pair, case["campaign_id"], bytes.fromhex(case["incarnation"]))
        assert opened.hex() == case["plaintext"]
    report = json.loads((VECTORS / "report.json").read_text())
    campaign = pb.Campaign.FromString(bytes.fromhex(report["campaign"]))
    pair = KeyPair(campaign.key_id, bytes.fromhex(report["recipient_private_key"]))
    opened = open_report(bytes.fromhex(report["ciphertext"]), pair, campaign.id, campaign.incarnation)
    assert opened.hex() == report["plaintext"]


@pytest.mark.parametrize(("sealer", "opener"), [("pynacl", "cryptography"), ("cryptography", "pynacl")])
def test_a_seal_on_one_backend_opens_on_the_other(sealer: str, opener: str) -> None:
    """The device's seal (PyNaCl) opens at the aggregator (cryptography's HPKE), and back."""
    key_pair = KeyPair.generate(7)
    previous = _on(sealer)
    try:
        sealed = seal_report(b"padded plaintext", key_pair.public, "campaign-x", b"\x01" * 16)
        primitives.use(opener)
        assert open_report(sealed, key_pair, "campaign-x", b"\x01" * 16) == b"padded plaintext"
    finally:
        primitives.use(previous)


def test_a_tampered_ciphertext_fails_on_both_backends(backend: str) -> None:
    """Flipping a byte of enc, of the ciphertext or of the tag is refused; so is another campaign.
    The same flip with the check removed (AEAD decryption without the tag) would give a plaintext:
    the refusal is the authentication, not a malformed input."""
    key_pair = KeyPair.generate(3)
    sealed = seal_report(b"\x00" * 40, key_pair.public, "c", b"")
    assert open_report(sealed, key_pair, "c") == b"\x00" * 40
    for position in (0, 31, 32, 50, len(sealed) - 1):
        tampered = bytearray(sealed)
        tampered[position] ^= 0x01
        with pytest.raises(DecryptionError):
            open_report(bytes(tampered), key_pair, "c")
    with pytest.raises(DecryptionError):
        open_report(sealed, key_pair, "d")
    with pytest.raises(DecryptionError):
        open_report(sealed[:47], key_pair, "c")


def _signed(signing: SigningKey) -> pb.Campaign:
    return signing.sign_campaign(pb.Campaign(id="signed-campaign", epsilon0=1.0, key_id=3))


def test_signatures_verify_and_tampering_fails_on_both_backends(backend: str) -> None:
    """A campaign signed by cryptography verifies; a changed field, a flipped signature bit or
    another pinned key is refused. Without the check the altered campaign would be accepted as is."""
    signing = SigningKey.generate()
    campaign = _signed(signing)
    verify_campaign(campaign, signing.public_raw)
    verify_campaign(campaign, signing.public_raw.hex())
    altered = pb.Campaign()
    altered.CopyFrom(campaign)
    altered.epsilon0 = 8.0
    flipped = pb.Campaign()
    flipped.CopyFrom(campaign)
    flipped.signature = bytes([campaign.signature[0] ^ 0x01]) + campaign.signature[1:]
    for bad, key in ((altered, signing.public_raw), (flipped, signing.public_raw)):
        with pytest.raises(CampaignSignatureError, match="does not verify"):
            verify_campaign(bad, key)
    with pytest.raises(CampaignSignatureError, match="does not verify"):
        verify_campaign(campaign, SigningKey.generate().public_raw)
    assert not primitives.ed25519_verify(bytes(32), campaign.signature, b"x")


def test_the_hybrid_suite_is_refused_on_pynacl_with_the_extra_named() -> None:
    """PyNaCl has no ML-KEM: sealing to a hybrid key says which package brings it, never a crash."""
    hybrid = KeyPair.generate(1, KEM_HYBRID)
    previous = _on("pynacl")
    try:
        with pytest.raises(ValueError, match="cryptography") as refused:
            seal_report(b"x", PublicKey(1, hybrid.public.raw), "c")
        assert str(refused.value) == HYBRID_NEEDS
        with pytest.raises(ValueError, match="cryptography"):
            KeyPair.generate(2, KEM_HYBRID)
        assert KeyPair.generate(2).public.kem.name == "x25519"
    finally:
        primitives.use(previous)


def _probe(env: dict[str, str], code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, timeout=120
    )


def test_the_environment_variable_forces_a_backend_and_refuses_unknown_names() -> None:
    """``DENIABLE_CRYPTO_BACKEND=pynacl`` at start-up; a typo is an error naming the choices."""
    code = "from deniable.core import primitives; print(primitives.active())"
    assert _probe({primitives.BACKEND_ENV: "pynacl"}, code).stdout.strip() == "pynacl"
    assert _probe({primitives.BACKEND_ENV: ""}, code).stdout.strip() == "cryptography"
    typo = _probe({primitives.BACKEND_ENV: "nacl"}, code)
    assert typo.returncode == 1 and "use one of cryptography, pynacl" in typo.stderr


def test_without_cryptography_the_sdk_seals_and_verifies_on_pynacl() -> None:
    """cryptography made unimportable (as in the bare install): the client imports, the backend is
    PyNaCl, a seal opens, a signature verifies, the CSPRNG runs, and cryptography is never loaded."""
    code = (
        "import sys; sys.modules['cryptography'] = None\n"
        "import deniable.client\n"
        "from deniable.core import primitives\n"
        "from deniable.core.crypto import KeyPair, open_report, seal_report\n"
        "from deniable.core.rng import default_rng\n"
        "key = KeyPair(1, bytes(range(32)))\n"
        "assert open_report(seal_report(b'abc', key.public, 'c'), key, 'c') == b'abc'\n"
        "assert len(default_rng().bytes(100_000)) == 100_000\n"
        "loaded = [m for m in sys.modules if m.startswith('cryptography') and sys.modules[m]]\n"
        "print(primitives.active(), loaded)\n"
    )
    done = _probe({primitives.BACKEND_ENV: ""}, code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "pynacl []"
