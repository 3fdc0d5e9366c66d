"""Issues 16 and 10: starting, restarting and refusing services as an operator meets them.

Restart on the same port right after SIGKILL, one service per port and per data directory, one-line
exit 2 for bad addresses, nothing left behind by a failed start, INVALID_ARGUMENT for malformed
protobuf on every method, Watch streams that cannot freeze a service, and a quiet broken pipe.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.processes import free_port

from deniable.aggregator import AggregatorConfig, start_aggregator
from deniable.core.plumbing.service import insecure_channel
from deniable.shuffler import ShufflerConfig, start_shuffler
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc

CLI = [sys.executable, "-m", "deniable.cli"]


def _serve_aggregator(data_dir: Path, port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            *CLI,
            "aggregator",
            "serve",
            "--insecure",
            "--data-dir",
            str(data_dir),
            "--listen",
            f"127.0.0.1:{port}",
            "--decrypt-workers",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_serving(port: int, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    """Until the health service answers SERVING; AssertionError with stderr if the process exits."""

    async def check() -> bool:
        async with insecure_channel(f"127.0.0.1:{port}") as channel:
            try:
                reply = await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(service=""), timeout=1
                )
            except grpc.aio.AioRpcError:
                return False
            return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        if asyncio.run(check()):
            return
        time.sleep(0.1)
    raise AssertionError("never SERVING")


def _one_line_exit_2(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    _, err = proc.communicate(timeout=timeout)
    lines = err.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, err)
    return lines[0]


def _connected_clients(port: int) -> list[grpc.Channel]:
    """Channels that made a call and stay open: at a kill the server closes first, so its side of
    each connection waits in TIME_WAIT once the client closes too (what a crash leaves behind)."""
    channels = [grpc.insecure_channel(f"127.0.0.1:{port}") for _ in range(3)]
    for channel in channels:
        pb_grpc.AggregatorStub(channel).ListKeys(pb.ListKeysRequest(), timeout=10)
    return channels


def test_restart_on_the_same_port_right_after_sigkill_succeeds_first_time(tmp_path: Path) -> None:
    """Without SO_REUSEADDR on the probe the restart exits 2 ("address in use") during TIME_WAIT."""
    port = free_port()
    first = _serve_aggregator(tmp_path / "agg", port)
    try:
        _wait_serving(port, first)
        clients = _connected_clients(port)
        first.kill()
        first.wait(timeout=10)
        time.sleep(0.5)  # the clients see the connections end
        for client in clients:
            client.close()
        second = _serve_aggregator(tmp_path / "agg", port)
        try:
            _wait_serving(port, second)
        finally:
            second.terminate()
            second.wait(timeout=20)
    finally:
        first.kill()


def test_a_second_service_on_a_live_port_exits_2(tmp_path: Path) -> None:
    port = free_port()
    first = _serve_aggregator(tmp_path / "one", port)
    try:
        _wait_serving(port, first)
        line = _one_line_exit_2(_serve_aggregator(tmp_path / "two", port))
        assert "cannot listen on" in line
        assert not (tmp_path / "two").exists()  # and the failed start left nothing behind
    finally:
        first.terminate()
        first.wait(timeout=20)


def test_two_services_on_one_data_directory_are_refused(tmp_path: Path) -> None:
    port = free_port()
    first = _serve_aggregator(tmp_path / "agg", port)
    try:
        _wait_serving(port, first)
        line = _one_line_exit_2(_serve_aggregator(tmp_path / "agg", free_port()))
        assert "in use by another service" in line and str(first.pid) in line
        shuffler = subprocess.Popen(
            [
                *CLI,
                "shuffler",
                "serve",
                "--insecure",
                "--data-dir",
                str(tmp_path / "agg"),
                "--listen",
                "127.0.0.1:0",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert "in use by another service" in _one_line_exit_2(shuffler)
    finally:
        first.terminate()
        first.wait(timeout=20)


@pytest.mark.parametrize(
    ("service", "listen"),
    [("aggregator", "127.0.0.1:99999"), ("shuffler", "127.0.0.1:99999"), ("aggregator", "127.0.0.1:http")],
)
def test_bad_listen_address_is_one_line_exit_2_and_leaves_nothing(
    tmp_path: Path, service: str, listen: str
) -> None:
    proc = subprocess.Popen(
        [*CLI, service, "serve", "--insecure", "--data-dir", str(tmp_path / "data"), "--listen", listen],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert "cannot listen on" in _one_line_exit_2(proc)
    assert not (tmp_path / "data").exists()


async def test_a_failed_start_in_an_existing_directory_removes_only_what_it_created(tmp_path: Path) -> None:
    data = tmp_path / "agg"
    data.mkdir()
    (data / "operator-notes.txt").write_text("keep me")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(Exception, match="cannot listen"):
            await start_aggregator(AggregatorConfig(insecure=True, data_dir=data, listen=f"127.0.0.1:{port}"))
    assert sorted(p.name for p in data.iterdir()) == ["operator-notes.txt"]


def _methods(service: str) -> list[str]:
    descriptor = pb.DESCRIPTOR.services_by_name[service]
    return [f"/deniable.v1.{service}/{m.name}" for m in descriptor.methods if not m.client_streaming]


GARBAGE = (b"\xff\xff\xff\xff\xff", b"\x0a\xff\xff\xff\xff\x0f", b"\x08")


async def test_malformed_protobuf_on_every_method_is_invalid_argument(tmp_path: Path) -> None:
    aggregator = await start_aggregator(
        AggregatorConfig(insecure=True, data_dir=tmp_path / "agg", listen="127.0.0.1:0")
    )
    shuffler = await start_shuffler(
        ShufflerConfig(
            insecure=True, data_dir=tmp_path / "shuf", upstream=aggregator.address, listen="127.0.0.1:0"
        )
    )
    try:
        for address, service in ((aggregator.address, "Aggregator"), (shuffler.address, "Shuffler")):
            async with insecure_channel(address) as channel:
                for method in [*_methods(service), "/grpc.health.v1.Health/Check"]:
                    call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
                        method, request_serializer=None, response_deserializer=None
                    )
                    for garbage in GARBAGE:
                        with pytest.raises(grpc.aio.AioRpcError) as err:
                            await call(garbage, timeout=10)
                        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, garbage)
                        assert "Error" not in (err.value.details() or ""), err.value.details()
        assert 'deniable_aggregator_malformed_requests_total{rpc="ListKeys"} 3.0' in (
            aggregator.metrics.exposition().decode()
        )
    finally:
        await shuffler.stop(grace=1)
        await aggregator.stop(grace=1)


async def test_cancelled_watch_streams_do_not_freeze_the_service(tmp_path: Path) -> None:
    """Issue 10: six cancelled Watch streams froze the sync health servicer inside the aio server."""
    aggregator = await start_aggregator(
        AggregatorConfig(insecure=True, data_dir=tmp_path / "agg", listen="127.0.0.1:0")
    )
    try:
        async with insecure_channel(aggregator.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for _ in range(3):
                streams = [health.Watch(health_pb2.HealthCheckRequest(service="")) for _ in range(6)]
                for stream in streams:
                    await asyncio.wait_for(stream.read(), 10)
                    stream.cancel()
            reply = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            keys = await pb_grpc.AggregatorStub(channel).ListKeys(pb.ListKeysRequest(), timeout=5)
            assert len(keys.keys) == 1
    finally:
        started = time.monotonic()
        await aggregator.stop(grace=5)
        assert time.monotonic() - started < 10


def test_query_into_a_closed_pipe_has_no_traceback(tmp_path: Path) -> None:
    port = free_port()
    server = _serve_aggregator(tmp_path / "agg", port)
    try:
        _wait_serving(port, server)
        address = f"127.0.0.1:{port}"
        labels = ",".join(f"label{i}" for i in range(2000))  # output larger than any pipe buffer
        created = subprocess.run(
            [
                *CLI,
                "campaign",
                "create",
                "--insecure",
                "--aggregator",
                address,
                "--id",
                "c",
                "--question",
                "q",
                "--kind",
                "categorical",
                "--labels",
                labels,
                "--epsilon0",
                "1",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert created.returncode == 0, created.stderr
        for extra in ([], ["--json"]):
            query = subprocess.Popen(
                [*CLI, "query", "histogram", "c", "--insecure", "--aggregator", address, *extra],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            assert query.stdout is not None and query.stderr is not None
            query.stdout.close()  # the reader is gone, as after ``| head -1``
            err = query.stderr.read().decode()
            query.wait(timeout=60)
            assert "Traceback" not in err and "BrokenPipe" not in err, err
            assert query.returncode == 141
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=20)
    assert os.path.exists(tmp_path / "agg")


@pytest.mark.parametrize(
    "arguments",
    [
        ["privacy", "amplify", "--mechanism", "grr", "--epsilon0", "1", "--n", "1e14"],
        ["privacy", "plan", "--target-epsilon", "1", "--n", "100000000000000", "--domain", "2"],
        ["privacy", "profile", "--mechanism", "grr", "--epsilon0", "1", "--n", "1e12"],
        ["privacy", "amplify", "--mechanism", "grr", "--epsilon0", "1", "--n", "1000", "--domain", "99999"],
    ],
)
def test_unbounded_privacy_commands_are_one_line_exit_2(arguments: list[str]) -> None:
    """Issue 10: ``privacy amplify --n 1e14`` died with a raw MemoryError at 5.2 GB."""
    result = subprocess.run([*CLI, *arguments], capture_output=True, text=True, timeout=60, check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "supported maximum" in lines[0] and "Error" not in lines[0]
