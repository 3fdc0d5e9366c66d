"""Fuzzing every RPC of both real services over gRPC: random bytes and mutated valid requests get a
clear status (never INTERNAL or UNKNOWN), never count anything, and the services keep serving.

Default run: a few dozen examples per property (seconds); ``pytest -m slow`` runs the large profile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.stack import start_insecure_pair

from deniable.aggregator import RunningAggregator
from deniable.core.crypto import PublicKey, seal_report
from deniable.core.plumbing.service import insecure_channel
from deniable.core.wire import Plaintext, encode, new_report_id
from deniable.shuffler import RunningShuffler
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc

QUICK = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
LONG = settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck), database=None)
FORBIDDEN = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
METHODS = [
    f"/{service.full_name}/{method.name}"
    for service in pb.DESCRIPTOR.services_by_name.values()
    for method in service.methods
]


@dataclass
class Stack:
    runner: asyncio.Runner
    aggregator: RunningAggregator
    shuffler: RunningShuffler
    channels: dict[str, grpc.aio.Channel]
    campaign: pb.Campaign

    def call(self, method: str, body: bytes) -> grpc.StatusCode:
        """Send raw bytes to a method of the service that has it; the status code."""
        channel = self.channels[method.split("/")[1].split(".")[-1]]

        async def once() -> grpc.StatusCode:
            raw: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(method)
            try:
                await raw(body, timeout=10)
            except grpc.aio.AioRpcError as exc:
                return exc.code()
            return grpc.StatusCode.OK

        return self.runner.run(once())

    def counted(self) -> int:
        return self.runner.run(self.aggregator.store.snapshot(self.campaign.id, 2)).n


async def _awaited(call: Any) -> Any:
    """A gRPC call object as a coroutine (``Runner.run`` takes coroutines only)."""
    return await call


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    with asyncio.Runner() as runner:
        aggregator, shuffler = runner.run(start_insecure_pair(tmp_path, quota_per_source=0))
        channels = {
            "Aggregator": insecure_channel(aggregator.address),
            "Shuffler": insecure_channel(shuffler.address),
        }
        operator = pb_grpc.AggregatorStub(channels["Aggregator"])
        request = pb.CreateCampaignRequest(id="fz", question="q?", kind=pb.BINARY, epsilon0=1.0, n_min=2)
        try:
            campaign = runner.run(_awaited(operator.CreateCampaign(request)))
            yield Stack(runner, aggregator, shuffler, channels, campaign)
        finally:
            for channel in channels.values():
                runner.run(channel.close())
            runner.run(shuffler.stop(grace=1.0))
            runner.run(aggregator.stop(grace=1.0))


def _valid_submit(campaign: pb.Campaign, count: int = 1) -> bytes:
    reports = []
    for _ in range(count):
        plaintext = encode(
            Plaintext(new_report_id(), campaign.id, campaign.key_id, b"\x01"), campaign.plaintext_length
        )
        ciphertext = seal_report(
            plaintext, PublicKey(campaign.key_id, campaign.public_key), campaign.id, campaign.incarnation
        )
        reports.append(
            pb.EncryptedReport(campaign_id=campaign.id, key_id=campaign.key_id, ciphertext=ciphertext)
        )
    return pb.SubmitReportsRequest(reports=reports).SerializeToString()


def _flush_and_count(stack: Stack) -> int:
    """Forward everything spooled (below n_min too) and wait until the aggregator answered."""
    shuffler = pb_grpc.ShufflerStub(stack.channels["Shuffler"])
    stack.runner.run(
        _awaited(shuffler.Flush(pb.FlushRequest(campaign_id="fz", below_n_min=True), timeout=20))
    )
    return stack.counted()


def _serving(stack: Stack) -> None:
    for channel in stack.channels.values():
        health = health_pb2_grpc.HealthStub(channel)
        answer = stack.runner.run(_awaited(health.Check(health_pb2.HealthCheckRequest(), timeout=5)))
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


def _fuzz(stack: Stack, chosen: settings) -> None:
    valid = _valid_submit(stack.campaign)

    @chosen
    @given(st.sampled_from(METHODS), st.binary(max_size=300))
    def random_bytes(method: str, body: bytes) -> None:
        assert stack.call(method, body) not in FORBIDDEN

    @chosen
    @given(st.integers(0, 10_000), st.integers(1, 255), st.integers(0, 3))
    def mutated_submit(at: int, xor: int, cut: int) -> None:
        body = bytearray(valid)
        body[at % len(body)] ^= xor
        assert (
            stack.call("/deniable.v1.Shuffler/SubmitReports", bytes(body[: len(body) - cut])) not in FORBIDDEN
        )

    random_bytes()
    mutated_submit()
    assert _flush_and_count(stack) == 0  # nothing fuzzed was counted
    _serving(stack)
    # Positive control: the same path counts valid reports (the check above can fail).
    assert (
        stack.call("/deniable.v1.Shuffler/SubmitReports", _valid_submit(stack.campaign, 3))
        == grpc.StatusCode.OK
    )
    assert _flush_and_count(stack) == 3


def test_rpc_fuzz_both_services(stack: Stack) -> None:
    _fuzz(stack, QUICK)


@pytest.mark.slow
def test_rpc_fuzz_both_services_long(stack: Stack) -> None:
    _fuzz(stack, LONG)
