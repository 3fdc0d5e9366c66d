"""``deniable status``, ``shuffler spool`` and ``campaign delete`` against real TLS services:
operator-only (a device certificate is refused), the numbers an operator needs, and delete refused
while the window is open or a shuffler still holds reports of the campaign."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support.stack import tls_pair

from deniable.aggregator import RunningAggregator
from deniable.cli.main import main
from deniable.core.campaigns import randomiser_for
from deniable.core.crypto import PublicKey, seal_report
from deniable.core.plumbing.certs import DevCerts
from deniable.core.plumbing.tls import ClientTls, open_channel
from deniable.core.wire import Plaintext, encode, new_report_id
from deniable.shuffler import RunningShuffler
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc


@dataclass
class Stack:
    aggregator: RunningAggregator
    shuffler: RunningShuffler
    certs: DevCerts

    def tls(self, role: str) -> list[str]:
        """CLI options presenting ``role``'s certificate."""
        return [
            "--tls-ca",
            str(self.certs.ca),
            "--tls-cert",
            str(self.certs.cert(role)),
            "--tls-key",
            str(self.certs.key(role)),
        ]

    def client(self, role: str | None) -> ClientTls:
        if role is None:
            return ClientTls(ca=self.certs.ca)
        return ClientTls(ca=self.certs.ca, cert=self.certs.cert(role), key=self.certs.key(role))


@pytest.fixture
async def stack(tmp_path: Path, dev_certs: DevCerts) -> AsyncIterator[Stack]:
    async with tls_pair(tmp_path, dev_certs, grace=1.0, operator_listen="127.0.0.1:0") as (
        aggregator,
        shuffler,
    ):
        yield Stack(aggregator, shuffler, dev_certs)


def sealed(campaign: pb.Campaign, count: int, garbage: int = 0) -> list[pb.EncryptedReport]:
    """``count`` well-formed "yes" reports and ``garbage`` of the right size that do not decrypt."""
    width = randomiser_for(campaign).payload_length
    out = []
    for _ in range(count):
        plain = Plaintext(new_report_id(), campaign.id, campaign.key_id, (1).to_bytes(width, "big"))
        text = seal_report(
            encode(plain, campaign.plaintext_length),
            PublicKey(campaign.key_id, campaign.public_key),
            campaign.id,
            campaign.incarnation,
        )
        out.append(pb.EncryptedReport(campaign_id=campaign.id, key_id=campaign.key_id, ciphertext=text))
    bad = bytes(campaign.ciphertext_length)
    out += [pb.EncryptedReport(campaign_id=campaign.id, key_id=campaign.key_id, ciphertext=bad)] * garbage
    return out


async def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``deniable argv`` (it runs its own event loop, so in a thread); (exit code, out, err)."""
    code = await asyncio.to_thread(main, list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_status_spool_and_delete_through_the_operator_surface(
    stack: Stack, capsys: pytest.CaptureFixture[str]
) -> None:
    async with open_channel(stack.aggregator.address, stack.client("operator")) as channel:
        campaign = await pb_grpc.AggregatorStub(channel).CreateCampaign(
            pb.CreateCampaignRequest(id="c1", question="Yes?", kind=pb.BINARY, epsilon0=1.0, n_min=10)
        )
    async with open_channel(stack.shuffler.address, stack.client(None)) as device:
        shuffler = pb_grpc.ShufflerStub(device)
        await shuffler.SubmitReports(pb.SubmitReportsRequest(reports=sealed(campaign, 10, garbage=1)))
        await stack.shuffler.flush()  # one batch of 11 (target 10): 10 counted, 1 undecryptable
        await shuffler.SubmitReports(pb.SubmitReportsRequest(reports=sealed(campaign, 2)))  # held
    agg, op = stack.aggregator.address, stack.shuffler.operator_address
    assert op is not None

    code, out, _ = await cli(
        capsys, "status", "--aggregator", agg, "--shuffler", op, "--json", *stack.tls("operator")
    )
    assert code == 0
    status = json.loads(out)
    (row,) = status["campaigns"]
    assert (row["id"], row["counted"], row["batches"], row["n_min"], row["batch_target"]) == (
        "c1",
        10,
        1,
        10,
        10,
    )
    assert row["rejected"] == {"undecryptable": 1}
    assert row["held_at_shufflers"] == {"pending": 2, "in_flight": 0}
    assert row["last_batch_unix"] and not row["closed"]
    assert [(k["key_id"], k["state"], k["campaigns"]) for k in status["keys"]] == [
        (campaign.key_id, "active", ["c1"])
    ]
    code, text, _ = await cli(capsys, "status", "--aggregator", agg, "--shuffler", op, *stack.tls("operator"))
    assert code == 0 and "held at shufflers: 2 pending + 0 in flight; batch target 10, n_min 10" in text
    assert "rejected: undecryptable 1" in text and "counted 10 in 1 batches" in text

    code, _, err = await cli(capsys, "status", "--aggregator", agg, *stack.tls("device"))
    assert code == 1 and "PERMISSION_DENIED" in err  # operator-only: the interceptor denies by default
    code, out, _ = await cli(capsys, "shuffler", "spool", "--shuffler", op, "--json", *stack.tls("operator"))
    assert code == 0 and json.loads(out) == [{"campaign": "c1", "pending": 2, "in_flight": 0}]

    delete = ["campaign", "delete", "c1", "--aggregator", agg, "--shuffler", op, *stack.tls("operator")]
    code, _, err = await cli(capsys, *delete)
    assert code == 2 and "still holds 2 reports" in err  # checked at the shuffler first
    code, _, err = await cli(capsys, "campaign", "delete", "c1", "--aggregator", agg, *stack.tls("operator"))
    assert code == 1 and "FAILED_PRECONDITION" in err and "is open" in err
    code, _, _ = await cli(capsys, "campaign", "close", "c1", "--aggregator", agg, *stack.tls("operator"))
    assert code == 0
    release = [
        "shuffler",
        "flush",
        "--below-n-min",
        "--campaign",
        "c1",
        "--shuffler",
        op,
        "--aggregator",
        agg,
    ]
    code, _, err = await cli(capsys, *release, *stack.tls("operator"))  # the 2 held, authorised and recorded
    assert code == 0, err
    code, out, err = await cli(capsys, *delete)
    assert code == 0, err
    assert "deleted c1" in out
    code, out, _ = await cli(capsys, "status", "--aggregator", agg, "--json", *stack.tls("operator"))
    assert json.loads(out)["campaigns"] == []
