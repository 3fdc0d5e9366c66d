"""Soak: ``deniable loadtest`` at a steady rate against real services while they are SIGKILLed.

    nice -n 10 python -m tests.fault.soak --minutes 10 --rate 300

Every ``--kill-every`` seconds one of: the shuffler (restarted on its data and port), a decrypt
worker of the aggregator (the aggregator rebuilds its pool), or the aggregator itself. Every 2 s
it samples each service's RSS (its process tree) and open file descriptors; at the end it prints,
per service, the second-quarter and last-quarter medians and whether the last is within 20 % of
the second ("flat"), then the load test's acknowledged and counted totals. A restarted process
starts small, so medians mix fresh and old processes alike; a leak that survives restarts (files,
spool, sockets) or grows inside the long-lived aggregator process still shows. Exit 1 if anything
acknowledged was not counted, more was counted than sent, or a measure was not flat. (The load
test sends pre-sealed reports and keeps only counts; report-level identity is the harness's job.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random as simulation_random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from deniable.core.plumbing.service import insecure_channel
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc

sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/: where ``support`` lives
from support import fault_harness as harness
from support.processes import children, free_port


def _tree(pid: int) -> list[int]:
    return [pid, *sorted(children(pid))]


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and its descendants (bytes)."""
    total = 0
    for p in _tree(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def open_fds(pid: int) -> int:
    """Open file descriptors of ``pid`` and its descendants."""
    total = 0
    for p in _tree(pid):
        try:
            total += sum(1 for _ in Path(f"/proc/{p}/fd").iterdir())
        except OSError:
            continue
    return total


@dataclass
class Samples:
    """One service's RSS and fd samples over time."""

    rss: list[int] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)

    def add(self, service: harness.Service) -> None:
        if service.running():
            assert service.process is not None
            self.rss.append(rss_bytes(service.process.pid))
            self.fds.append(open_fds(service.process.pid))


def flatness(values: list[int], tolerance: float = 0.2) -> tuple[float, float, bool]:
    """(second-quarter median, last-quarter median, last within ``tolerance`` of second)."""
    q = len(values) // 4
    if q == 0:
        return 0.0, 0.0, False
    second = float(statistics.median(values[q : 2 * q]))
    last = float(statistics.median(values[3 * q :]))
    return second, last, last <= second * (1 + tolerance)


async def sending_started(shuffler: harness.Service, load: subprocess.Popen[bytes], deadline: float) -> float:
    """When the load test's first reports reached the shuffler (after it sealed them all)."""
    while time.monotonic() < deadline and load.poll() is None:
        try:
            async with insecure_channel(shuffler.address or "") as channel:
                stats = await pb_grpc.ShufflerStub(channel).Stats(pb.ShufflerStatsRequest(), timeout=5)
            if any(c.pending + c.in_flight for c in stats.campaigns):
                return time.monotonic()
        except grpc.aio.AioRpcError:
            pass
        await asyncio.sleep(0.5)
    raise harness.HarnessError("the load test never started sending")


async def soak(root: Path, minutes: float, rate: float, kill_every: float, seed: int) -> int:
    """Start the services, run the load test, kill on a schedule, sample, report."""
    chooser = simulation_random.Random(seed)
    agg_port, shuf_port = free_port(), free_port()
    aggregator = harness.Service(
        "aggregator",
        [
            *harness.CLI,
            "aggregator",
            "serve",
            "--insecure",
            "--data-dir",
            str(root / "agg"),
            "--listen",
            f"127.0.0.1:{agg_port}",
            "--decrypt-workers",
            "1",
        ],
        root / "aggregator.log",
        address=f"127.0.0.1:{agg_port}",
    )
    shuffler = harness.Service(
        "shuffler",
        [
            *harness.CLI,
            "shuffler",
            "serve",
            "--insecure",
            "--data-dir",
            str(root / "shuf"),
            "--listen",
            f"127.0.0.1:{shuf_port}",
            "--upstream",
            f"127.0.0.1:{agg_port}",
            "--quota-per-source",
            "0",
        ],
        root / "shuffler.log",
        address=f"127.0.0.1:{shuf_port}",
    )
    samples = {"aggregator": Samples(), "shuffler": Samples()}
    kills = {"aggregator": 0, "shuffler": 0, "worker": 0}
    duration = minutes * 60
    await aggregator.start()
    await shuffler.start()
    load = subprocess.Popen(
        [
            *harness.CLI,
            "loadtest",
            "--shuffler",
            shuffler.address or "",
            "--aggregator",
            aggregator.address or "",
            "--rate",
            str(rate),
            "--duration",
            str(duration),
            "--workers",
            "1",
            "--no-progress",
            "--mechanism",
            "grr",
            "--json",
            str(root / "loadtest.json"),
            "--out",
            str(root / "plots"),
        ],
        stdout=(root / "loadtest.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        started = await sending_started(shuffler, load, time.monotonic() + 900)
        next_kill = started + kill_every
        while load.poll() is None:
            await asyncio.sleep(2.0)
            now = time.monotonic()
            if now - started < duration:  # steady load only, not the final drain
                samples["aggregator"].add(aggregator)
                samples["shuffler"].add(shuffler)
            if now >= next_kill and now - started < duration - 2 * kill_every:
                next_kill = now + kill_every
                pick = chooser.random()
                if pick < 0.4:
                    await shuffler.kill_and_restart()
                    kills["shuffler"] += 1
                elif pick < 0.8 and aggregator.kill_child(chooser):
                    kills["worker"] += 1
                else:
                    await aggregator.kill_and_restart()
                    kills["aggregator"] += 1
            if now - started > duration + 900:
                load.kill()
                raise harness.HarnessError("load test did not finish")
    finally:
        shuffler.stop()
        aggregator.stop()
    ok = load.returncode == 0
    (root / "samples.json").write_text(json.dumps({k: [v.rss, v.fds] for k, v in samples.items()}))
    for name, s in samples.items():
        for measure, values, unit in (("rss", s.rss, 2**20), ("fds", s.fds, 1)):
            second, last, flat = flatness(values)
            ok &= flat
            print(
                f"{name} {measure}: q2 median {second / unit:.1f} last-quarter median {last / unit:.1f}"
                f" ({len(values)} samples) {'flat' if flat else 'GREW'}"
            )
    result = json.loads((root / "loadtest.json").read_text()) if (root / "loadtest.json").exists() else {}
    acknowledged, counted = int(result.get("acknowledged", -1)), int(result.get("counted", -2))
    unacked = int(result.get("failed_reports", 0))
    # a report whose answer was cut off may have been spooled: counted once or not at all
    ok &= acknowledged <= counted <= acknowledged + unacked
    print(
        f"soak minutes={minutes:g} rate={rate:g} kills={sum(kills.values())} {kills}"
        f" restart_retries={aggregator.start_retries + shuffler.start_retries}"
        f" acknowledged={acknowledged} counted={counted} lost={max(0, acknowledged - counted)}"
        f" unacknowledged={unacked} (of which counted {max(0, counted - acknowledged)})"
        f" {'OK' if ok else 'FAILED'}"
    )
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """Parse options and soak."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=300.0, help="reports per second (default 300)")
    parser.add_argument("--kill-every", type=float, default=10.0, help="seconds between kills (default 10)")
    parser.add_argument("--seed", type=int, default=20261126)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    root = args.workdir or Path(tempfile.mkdtemp(prefix="deniable-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"data and logs: {root}", flush=True)
    return asyncio.run(soak(root, args.minutes, args.rate, args.kill_every, args.seed))


if __name__ == "__main__":
    sys.exit(main())
