"""docs/wire.md is enough to write a client: tests/support/independent_client.py (stdlib, struct and
cryptography only) reproduces the golden vectors, and its reports are accepted and counted by a
real shuffler and aggregator."""

from __future__ import annotations

import ast
import asyncio
import json
import sys
from pathlib import Path

from support import astutil
from support.sdk_services import binary_campaign, categorical_campaign, counted, running_services

from deniable.client import ClientTls, GrpcTransport
from deniable.v1 import deniable_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "tests" / "support" / "independent_client.py"
ALLOWED = {"__future__", "json", "math", "os", "struct", "sys", "fractions", "pathlib", "collections.abc"}


def test_the_independent_client_imports_nothing_of_ours() -> None:
    """Only the standard library and cryptography's HPKE and X25519."""
    imported: set[str] = set()
    for node in ast.walk(astutil.parse(CLIENT.read_text(), str(CLIENT))):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    third_party = {name for name in imported if name not in ALLOWED}
    assert all(name.startswith("cryptography.") for name in third_party), third_party


async def _run(*args: str) -> str:
    """Run the independent client with ``deniable`` made unimportable (-I: no site tricks either)."""
    blocker = (
        "import sys, runpy; sys.modules['deniable'] = None; sys.argv = sys.argv[1:]; "
        "runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        blocker,
        str(CLIENT),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode().strip()


async def test_the_independent_client_reproduces_the_vectors() -> None:
    assert (await _run("check", str(ROOT / "tests" / "vectors"))).endswith("vectors reproduced")


async def test_reports_sealed_by_the_independent_client_are_counted(tmp_path: Path) -> None:
    """Five GRR and five binary RR reports sealed without our code: the shuffler accepts all ten
    and the aggregator counts each once, none rejected (a wrong layout, info or length would
    make them UNDECRYPTABLE, MALFORMED_PLAINTEXT or WRONG_CIPHERTEXT_LENGTH)."""
    requests = [categorical_campaign("indep-grr", ["a", "b", "c", "d"]), binary_campaign("indep-rr")]
    async with running_services(tmp_path, requests) as services:
        shuffler_ca = ClientTls(ca=services.certs / "shuffler-ca.pem")
        transport = GrpcTransport(services.shuffler_address, tls=shuffler_ca)
        for campaign in services.campaigns:
            mechanism = "grr" if campaign.mechanism == pb.GRR else "binary_rr"
            reports = []
            for value in range(5):
                sealed = await _run(
                    "seal",
                    campaign.public_key.hex(),
                    campaign.id,
                    str(campaign.key_id),
                    str(campaign.plaintext_length),
                    mechanism,
                    repr(campaign.epsilon0),
                    str(len(campaign.labels)),
                    str(value % len(campaign.labels)),
                    campaign.incarnation.hex(),
                )
                reports.append(
                    pb.EncryptedReport(
                        campaign_id=campaign.id, key_id=campaign.key_id, ciphertext=bytes.fromhex(sealed)
                    )
                )
            response = await transport.submit(reports)
            assert response.accepted == 5 and not response.rejected
        await transport.close()
        for campaign in services.campaigns:
            answer = await counted(services, campaign.id, 5)
            assert (answer.n, answer.rejected) == (5, 0), campaign.id


async def test_multi_message_answers_sealed_by_the_independent_client_are_counted(tmp_path: Path) -> None:
    """Three devices' answers of two multi-message protocols (flooded_histogram and
    multi_message_histogram), randomised and sealed message by message without our code from the
    campaign's params: the shuffler accepts every message, and the aggregator counts all of them,
    rejects none and finds three devices (a wrong message layout would be PAYLOAD_OUT_OF_DOMAIN; a
    missing or extra share would make the split-and-mix release refused)."""
    labels = ["a", "b", "c", "d"]
    requests = [
        _shuffle_only_campaign("indep-flooded", pb.FLOODED_HISTOGRAM, labels, flood=2.0),
        _shuffle_only_campaign("indep-mmh", pb.MULTI_MESSAGE_HISTOGRAM, labels, messages=3, modulus=8192),
    ]
    async with running_services(tmp_path, requests) as services:
        transport = GrpcTransport(
            services.shuffler_address, tls=ClientTls(ca=services.certs / "shuffler-ca.pem")
        )
        for campaign in services.campaigns:
            name = (
                "flooded_histogram"
                if campaign.mechanism == pb.FLOODED_HISTOGRAM
                else "multi_message_histogram"
            )
            sent = 0
            for value in (0, 2, 3):
                lines = await _run(
                    "seal-messages",
                    campaign.public_key.hex(),
                    campaign.id,
                    str(campaign.key_id),
                    str(campaign.plaintext_length),
                    name,
                    str(len(campaign.labels)),
                    str(value),
                    campaign.incarnation.hex(),
                    json.dumps(dict(campaign.params)),
                )
                reports = [
                    pb.EncryptedReport(
                        campaign_id=campaign.id, key_id=campaign.key_id, ciphertext=bytes.fromhex(line)
                    )
                    for line in lines.split()
                ]
                response = await transport.submit(reports)
                assert response.accepted == len(reports) and not response.rejected
                sent += len(reports)
            answer = await counted(services, campaign.id, sent)
            assert (answer.messages, answer.rejected, answer.n) == (sent, 0, 3), campaign.id
        await transport.close()


def _shuffle_only_campaign(
    campaign_id: str, mechanism: pb.Mechanism.ValueType, labels: list[str], **params: float
) -> pb.CreateCampaignRequest:
    """A small shuffle-only histogram campaign with every parameter given (no search)."""
    return pb.CreateCampaignRequest(
        id=campaign_id,
        question="Which one?",
        kind=pb.CATEGORICAL,
        labels=labels,
        mechanism=mechanism,
        epsilon0=1.0,
        delta=1e-6,
        n_min=1,
        params={"expected_n": 20, "noise_probability": 0.05, **params},
    )
