"""Issue 16: decrypt workers die with the aggregator, a dead worker is healed (its batch retried and
counted once), and health is NOT_SERVING while the pool cannot be rebuilt or the store is down."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from deniable.aggregator import AggregatorConfig, RunningAggregator, start_aggregator
from deniable.core.plumbing.service import insecure_channel
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc

if TYPE_CHECKING:  # fixture types only
    from support.aggregator_kit import Kit
    from support.postgres_server import PostgresServer

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _health(address: str) -> int:
    async with insecure_channel(address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="deniable.v1.Aggregator"), timeout=10
        )
        return int(reply.status)


async def _until(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (Linux /proc)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        current = todo.pop()
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in found:
                    found.add(child)
                    todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigkilled_aggregator_leaves_no_worker_alive(tmp_path: Path) -> None:
    """Without ``die_with_parent`` in the pool's initializer the spawned workers outlive a SIGKILL."""
    script = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from deniable.aggregator import AggregatorConfig, start_aggregator\n"
        "async def main():\n"
        "    await start_aggregator(AggregatorConfig(insecure=True, data_dir=Path(sys.argv[1]),"
        " listen='127.0.0.1:0', decrypt_workers=2))\n"
        "    print('up', flush=True)\n"
        "    await asyncio.Event().wait()\n"
        "asyncio.run(main())\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "agg")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "up"
        workers = _descendants(child.pid)
        assert len(workers) >= 2, workers  # two decrypt workers (and multiprocessing's helper)
        child.kill()
        child.wait(timeout=10)
        time.sleep(1.0)
        assert [pid for pid in workers if _alive(pid)] == []
    finally:
        child.kill()


def test_die_with_parent_exits_when_the_parent_dies() -> None:
    """The watcher alone (no PR_SET_PDEATHSIG) notices the parent's death: a portable fallback."""
    script = (
        "import multiprocessing as mp, os, sys, time\n"
        "from deniable.core.plumbing import process\n"
        "def child(parent):\n"
        "    process._set_pdeathsig = lambda sig: False  # as on a kernel without prctl\n"
        "    process.die_with_parent(parent, interval=0.05)\n"
        "    time.sleep(60)\n"
        "if __name__ == '__main__':\n"
        "    p = mp.get_context('spawn').Process(target=child, args=(os.getpid(),))\n"
        "    p.start(); print(p.pid, flush=True); time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        worker = int(parent.stdout.readline())
        time.sleep(0.5)
        parent.kill()
        parent.wait(timeout=10)
        deadline = time.monotonic() + 1.0
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker)
    finally:
        parent.kill()


async def _started(tmp_path: Path, workers: int = 2, **overrides: Any) -> RunningAggregator:
    config = AggregatorConfig(
        insecure=True,
        data_dir=tmp_path / "agg",
        listen="127.0.0.1:0",
        decrypt_workers=workers,
        health_interval_s=0.1,
    )
    for key, value in overrides.items():
        setattr(config, key, value)
    return await start_aggregator(config)


def _workers(running: RunningAggregator) -> list[int]:
    assert running.executor is not None
    return list(running.executor.executor._processes)  # type: ignore[attr-defined]


async def test_a_worker_killed_mid_batch_is_replaced_and_every_report_counted_once(
    tmp_path: Path, kit: Kit
) -> None:
    running = await _started(tmp_path)
    try:
        async with insecure_channel(running.address) as channel:
            stub = pb_grpc.AggregatorStub(channel)
            campaign = await stub.CreateCampaign(kit.binary_request(), timeout=10)
            sealed = [kit.seal(campaign, i % 2) for i in range(6000)]
            batches = [
                kit.batch_of(campaign.id, [s.report for s in sealed[i : i + 1500]], f"b{i}")
                for i in range(0, 6000, 1500)
            ]
            calls = [asyncio.ensure_future(stub.IngestBatch(b, timeout=60)) for b in batches]
            await asyncio.sleep(0.15)  # decryption under way
            os.kill(_workers(running)[0], signal.SIGKILL)
            outcomes = await asyncio.gather(*calls)
            again = [await stub.IngestBatch(b, timeout=60) for b in batches]  # resent: counted once
            answer = await stub.BinarySum(pb.QueryRequest(campaign_id=campaign.id), timeout=10)
        assert sum(o.counted for o in outcomes) == 6000
        assert all(a.duplicate_batch for a in again)
        assert answer.n == 6000 and answer.rejected == 0
        assert [b.raw_count for b in answer.buckets] == [
            sum(s.payload == bytes([v]) for s in sealed) for v in (0, 1)
        ]
        assert running.metrics.pool_rebuilds._value.get() >= 1
        assert await _health(running.address) == SERVING
    finally:
        await running.stop(grace=1.0)


async def test_a_worker_that_dies_while_idle_is_replaced_before_the_next_batch(tmp_path: Path) -> None:
    running = await _started(tmp_path)
    try:
        before = _workers(running)
        os.kill(before[0], signal.SIGKILL)
        deadline = time.monotonic() + 20
        while running.metrics.pool_rebuilds._value.get() < 1:
            assert time.monotonic() < deadline, "the idle pool was not rebuilt"
            await asyncio.sleep(0.05)
        assert set(_workers(running)).isdisjoint(before)
        assert await _health(running.address) == SERVING
    finally:
        await running.stop(grace=1.0)


async def test_a_pool_that_cannot_be_rebuilt_is_not_serving_then_recovers_by_itself(
    tmp_path: Path, kit: Kit, caplog: pytest.LogCaptureFixture
) -> None:
    running = await _started(tmp_path)
    pool = running.executor
    assert pool is not None
    working_factory = pool._factory

    def no_processes(workers: int) -> Any:
        raise OSError("out of process slots")

    try:
        async with insecure_channel(running.address) as channel:
            stub = pb_grpc.AggregatorStub(channel)
            campaign = await stub.CreateCampaign(kit.binary_request(), timeout=10)
            batch = kit.batch_of(campaign.id, [kit.seal(campaign, 1).report for _ in range(600)], "b1")
            pool._factory = no_processes
            for pid in _workers(running):
                os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.2)
            with caplog.at_level(logging.WARNING, logger="deniable"):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await stub.IngestBatch(batch, timeout=60)
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
                await _until(lambda: _is(running.address, NOT_SERVING))
            assert "cannot be restarted" in caplog.text
            gauge = running.monitor.unhealthy.labels(condition="decrypt_workers")._value.get()
            assert gauge == 1
            pool._factory = working_factory
            await _until(lambda: _is(running.address, SERVING))
            counted = await stub.IngestBatch(batch, timeout=60)  # the shuffler's retry
            assert counted.counted == 600
    finally:
        await running.stop(grace=1.0)


async def _is(address: str, status: int) -> bool:
    return await _health(address) == status


async def test_health_is_not_serving_while_postgresql_is_down(
    tmp_path: Path, postgres_server: PostgresServer, postgres_dsn: str
) -> None:
    running = await _started(tmp_path, workers=0, store=postgres_dsn)
    pg_ctl = ("pg_ctl", "-D", str(postgres_server.data), "-w", "-t", "60")
    try:
        assert await _health(running.address) == SERVING
        await asyncio.to_thread(postgres_server._run, *pg_ctl, "-m", "fast", "stop")
        try:
            await _until(lambda: _is(running.address, NOT_SERVING))
            assert running.monitor.unhealthy.labels(condition="store")._value.get() == 1
        finally:
            await asyncio.to_thread(postgres_server._run, *pg_ctl, "-l", str(postgres_server.log), "start")
        await _until(lambda: _is(running.address, SERVING), timeout=30)
        assert running.monitor.unhealthy.labels(condition="store")._value.get() == 0
    finally:
        await running.stop(grace=1.0)
