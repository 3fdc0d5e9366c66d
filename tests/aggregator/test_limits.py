"""Issue 10: bounded work for CreateCampaign. Values that would cost unbounded time or memory, or
break a later query, are INVALID_ARGUMENT stating the limit; planning runs in a process that is
killed at the caller's deadline, and SIGTERM stops an aggregator that is planning within 10 s."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest

from deniable.aggregator import AggregatorConfig, start_aggregator
from deniable.aggregator.campaigns import MAX_EXPECTED_N, MIN_EPSILON0
from deniable.aggregator.handlers import AggregatorHandlers
from deniable.core.accounting import planner
from deniable.core.errors import InvalidRequest
from deniable.core.plumbing.service import insecure_channel
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc

if TYPE_CHECKING:  # the kit fixture's type only
    from support.aggregator_kit import Kit

SLOW_PLAN: dict[str, Any] = {"target_epsilon": 1.0, "expected_n": 10**8, "epsilon0": 0.0}


@pytest.mark.parametrize(
    ("fields", "limit"),
    [
        ({"target_epsilon": 1.0, "expected_n": 10**12, "epsilon0": 0.0}, "1e+09"),
        ({"target_epsilon": 1.0, "expected_n": 2**64 - 1, "epsilon0": 0.0}, "1e+09"),
        ({"target_epsilon": 1e-9, "expected_n": 1000, "epsilon0": 0.0}, "[0.001, 20]"),
        ({"epsilon0": 1e-300}, "[0.001, 20]"),
        ({"epsilon0": 1e-9}, "[0.001, 20]"),
    ],
)
async def test_out_of_range_campaigns_are_refused_stating_the_limit(
    handlers: AggregatorHandlers, kit: Kit, fields: dict[str, float], limit: str
) -> None:
    started = time.monotonic()
    with pytest.raises(InvalidRequest) as err:
        await handlers.create_campaign(kit.binary_request(**fields))
    assert limit in str(err.value)
    assert time.monotonic() - started < 5  # refused up front, not after planning
    assert await handlers.store.list_campaigns() == []


@pytest.mark.parametrize("mechanism", [pb.BINARY_RR, pb.GRR])
async def test_the_smallest_allowed_epsilon0_still_answers_queries(
    handlers: AggregatorHandlers, kit: Kit, mechanism: pb.Mechanism
) -> None:
    """The lower limit is where queries still work (1e-300 used to give ZeroDivisionError later)."""
    campaign = await handlers.create_campaign(kit.binary_request(epsilon0=MIN_EPSILON0, mechanism=mechanism))
    sealed = [kit.seal(campaign, i % 2) for i in range(50)]
    await handlers.ingest_batch(kit.batch_of(campaign.id, [s.report for s in sealed], "b"))
    answer = await handlers.query(pb.QueryRequest(campaign_id=campaign.id), binary=True)
    assert answer.n == 50 and answer.privacy.epsilon0 == MIN_EPSILON0


def test_limits_agree_with_the_cli() -> None:
    from deniable.admin import privacy  # the CLI's limits (cli/cmd_privacy.py imports them)

    assert MAX_EXPECTED_N == planner.MAX_N == privacy.MAX_N
    assert planner.MAX_DOMAIN == privacy.MAX_DOMAIN


def _planners() -> list[multiprocessing.process.BaseProcess]:
    return [p for p in multiprocessing.active_children() if p.is_alive()]


async def test_planning_stops_when_the_callers_deadline_passes(tmp_path: Path, kit: Kit) -> None:
    aggregator = await start_aggregator(
        AggregatorConfig(insecure=True, data_dir=tmp_path / "agg", listen="127.0.0.1:0")
    )
    try:
        async with insecure_channel(aggregator.address) as channel:
            stub = pb_grpc.AggregatorStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.CreateCampaign(kit.binary_request(**SLOW_PLAN), timeout=2.0)
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            deadline = time.monotonic() + 3.0
            while _planners() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert _planners() == []  # the planning process was killed, not left computing
            keys = await stub.ListKeys(pb.ListKeysRequest(), timeout=5)  # and the service answers
            assert len(keys.keys) == 1
    finally:
        await aggregator.stop(grace=1)


def test_sigterm_stops_a_planning_aggregator_within_10_s(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    script = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from deniable.aggregator import AggregatorConfig, serve_aggregator\n"
        "config = AggregatorConfig(insecure=True, data_dir=Path(sys.argv[1]), listen='127.0.0.1:0')\n"
        "asyncio.run(serve_aggregator(config, lambda r: Path(sys.argv[2]).write_text(str(r.port))))\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "agg"), str(port_file)])
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text():
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        address = f"127.0.0.1:{port_file.read_text()}"

        def plan() -> None:
            async def call() -> None:
                async with insecure_channel(address) as channel:
                    request = pb.CreateCampaignRequest(id="big", question="q", kind=pb.BINARY, **SLOW_PLAN)
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await pb_grpc.AggregatorStub(channel).CreateCampaign(request, timeout=300)

            asyncio.run(call())

        caller = threading.Thread(target=plan, daemon=True)
        caller.start()
        time.sleep(2.0)  # planning is under way
        started = time.monotonic()
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=10)
        assert time.monotonic() - started < 10
        caller.join(timeout=10)
    finally:
        child.kill()
