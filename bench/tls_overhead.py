"""What TLS costs on the device link: SubmitReports to a real shuffler, plaintext against TLS.

    python bench/tls_overhead.py [--small 500] [--large 40] [--repeat 3]

One shuffler (and its aggregator) per mode on loopback, per-source quota off; a fresh channel
per mode. Timed: ``--small`` calls of one report each, then ``--large`` calls of 1,000 reports,
one after another (the device's pattern), median of ``--repeat`` runs. Results: docs/security.md.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from deniable.core.rng import default_rng
from deniable.sim import local_services
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc


async def one_mode(root: Path, tls: bool, small: int, large: int) -> tuple[float, float]:
    """(µs per one-report call, µs per report in 1,000-report calls)."""
    async with local_services(root, tls=tls, batch_interval_s=3600.0) as services:
        request = pb.CreateCampaignRequest(id="c", question="q", kind=pb.BINARY, epsilon0=1.0, n_min=1)
        campaign = await services.create_campaign(request)
        device = services.device_channel()
        try:
            return await time_submits(pb_grpc.ShufflerStub(device), campaign, small, large)
        finally:
            await device.close()


def reports(campaign: pb.Campaign, n: int) -> pb.SubmitReportsRequest:
    """``n`` reports of random bytes of the campaign's ciphertext length (the shuffler cannot tell)."""
    body = [default_rng().bytes(campaign.ciphertext_length) for _ in range(n)]
    return pb.SubmitReportsRequest(
        reports=[
            pb.EncryptedReport(campaign_id=campaign.id, key_id=campaign.key_id, ciphertext=c) for c in body
        ]
    )


async def time_submits(
    stub: pb_grpc.ShufflerAsyncStub, campaign: pb.Campaign, small: int, large: int
) -> tuple[float, float]:
    """``small`` one-report calls, then ``large`` 1,000-report calls, one after another."""
    await stub.SubmitReports(reports(campaign, 1))  # connect (and handshake) outside the timing
    one, thousand = reports(campaign, 1), reports(campaign, 1000)
    started = time.perf_counter()
    for _ in range(small):
        await stub.SubmitReports(one)
    per_call = (time.perf_counter() - started) / small * 1e6
    started = time.perf_counter()
    for _ in range(large):
        await stub.SubmitReports(thousand)
    per_report = (time.perf_counter() - started) / (large * 1000) * 1e6
    return per_call, per_report


async def main(small: int, large: int, repeat: int) -> None:
    for tls in (False, True):
        runs = []
        for index in range(repeat):
            with tempfile.TemporaryDirectory() as tmp:
                runs.append(await one_mode(Path(tmp) / str(index), tls, small, large))
        call = statistics.median(r[0] for r in runs)
        report = statistics.median(r[1] for r in runs)
        print(
            f"{'TLS      ' if tls else 'plaintext'}  {call:7.0f} µs per 1-report call"
            f"  {report:6.2f} µs per report (x1000)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=500)
    parser.add_argument("--large", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()
    asyncio.run(main(options.small, options.large, options.repeat))
