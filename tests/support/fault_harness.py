"""Whole-pipeline kill harness: device driver → proxy → shuffler → proxy → aggregator, each a real
OS process (``serve --insecure``: plaintext on loopback, TLS is not this harness's subject),
SIGKILLed at random times under load and restarted at once on the same data directory and port.
The proxies drop a random fraction of requests (before the server sees them) and of responses
(after the server acted). Afterwards the acknowledged report ids (device journal minus outbox,
decrypted with the aggregator's keyring) are compared with the report ids counted in the store.

Loopback only, bounded everywhere, stops by itself. Kill timing uses ``random`` seeded: test
scheduling only, never privacy noise.
"""

from __future__ import annotations

import asyncio
import os
import random as simulation_random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from deniable.aggregator.keys import Keyring
from deniable.aggregator.server import DATABASE_FILE
from deniable.core.crypto import open_report
from deniable.core.plumbing.service import insecure_channel
from deniable.core.wire import decode
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc
from support.processes import alive, children, free_port

CLI = [sys.executable, "-m", "deniable.cli"]
DEVICE = [sys.executable, str(Path(__file__).parents[1] / "fault" / "device.py")]
START_ATTEMPTS = 40
"""A restart that fails (e.g. the port is still held by the dead process) is retried this often."""


class HarnessError(Exception):
    """The harness could not do its job (a service never came back, the pipeline never drained)."""


async def health_answers(address: str) -> bool:
    """True if a health Check at ``address`` gets any answer (the server is listening)."""
    async with insecure_channel(address) as channel:
        try:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
        except grpc.aio.AioRpcError:
            return False
    return True


@dataclass
class Service:
    """One OS process restarted on the same argv (same port, same data); SIGKILLed on demand."""

    name: str
    argv: list[str]
    log: Path
    address: str | None = None
    process: subprocess.Popen[bytes] | None = None
    kills: int = 0
    start_retries: int = 0
    seen: set[int] = field(default_factory=set)

    async def start(self) -> None:
        """Start and wait until it answers health checks; an early exit is retried, not fatal."""
        for _ in range(START_ATTEMPTS):
            with self.log.open("ab") as log:
                self.process = subprocess.Popen(self.argv, stdout=log, stderr=log)
            self.seen.add(self.process.pid)
            if await self._ready(self.process):
                return
            self.start_retries += 1
            await asyncio.sleep(0.25)
        raise HarnessError(f"{self.name} did not start after {START_ATTEMPTS} attempts; see {self.log}")

    async def _ready(self, process: subprocess.Popen[bytes]) -> bool:
        if self.address is None:
            return True
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return False
            if await health_answers(self.address):
                self.seen |= children(process.pid)
                return True
            await asyncio.sleep(0.05)
        process.kill()
        process.wait()
        return False

    def running(self) -> bool:
        """True while the current process lives."""
        return self.process is not None and self.process.poll() is None

    async def kill_and_restart(self) -> None:
        """SIGKILL the process (its children die with it) and start it again at once."""
        assert self.process is not None
        self.seen |= children(self.process.pid)
        self.process.kill()
        self.process.wait(timeout=30)
        self.kills += 1
        await self.start()

    def kill_child(self, chooser: simulation_random.Random) -> bool:
        """SIGKILL one child process (a decrypt worker); False if it has none."""
        if not self.running():
            return False
        assert self.process is not None
        kids = sorted(children(self.process.pid))
        if not kids:
            return False
        self.seen |= set(kids)
        os.kill(chooser.choice(kids), signal.SIGKILL)
        return True

    def stop(self) -> None:
        """SIGTERM and wait (SIGKILL after 20 s)."""
        if self.running():
            assert self.process is not None
            self.seen |= children(self.process.pid)
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class DropProxy:
    """A TCP proxy on loopback that cuts a connection instead of relaying a chunk, with probability
    ``drop_request`` towards the server (the request is lost) or ``drop_response`` back (the server
    acted, the caller never hears)."""

    upstream_port: int
    drop_request: float
    drop_response: float
    chooser: simulation_random.Random
    port: int = 0
    dropped_requests: int = 0
    dropped_responses: int = 0
    _server: asyncio.Server | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = None
        for _ in range(40):  # hold the caller while the server restarts, rather than refuse at once
            try:
                upstream = await asyncio.open_connection("127.0.0.1", self.upstream_port)
                break
            except OSError:
                await asyncio.sleep(0.05)
        if upstream is None:
            writer.close()
            return
        up_reader, up_writer = upstream
        writers = (writer, up_writer)
        await asyncio.gather(
            self._pipe(reader, up_writer, writers, request=True),
            self._pipe(up_reader, writer, writers, request=False),
        )

    async def _pipe(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        writers: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
        request: bool,
    ) -> None:
        try:
            while data := await source.read(65536):
                if self.chooser.random() < (self.drop_request if request else self.drop_response):
                    if request:
                        self.dropped_requests += 1
                    else:
                        self.dropped_responses += 1
                    break
                sink.write(data)
                await sink.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        for w in writers:
            w.close()


@dataclass(frozen=True)
class Options:
    """One harness run."""

    kills: int = 24
    reports: int = 3000
    seed: int = 20261126
    drop_request: float = 0.02
    drop_response: float = 0.02
    gap_s: tuple[float, float] = (0.1, 0.5)
    n_min: int = 50
    drain_timeout_s: float = 180.0
    give_up_s: float = 900.0
    restart_s: float = 1.0
    """Rough cost of one restart here, to pace the device so that kills fall while it uploads."""

    def rate(self) -> float:
        """Reports per second that spread the upload over the whole kill schedule."""
        return self.reports / max(1.0, self.kills * (sum(self.gap_s) / 2 + self.restart_s))


@dataclass
class Summary:
    """What a run found; ``line()`` is the harness's last line."""

    kills: dict[str, int]
    acknowledged: int
    counted: int
    duplicates: int
    lost: int
    unknown: int
    unacknowledged: int
    start_retries: int
    dropped_requests: int
    dropped_responses: int
    orphans: int
    deduplicated: int = 0

    @property
    def total_kills(self) -> int:
        return sum(self.kills.values())

    def line(self) -> str:
        detail = " ".join(f"{k}:{v}" for k, v in self.kills.items())
        return (
            f"kills={self.total_kills} ({detail}) dropped_requests={self.dropped_requests}"
            f" dropped_responses={self.dropped_responses} restart_retries={self.start_retries}"
            f" resends_deduplicated={self.deduplicated}"
            f" acknowledged={self.acknowledged} counted={self.counted}"
            f" duplicates={self.duplicates} lost={self.lost}"
        )

    @property
    def ok(self) -> bool:
        return (
            self.acknowledged == self.counted
            and self.duplicates == 0
            and self.lost == 0
            and self.unknown == 0
            and self.orphans == 0
        )


@dataclass
class Pipeline:
    """The three processes, two proxies and their directories."""

    root: Path
    options: Options
    chooser: simulation_random.Random
    aggregator: Service = field(init=False)
    shuffler: Service = field(init=False)
    device: Service = field(init=False)
    to_shuffler: DropProxy = field(init=False)
    to_aggregator: DropProxy = field(init=False)
    campaign: pb.Campaign = field(default_factory=pb.Campaign)

    async def start(self) -> None:
        """Aggregator, proxy, shuffler, proxy, campaign, then the device driver."""
        self.root.mkdir(parents=True, exist_ok=True)
        agg_port, shuf_port = free_port(), free_port()
        self.aggregator = Service(
            "aggregator",
            [
                *CLI,
                "aggregator",
                "serve",
                "--insecure",
                "--data-dir",
                str(self.root / "agg"),
                "--listen",
                f"127.0.0.1:{agg_port}",
                "--decrypt-workers",
                "1",
            ],
            self.root / "aggregator.log",
            address=f"127.0.0.1:{agg_port}",
        )
        await self.aggregator.start()
        o = self.options
        self.to_aggregator = DropProxy(
            agg_port, o.drop_request, o.drop_response, simulation_random.Random(o.seed + 1)
        )
        await self.to_aggregator.start()
        self.shuffler = Service(
            "shuffler",
            [
                *CLI,
                "shuffler",
                "serve",
                "--insecure",
                "--data-dir",
                str(self.root / "shuf"),
                "--listen",
                f"127.0.0.1:{shuf_port}",
                "--upstream",
                self.to_aggregator.address,
                "--quota-per-source",
                "0",
            ],
            self.root / "shuffler.log",
            address=f"127.0.0.1:{shuf_port}",
        )
        await self.shuffler.start()
        self.to_shuffler = DropProxy(
            shuf_port, o.drop_request, o.drop_response, simulation_random.Random(o.seed + 2)
        )
        await self.to_shuffler.start()
        async with insecure_channel(self.aggregator.address or "") as channel:
            self.campaign = await pb_grpc.AggregatorStub(channel).CreateCampaign(
                pb.CreateCampaignRequest(
                    id="fault", question="q", kind=pb.BINARY, epsilon0=1.0, n_min=o.n_min
                ),
                timeout=30,
            )
        self.device = Service(
            "device",
            [
                *DEVICE,
                "--outbox",
                str(self.root / "outbox.sqlite3"),
                "--shuffler",
                self.to_shuffler.address,
                "--campaign",
                self.campaign.id,
                "--reports",
                str(o.reports),
                "--give-up-s",
                str(o.give_up_s),
                "--rate",
                str(o.rate()),
                "--chunk",
                str(max(20, o.reports // 200)),
            ],
            self.root / "device.log",
        )
        await self.device.start()

    def device_done(self) -> bool:
        """The driver exited 0: every report recorded and acknowledged."""
        process = self.device.process
        return process is not None and process.poll() == 0

    async def kill_one(self) -> str | None:
        """SIGKILL one process chosen at random and restart it; the kind killed, or None."""
        pick = self.chooser.random()
        if pick < 0.3:
            await self.aggregator.kill_and_restart()
            return "aggregator"
        if pick < 0.65:
            await self.shuffler.kill_and_restart()
            return "shuffler"
        if pick < 0.9:
            if not self.device.running():
                return None
            await self.device.kill_and_restart()
            return "device"
        return "worker" if self.aggregator.kill_child(self.chooser) else None

    async def drain(self) -> None:
        """Wait for the device to finish, then flush the shuffler until nothing is held."""
        deadline = time.monotonic() + self.options.give_up_s
        while not self.device_done():
            code = None if self.device.process is None else self.device.process.poll()
            if code == 2:
                raise HarnessError(f"the device driver failed; see {self.device.log}")
            if code not in (None, 0):
                await self.device.start()  # it gave up (bounded); give it another go
            if time.monotonic() > deadline:
                raise HarnessError("the device never got every report acknowledged")
            await asyncio.sleep(0.2)
        deadline = time.monotonic() + self.options.drain_timeout_s
        while time.monotonic() < deadline:
            try:
                async with insecure_channel(self.aggregator.address or "") as channel:
                    # the operator's recorded authorisation for a last batch below n_min (as `flush` does)
                    await pb_grpc.AggregatorStub(channel).ReleaseBelowNMin(
                        pb.ReleaseBelowNMinRequest(campaign_id=self.campaign.id), timeout=30
                    )
                async with insecure_channel(self.shuffler.address or "") as channel:
                    flushed = await pb_grpc.ShufflerStub(channel).Flush(
                        pb.FlushRequest(campaign_id=self.campaign.id, below_n_min=True), timeout=30
                    )
                if flushed.reports_held == 0 and flushed.reports_forwarded == 0:
                    return
            except grpc.aio.AioRpcError:
                pass
            await asyncio.sleep(0.3)
        raise HarnessError("the shuffler's spool never drained")

    async def stop(self) -> None:
        """Stop whatever was started (a failed start leaves some attributes unset)."""
        for name in ("device", "shuffler", "aggregator"):
            service = getattr(self, name, None)
            if service is not None:
                service.stop()
        for name in ("to_shuffler", "to_aggregator"):
            proxy = getattr(self, name, None)
            if proxy is not None:
                await proxy.close()


def acknowledged_ids(root: Path, campaign: pb.Campaign) -> tuple[set[bytes], int]:
    """Report ids of every journaled report no longer in the outbox; and how many are still queued."""
    keyring = Keyring.load_or_create(root / "agg", create=False)
    with sqlite3.connect(root / "outbox.sqlite3") as db:
        queued = {bytes(c) for (c,) in db.execute("SELECT ciphertext FROM outbox")}
        journal = [bytes(c) for (c,) in db.execute("SELECT ciphertext FROM journal")]
    ids: set[bytes] = set()
    for ciphertext in journal:
        if ciphertext in queued:
            continue
        key = keyring.get(campaign.key_id)
        assert key is not None
        plaintext = decode(
            open_report(ciphertext, key, campaign.id, campaign.incarnation), campaign.plaintext_length
        )
        ids.add(plaintext.report_id)
    return ids, len(queued)


def resends_dropped(root: Path, campaign_id: str) -> int:
    """Reports the aggregator refused as duplicates: resends that dedupe kept from counting twice."""
    with sqlite3.connect(root / "agg" / DATABASE_FILE) as db:
        row = db.execute(
            "SELECT sum(r.count) FROM rejections r JOIN campaigns c ON c.seq = r.campaign"
            " WHERE c.id = ? AND r.reason = ?",
            (campaign_id, pb.DUPLICATE_REPORT),
        ).fetchone()
    return int(row[0] or 0)


def counted_ids(root: Path, campaign_id: str) -> tuple[set[bytes], int]:
    """Report ids in the aggregator's dedupe table, and the campaign's counted total n."""
    with sqlite3.connect(root / "agg" / DATABASE_FILE) as db:
        seq, n = db.execute("SELECT seq, n FROM campaigns WHERE id = ?", (campaign_id,)).fetchone()
        ids = {
            bytes(r) for (r,) in db.execute("SELECT report_id FROM seen_reports WHERE campaign = ?", (seq,))
        }
        total = sum(c for (c,) in db.execute("SELECT count FROM counts WHERE campaign = ?", (seq,)))
    assert total == n, f"counts sum {total} != campaign n {n}"
    return ids, int(n)


async def run(root: Path, options: Options, progress: Callable[[str], None] | None = None) -> Summary:
    """One harness run: load, kills, drops, drain, then the identity comparison."""
    chooser = simulation_random.Random(options.seed)
    pipeline = Pipeline(root, options, chooser)
    kills = {"aggregator": 0, "shuffler": 0, "device": 0, "worker": 0}
    try:
        await pipeline.start()
        while sum(kills.values()) < options.kills and not pipeline.device_done():
            await asyncio.sleep(chooser.uniform(*options.gap_s))
            kind = await pipeline.kill_one()
            if kind is not None:
                kills[kind] += 1
                if progress is not None and sum(kills.values()) % 10 == 0:
                    progress(f"kills={sum(kills.values())} {kills}")
        await pipeline.drain()
    finally:
        await pipeline.stop()
    await asyncio.sleep(1.0)
    seen = pipeline.aggregator.seen | pipeline.shuffler.seen | pipeline.device.seen
    acked, queued = acknowledged_ids(root, pipeline.campaign)
    counted, n = counted_ids(root, pipeline.campaign.id)
    return Summary(
        kills=kills,
        acknowledged=len(acked),
        counted=n,
        duplicates=n - len(counted),
        lost=len(acked - counted),
        unknown=len(counted - acked),
        unacknowledged=queued,
        start_retries=sum(s.start_retries for s in (pipeline.aggregator, pipeline.shuffler, pipeline.device)),
        dropped_requests=pipeline.to_shuffler.dropped_requests + pipeline.to_aggregator.dropped_requests,
        dropped_responses=pipeline.to_shuffler.dropped_responses + pipeline.to_aggregator.dropped_responses,
        orphans=len([pid for pid in seen if alive(pid)]),
        deduplicated=resends_dropped(root, pipeline.campaign.id),
    )
