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

    def tls(self, role: str, peer: str = "aggregator", prefix: str = "--") -> list[str]:
        """CLI options presenting ``role``'s certificate to ``peer`` (trusting only its CA)."""
        return [
            f"{prefix}tls-ca",
            str(self.certs.ca(peer)),
            f"{prefix}tls-cert",
            str(self.certs.cert(role)),
            f"{prefix}tls-key",
            str(self.certs.key(role)),
        ]

    def both(self) -> list[str]:
        """The aggregator's operator credential, and the shuffler's for --shuffler (two parties)."""
        return [
            *self.tls("aggregator-operator"),
            *self.tls("shuffler-operator", "shuffler", "--shuffler-"),
        ]

    def client(self, role: str | None, peer: str = "aggregator") -> ClientTls:
        if role is None:
            return ClientTls(ca=self.certs.ca(peer))
        return ClientTls(ca=self.certs.ca(peer), cert=self.certs.cert(role), key=self.certs.key(role))


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
    async with open_channel(stack.aggregator.address, stack.client("aggregator-operator")) as channel:
        campaign = await pb_grpc.AggregatorStub(channel).CreateCampaign(
            pb.CreateCampaignRequest(id="c1", question="Yes?", kind=pb.BINARY, epsilon0=1.0, n_min=10)
        )
    async with open_channel(stack.shuffler.address, stack.client(None, "shuffler")) as device:
        shuffler = pb_grpc.ShufflerStub(device)
        await shuffler.SubmitReports(pb.SubmitReportsRequest(reports=sealed(campaign, 10, garbage=1)))
        await stack.shuffler.flush()  # one batch of 11 (target 10): 10 counted, 1 undecryptable
        await shuffler.SubmitReports(pb.SubmitReportsRequest(reports=sealed(campaign, 2)))  # held
    agg, op = stack.aggregator.address, stack.shuffler.operator_address
    assert op is not None

    code, out, _ = await cli(capsys, "status", "--aggregator", agg, "--shuffler", op, "--json", *stack.both())
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
    code, text, _ = await cli(capsys, "status", "--aggregator", agg, "--shuffler", op, *stack.both())
    assert code == 0 and "held at shufflers: 2 pending + 0 in flight; batch target 10, n_min 10" in text
    assert "rejected: undecryptable 1" in text and "counted 10 in 1 batches" in text

    code, _, err = await cli(capsys, "status", "--aggregator", agg, *stack.tls("shuffler-operator"))
    assert code == 1 and "PERMISSION_DENIED" in err  # the aggregator's operator only: denied by default
    code, out, _ = await cli(
        capsys, "shuffler", "spool", "--shuffler", op, "--json", *stack.tls("shuffler-operator", "shuffler")
    )
    assert code == 0 and json.loads(out) == [{"campaign": "c1", "pending": 2, "in_flight": 0}]

    delete = ["campaign", "delete", "c1", "--aggregator", agg, "--shuffler", op, *stack.both()]
    code, _, err = await cli(capsys, *delete)
    assert code == 2 and "still holds 2 reports" in err  # checked at the shuffler first
    code, _, err = await cli(
        capsys, "campaign", "delete", "c1", "--aggregator", agg, *stack.tls("aggregator-operator")
    )
    assert code == 1 and "FAILED_PRECONDITION" in err and "is open" in err
    code, _, _ = await cli(
        capsys, "campaign", "close", "c1", "--aggregator", agg, *stack.tls("aggregator-operator")
    )
    assert code == 0
    release = [
        "campaign",
        "release-below-n-min",
        "c1",
        "--aggregator",
        agg,
        *stack.tls("aggregator-operator"),
    ]
    code, _, err = await cli(capsys, *release)  # the aggregator's operator authorises ...
    assert code == 0, err
    flush = ["shuffler", "flush", "--below-n-min", "--campaign", "c1", "--shuffler", op]
    code, _, err = await cli(
        capsys, *flush, *stack.tls("shuffler-operator", "shuffler")
    )  # ... the shuffler's releases
    assert code == 0, err
    code, out, err = await cli(capsys, *delete)
    assert code == 0, err
    assert "deleted c1" in out
    code, out, _ = await cli(
        capsys, "status", "--aggregator", agg, "--json", *stack.tls("aggregator-operator")
    )
    assert json.loads(out)["campaigns"] == []
