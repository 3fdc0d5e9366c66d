"""Load shedding: more concurrent calls than ``max_concurrent_rpcs`` get RESOURCE_EXHAUSTED at once
(nothing spooled or counted for them), the admitted ones complete, and the service is healthy after.

Deterministic: the admitted calls are held inside the handler by a gate until the shed ones have
answered, so the service is saturated for certain (no timing assumption).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.stack import start_insecure_pair

from deniable.aggregator import AggregatorConfig, start_aggregator
from deniable.core.batches import batch_digest
from deniable.core.crypto import PublicKey, seal_report
from deniable.core.plumbing.service import insecure_channel
from deniable.core.wire import Plaintext, encode, new_report_id
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc

LIMIT = 3
EXTRA = 5


def _report(campaign: pb.Campaign) -> pb.EncryptedReport:
    plaintext = encode(
        Plaintext(new_report_id(), campaign.id, campaign.key_id, b"\x01"), campaign.plaintext_length
    )
    ciphertext = seal_report(
        plaintext, PublicKey(campaign.key_id, campaign.public_key), campaign.id, campaign.incarnation
    )
    return pb.EncryptedReport(campaign_id=campaign.id, key_id=campaign.key_id, ciphertext=ciphertext)


def _gated(target: Any, name: str, gate: asyncio.Event, entered: list[int]) -> None:
    """Hold every call of ``target.name`` until ``gate`` opens."""
    original: Callable[..., Awaitable[Any]] = getattr(target, name)

    async def held(*args: Any, **kwargs: Any) -> Any:
        entered.append(1)
        await gate.wait()
        return await original(*args, **kwargs)

    setattr(target, name, held)


async def _saturate(
    calls: Sequence[Awaitable[Any]], gate: asyncio.Event, entered: list[int]
) -> list[grpc.StatusCode]:
    """Start every call; once LIMIT are inside and the rest answered, open the gate."""
    tasks = [asyncio.ensure_future(c) for c in calls]

    async def code(task: asyncio.Future[Any]) -> grpc.StatusCode:
        try:
            await task
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        return grpc.StatusCode.OK

    codes = [asyncio.ensure_future(code(t)) for t in tasks]
    for _ in range(500):
        if len(entered) == LIMIT and sum(c.done() for c in codes) == len(calls) - LIMIT:
            break
        await asyncio.sleep(0.01)
    gate.set()
    return list(await asyncio.gather(*codes))


async def _healthy(channel: grpc.aio.Channel) -> None:
    answer = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


async def test_aggregator_sheds_load_and_counts_only_admitted(tmp_path: Path) -> None:
    aggregator = await start_aggregator(
        AggregatorConfig(
            insecure=True, data_dir=tmp_path / "agg", listen="127.0.0.1:0", max_concurrent_rpcs=LIMIT
        )
    )
    try:
        async with insecure_channel(aggregator.address) as channel:
            stub = pb_grpc.AggregatorStub(channel)
            request = pb.CreateCampaignRequest(id="shed", question="q", kind=pb.BINARY, epsilon0=1.0, n_min=2)
            campaign = await stub.CreateCampaign(request, timeout=10)
            gate, entered = asyncio.Event(), list[int]()
            _gated(aggregator.handlers, "ingest_batch", gate, entered)
            batches = []
            for i in range(LIMIT + EXTRA):
                reports = [_report(campaign) for _ in range(2)]
                digest = batch_digest(r.ciphertext for r in reports)
                batches.append(
                    pb.ShuffledBatch(batch_id=f"b{i}", campaign_id="shed", reports=reports, digest=digest)
                )
            codes = await _saturate([stub.IngestBatch(b, timeout=20) for b in batches], gate, entered)
            assert codes.count(grpc.StatusCode.OK) == LIMIT
            assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == EXTRA
            assert (await aggregator.store.snapshot("shed", 2)).n == 2 * LIMIT  # shed batches: nothing
            await _healthy(channel)
    finally:
        await aggregator.stop(grace=1.0)


async def test_shuffler_sheds_load_and_spools_only_admitted(tmp_path: Path) -> None:
    aggregator, shuffler = await start_insecure_pair(tmp_path, quota_per_source=0, max_concurrent_rpcs=LIMIT)
    try:
        async with insecure_channel(aggregator.address) as agg, insecure_channel(shuffler.address) as shuf:
            request = pb.CreateCampaignRequest(
                id="shed", question="q", kind=pb.BINARY, epsilon0=1.0, n_min=1000
            )
            campaign = await pb_grpc.AggregatorStub(agg).CreateCampaign(request, timeout=10)
            stub = pb_grpc.ShufflerStub(shuf)
            gate, entered = asyncio.Event(), list[int]()
            _gated(shuffler.handlers, "_append", gate, entered)
            calls = [
                stub.SubmitReports(pb.SubmitReportsRequest(reports=[_report(campaign)]), timeout=20)
                for _ in range(LIMIT + EXTRA)
            ]
            codes = await _saturate(calls, gate, entered)
            assert codes.count(grpc.StatusCode.OK) == LIMIT
            assert codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED) == EXTRA
            assert shuffler.handlers.store.pending_count("shed") == LIMIT  # only acknowledged reports
            await _healthy(shuf)
    finally:
        await shuffler.stop(grace=1.0)
        await aggregator.stop(grace=1.0)
