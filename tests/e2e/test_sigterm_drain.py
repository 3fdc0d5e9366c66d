"""SIGTERM under load: each service (a separate OS process) exits 0 within 10 s while devices and the
shuffler keep calling, and no acknowledged report is lost: after restarts everything acknowledged
is counted exactly once (in-flight work is drained or, unacknowledged, re-sent and re-queued)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc

from deniable.core.crypto import PublicKey, seal_report
from deniable.core.plumbing.service import insecure_channel
from deniable.core.wire import Plaintext, encode, new_report_id
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc

SCRIPT = (
    "import asyncio, sys\n"
    "from pathlib import Path\n"
    "from deniable.aggregator import AggregatorConfig, serve_aggregator\n"
    "from deniable.shuffler import ShufflerConfig, start_shuffler\n"
    "from deniable.core.plumbing.service import run_until_signalled\n"
    "kind, data, listen, port_file = sys.argv[1:5]\n"
    "async def shuffler():\n"
    "    r = await start_shuffler(ShufflerConfig(insecure=True, data_dir=Path(data), upstream=sys.argv[5],\n"
    "        listen=listen, quota_per_source=0, batch_interval_s=0.05, retry_base_s=0.05, retry_max_s=0.2))\n"
    "    Path(port_file).write_text(str(r.port))\n"
    "    await run_until_signalled(r.stop)\n"
    "if kind == 'aggregator':\n"
    "    config = AggregatorConfig(insecure=True, data_dir=Path(data), listen=listen)\n"
    "    asyncio.run(serve_aggregator(config, lambda r: Path(port_file).write_text(str(r.port))))\n"
    "else:\n"
    "    asyncio.run(shuffler())\n"
)
N_MIN = 20


def _start(tmp: Path, kind: str, listen: str, *upstream: str) -> tuple[subprocess.Popen[bytes], str]:
    port_file = tmp / f"{kind}.port"
    port_file.unlink(missing_ok=True)
    process = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, kind, str(tmp / kind), listen, str(port_file), *upstream]
    )
    deadline = time.monotonic() + 60
    while not port_file.exists() or not port_file.read_text():
        assert process.poll() is None and time.monotonic() < deadline, f"{kind} did not start"
        time.sleep(0.05)
    return process, f"127.0.0.1:{port_file.read_text()}"


def _restart(tmp: Path, kind: str, address: str, *upstream: str) -> subprocess.Popen[bytes]:
    """Start again on the same data and port (the old port may linger briefly: retried)."""
    for _ in range(50):
        try:
            return _start(tmp, kind, address, *upstream)[0]
        except AssertionError:
            time.sleep(0.2)
    raise AssertionError(f"{kind} did not restart")


def _terminate(process: subprocess.Popen[bytes]) -> float:
    started = time.monotonic()
    process.terminate()
    assert process.wait(timeout=10) == 0
    return time.monotonic() - started


class Devices(threading.Thread):
    """Devices submitting to the shuffler as fast as it answers; counts acknowledged reports."""

    def __init__(self, address: str, campaign: pb.Campaign) -> None:
        super().__init__(daemon=True)
        self.address, self.campaign = address, campaign
        self.acked = 0
        self.unknown = 0  # reports of calls that failed after the shuffler may have spooled them
        self.stop = threading.Event()

    def run(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        c = self.campaign
        key = PublicKey(c.key_id, c.public_key)
        async with insecure_channel(self.address) as channel:
            stub = pb_grpc.ShufflerStub(channel)
            while not self.stop.is_set():
                reports = [
                    pb.EncryptedReport(
                        campaign_id=c.id,
                        key_id=c.key_id,
                        ciphertext=seal_report(
                            encode(Plaintext(new_report_id(), c.id, c.key_id, b"\x01"), c.plaintext_length),
                            key,
                            c.id,
                            c.incarnation,
                        ),
                    )
                    for _ in range(10)
                ]
                try:
                    response = await stub.SubmitReports(pb.SubmitReportsRequest(reports=reports), timeout=5)
                except grpc.aio.AioRpcError as exc:
                    if exc.code() != grpc.StatusCode.UNAVAILABLE:  # e.g. cut off mid-call
                        self.unknown += len(reports)
                    await asyncio.sleep(0.05)  # the shuffler is stopping or down: nothing acknowledged
                    continue
                self.acked += response.accepted


async def _counted(address: str, shuffler: str, expected: int) -> int:
    """Flush the shuffler (below n_min too) until the aggregator has counted ``expected`` (or 60 s)."""
    async with insecure_channel(address) as agg, insecure_channel(shuffler) as shuf:
        # The operator authorises the last, smaller batch (the aggregator refuses it otherwise).
        release = pb.ReleaseBelowNMinRequest(campaign_id="drain")
        await pb_grpc.AggregatorStub(agg).ReleaseBelowNMin(release, timeout=10)
        n = 0
        for _ in range(600):
            await pb_grpc.ShufflerStub(shuf).Flush(
                pb.FlushRequest(campaign_id="drain", below_n_min=True), timeout=20
            )
            try:
                answer = await pb_grpc.AggregatorStub(agg).BinarySum(
                    pb.QueryRequest(campaign_id="drain"), timeout=10
                )
            except grpc.aio.AioRpcError:  # nothing counted yet
                await asyncio.sleep(0.1)
                continue
            n = answer.n
            if n >= expected:
                return n
            await asyncio.sleep(0.1)
        return n


def _create(address: str) -> pb.Campaign:
    async def create() -> pb.Campaign:
        async with insecure_channel(address) as channel:
            request = pb.CreateCampaignRequest(
                id="drain", question="q", kind=pb.BINARY, epsilon0=1.0, n_min=N_MIN
            )
            return await pb_grpc.AggregatorStub(channel).CreateCampaign(request, timeout=10)

    return asyncio.run(create())


def test_sigterm_under_load_exits_in_10s_and_loses_nothing(tmp_path: Path) -> None:
    aggregator, agg_address = _start(tmp_path, "aggregator", "127.0.0.1:0")
    shuffler, shuf_address = _start(tmp_path, "shuffler", "127.0.0.1:0", agg_address)
    devices = Devices(shuf_address, _create(agg_address))
    try:
        devices.start()
        time.sleep(1.5)  # devices submitting, the shuffler forwarding batches of N_MIN
        assert _terminate(shuffler) < 10
        shuffler = _restart(tmp_path, "shuffler", shuf_address, agg_address)
        time.sleep(1.0)
        assert _terminate(aggregator) < 10  # while the shuffler forwards to it
        time.sleep(0.5)
        aggregator = _restart(tmp_path, "aggregator", agg_address)
        time.sleep(1.0)
        devices.stop.set()
        devices.join(timeout=20)
        assert devices.acked > N_MIN
        counted = asyncio.run(_counted(agg_address, shuf_address, devices.acked))
        # Nothing acknowledged lost; nothing counted beyond what may have been spooled (no double count).
        assert devices.acked <= counted <= devices.acked + devices.unknown, (
            counted,
            devices.acked,
            devices.unknown,
        )
    finally:
        devices.stop.set()
        for process in (shuffler, aggregator):
            process.kill()
            process.wait(timeout=10)
