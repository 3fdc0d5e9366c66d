"""Forwarding under failure: retries keep the batch id, deletion waits for the ack, restarts lose nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.processes import free_port

from deniable.core.plumbing import service
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc


async def submit(shuffler, kit: SimpleNamespace, campaign: pb.Campaign, count: int, start: int = 0):
    reports = kit.make_reports(campaign, count, start=start)
    response = await shuffler.handlers.submit(pb.SubmitReportsRequest(reports=reports))
    assert response.accepted == count
    return [r.ciphertext for r in reports]


async def spool_of(shuffler) -> dict[str, tuple[int, int]]:
    stats = await shuffler.handlers.stats()
    return {c.campaign_id: (c.pending, c.in_flight) for c in stats.campaigns}


async def test_failed_batch_is_retried_with_the_same_id_and_deleted_only_after_ack(
    upstream, start, kit: SimpleNamespace
) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1", n_min=3, batch_target=3))
    upstream.fake.fail_next = 1_000
    shuffler = await start()
    sent = await submit(shuffler, kit, campaign, 3)
    await kit.eventually(lambda: len(upstream.fake.calls) >= 3)
    assert await spool_of(shuffler) == {"c1": (0, 3)}  # kept while the aggregator refuses
    # The fake records a call before the shuffler has handled its failure: wait for the metric too.
    failures = "deniable_shuffler_forward_failures_total"
    await kit.eventually(lambda: (shuffler.metrics.registry.get_sample_value(failures) or 0) >= 3)
    upstream.fake.fail_next = 0
    await kit.eventually(lambda: len(upstream.fake.acked) == 1)
    await kit.eventually(
        lambda: shuffler.metrics.registry.get_sample_value("deniable_shuffler_batches_forwarded_total") == 1
    )
    assert await spool_of(shuffler) == {}
    calls = upstream.fake.calls
    assert len({c.batch.batch_id for c in calls}) == 1
    assert all(c.batch == calls[0].batch for c in calls)  # same id, same order, same digest
    assert sorted(r.ciphertext for r in calls[-1].batch.reports) == sorted(sent)


async def test_failing_exactly_n_times(upstream, start, kit: SimpleNamespace) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1", n_min=2, batch_target=2))
    upstream.fake.fail_next = 3
    shuffler = await start()
    await submit(shuffler, kit, campaign, 2)
    await kit.eventually(lambda: len(upstream.fake.acked) == 1)
    assert [c.ok for c in upstream.fake.calls] == [False, False, False, True]
    await kit.eventually(
        lambda: shuffler.metrics.registry.get_sample_value("deniable_shuffler_batches_forwarded_total") == 1
    )
    assert await spool_of(shuffler) == {}


async def test_lost_acknowledgement_is_resent_and_acked_as_duplicate(
    upstream, start, kit: SimpleNamespace
) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1", n_min=2))
    upstream.fake.lose_next_responses = 1
    shuffler = await start()
    await submit(shuffler, kit, campaign, 2)
    first = await shuffler.flush()
    assert (first.batches_forwarded, first.reports_held) == (0, 2)
    second = await shuffler.flush()
    assert (second.batches_forwarded, second.reports_forwarded, second.reports_held) == (1, 2, 0)
    assert upstream.fake.duplicates == 1
    assert len({c.batch.batch_id for c in upstream.fake.calls}) == 1


async def test_starting_with_upstream_down_is_fine_and_flush_holds_everything(
    upstream, start, kit: SimpleNamespace
) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1", n_min=2))
    first = await start()
    await submit(first, kit, campaign, 3)
    await first.stop()
    second = await start(upstream="127.0.0.1:1")  # nothing listens on port 1
    response = await second.flush()
    assert (response.batches_forwarded, response.reports_forwarded, response.reports_held) == (0, 0, 3)
    assert await spool_of(second) == {"c1": (0, 3)}  # batched, waiting for the aggregator


async def test_reports_survive_a_stop_and_are_forwarded_by_the_next_shuffler(
    upstream, start, kit: SimpleNamespace
) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1", n_min=4, batch_target=4))
    first = await start(batch_interval_s=3600.0)  # no background round: everything stays spooled
    sent = await submit(first, kit, campaign, 6)
    await first.stop()
    assert upstream.fake.calls == []
    await start()
    await kit.eventually(lambda: sorted(upstream.fake.forwarded_ciphertexts()) == sorted(sent))


async def test_formed_but_unacknowledged_batch_is_resent_with_its_id_after_restart(
    upstream, start, kit: SimpleNamespace
) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1", n_min=3))
    upstream.fake.fail_next = 1_000
    first = await start()
    await submit(first, kit, campaign, 5)
    response = await first.flush()
    assert (response.batches_forwarded, response.reports_held) == (0, 5)
    formed = upstream.fake.calls[0].batch
    await first.stop()
    upstream.fake.fail_next = 0
    second = await start()
    await kit.eventually(lambda: len(upstream.fake.acked) == 1)
    assert upstream.fake.acked[0] == formed  # same id, same permuted order, same digest
    await kit.eventually(
        lambda: second.metrics.registry.get_sample_value("deniable_shuffler_batches_forwarded_total") == 1
    )
    assert await spool_of(second) == {}


async def test_restart_validates_from_the_cache_while_the_aggregator_is_down(
    upstream, start, kit: SimpleNamespace
) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1", n_min=100))
    first = await start()
    await submit(first, kit, campaign, 1)
    await first.stop()
    address = upstream.address
    await upstream.stop()
    second = await start(upstream=address)
    await submit(second, kit, campaign, 2, start=1)
    assert await spool_of(second) == {"c1": (3, 0)}
    relayed = await second.handlers.get_campaign("c1")
    assert relayed == campaign


async def test_stop_lets_an_in_flight_request_finish(
    upstream, start, channel_to, kit: SimpleNamespace
) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1", n_min=100))
    upstream.fake.get_campaign_delay_s = 0.4  # the first look-up is slow: the request is in flight
    shuffler = await start()
    stub = channel_to(shuffler)
    call = asyncio.ensure_future(
        stub.SubmitReports(pb.SubmitReportsRequest(reports=kit.make_reports(campaign, 2)), timeout=5)
    )
    await kit.eventually(lambda: upstream.fake.get_campaign_calls == ["c1"])
    await shuffler.stop(grace=5.0)
    assert (await call).accepted == 2


_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from deniable.shuffler.server import ShufflerConfig, serve_shuffler
    asyncio.run(serve_shuffler(ShufflerConfig(insecure=True,
        data_dir=Path(sys.argv[1]), upstream=sys.argv[2], listen=sys.argv[3], batch_interval_s=3600.0)))
    """
)


async def _start_child(data_dir: Path, upstream: str) -> tuple[asyncio.subprocess.Process, str]:
    address = f"127.0.0.1:{free_port()}"
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CHILD,
        str(data_dir),
        upstream,
        address,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    channel = service.insecure_channel(address)
    try:
        health = health_pb2_grpc.HealthStub(channel)
        for _ in range(300):
            try:
                reply = await health.Check(
                    health_pb2.HealthCheckRequest(service="deniable.v1.Shuffler"), timeout=1
                )
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return child, address
            except grpc.aio.AioRpcError:
                pass
            if child.returncode is not None:
                break
            await asyncio.sleep(0.05)
    finally:
        await channel.close()
    child.kill()
    raise AssertionError("child shuffler did not come up")


async def test_sigkill_after_ack_loses_nothing(tmp_path: Path, upstream, start, kit: SimpleNamespace) -> None:
    campaign = upstream.fake.add(kit.make_campaign("c1", n_min=5, batch_target=5))
    data_dir = tmp_path / "shuffler"
    child, address = await _start_child(data_dir, upstream.address)
    try:
        channel = service.insecure_channel(address)
        stub = deniable_pb2_grpc.ShufflerStub(channel)
        reports = kit.make_reports(campaign, 8)
        for report in reports:  # one acknowledged request at a time, then a crash
            assert (
                await stub.SubmitReports(pb.SubmitReportsRequest(reports=[report]), timeout=5)
            ).accepted == 1
        await channel.close()
    finally:
        os.kill(child.pid, signal.SIGKILL)
        await child.wait()
    assert upstream.fake.calls == []
    await start(data_dir=data_dir)
    expected = sorted(r.ciphertext for r in reports)
    await kit.eventually(lambda: sorted(upstream.fake.forwarded_ciphertexts()) == expected)


async def test_serve_shuffler_stops_cleanly_on_sigterm(tmp_path: Path, upstream) -> None:
    child, _ = await _start_child(tmp_path / "s", upstream.address)
    child.send_signal(signal.SIGTERM)
    try:
        code = await asyncio.wait_for(child.wait(), timeout=15)
    except TimeoutError:
        child.kill()
        raise
    assert child.stderr is not None
    stderr = (await child.stderr.read()).decode()
    assert code == 0, stderr


def test_the_ingest_deadline_grows_with_the_batch_so_large_chunks_are_not_cancelled_forever() -> None:
    """A fixed 30 s deadline cancelled (and resent, forever) chunks that take longer to decrypt on a
    loaded aggregator; the deadline now adds a per-byte allowance on top of ``deadline_s``."""
    from deniable.shuffler.forwarder import DECRYPT_BUDGET_S_PER_BYTE, Forwarder
    from deniable.shuffler.metrics import ShufflerMetrics

    forwarder = Forwarder(SimpleNamespace(), SimpleNamespace(), ShufflerMetrics(), deadline_s=30.0)  # type: ignore[arg-type]
    assert forwarder.deadline_for(0) == 30.0
    full_chunk = 48 * 1024 * 1024
    assert forwarder.deadline_for(full_chunk) == 30.0 + full_chunk * DECRYPT_BUDGET_S_PER_BYTE
    assert forwarder.deadline_for(full_chunk) > 200.0  # ≈ 10× one core's decrypt time for 48 MiB
