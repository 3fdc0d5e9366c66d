"""The device link's cost: MQTT against gRPC for whole pipelines, TLS against plaintext per call.

The engines of ``bench/mqtt_send.py`` (results: docs/mqtt.md) and ``bench/tls_overhead.py``
(results: docs/security.md). The MQTT run takes a broker's address: starting a throwaway
mosquitto is the script's business.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deniable.core.plumbing.mqtt import BrokerAddress
from deniable.core.rng import default_rng
from deniable.sim.demo import run_pipeline
from deniable.sim.local import local_services
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc as pb_grpc

# ============================================================================ MQTT against gRPC


@dataclass
class MqttSendConfig:
    """Devices per run and runs per transport."""

    devices: int = 20_000
    repeat: int = 2


def pipeline_run(devices: int, workdir: Path, transport: str, broker: BrokerAddress | None) -> dict[str, Any]:
    """One ``run_pipeline`` over ``transport``: send seconds and reports counted per campaign."""
    campaigns = asyncio.run(
        run_pipeline(
            devices,
            2.0,
            workdir,
            progress=False,
            mqtt_broker=broker,
            mqtt_insecure=broker is not None and broker.tls is None,  # the test broker
        )
    )
    send_s = [c.timings["send_s"] for c in campaigns]
    counted = [c.answer.n if c.answer else 0 for c in campaigns]
    rate = sum(counted) / sum(send_s)
    print(f"{transport}: send {', '.join(f'{s:.2f}' for s in send_s)} s; {rate:,.0f} reports/s")
    return {"transport": transport, "send_s": send_s, "counted": counted, "reports_per_s": rate}


def run_mqtt_send(config: MqttSendConfig, broker: BrokerAddress) -> dict[str, Any]:
    """The demo pipeline over gRPC, then through ``broker``, ``repeat`` times; ``{"devices", "runs"}``."""
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    runs = []
    with tempfile.TemporaryDirectory(prefix="deniable-mqtt-bench-") as tmp:
        for repeat in range(config.repeat):
            for transport, address in (("grpc", None), ("mqtt", broker)):
                workdir = Path(tmp) / f"{transport}-{repeat}"
                runs.append(pipeline_run(config.devices, workdir, transport, address))
    return {"devices": config.devices, "runs": runs}


# ============================================================================ TLS against plaintext


@dataclass
class TlsOverheadConfig:
    """One-report calls, 1,000-report calls, and runs per mode (the median is reported)."""

    small: int = 500
    large: int = 40
    repeat: int = 3


def submit_request(campaign: pb.Campaign, n: int) -> pb.SubmitReportsRequest:
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
    """``small`` one-report calls, then ``large`` 1,000-report calls, one after another (µs each)."""
    await stub.SubmitReports(submit_request(campaign, 1))  # connect (and handshake) outside the timing
    one, thousand = submit_request(campaign, 1), submit_request(campaign, 1000)
    started = time.perf_counter()
    for _ in range(small):
        await stub.SubmitReports(one)
    per_call = (time.perf_counter() - started) / small * 1e6
    started = time.perf_counter()
    for _ in range(large):
        await stub.SubmitReports(thousand)
    per_report = (time.perf_counter() - started) / (large * 1000) * 1e6
    return per_call, per_report


async def one_mode(root: Path, tls: bool, small: int, large: int) -> tuple[float, float]:
    """Fresh services and channel in one mode: (µs per one-report call, µs per report in 1,000s)."""
    async with local_services(root, tls=tls, batch_interval_s=3600.0) as services:
        request = pb.CreateCampaignRequest(id="c", question="q", kind=pb.BINARY, epsilon0=1.0, n_min=1)
        campaign = await services.create_campaign(request)
        device = services.device_channel()
        try:
            return await time_submits(pb_grpc.ShufflerStub(device), campaign, small, large)
        finally:
            await device.close()


async def median_of_runs(config: TlsOverheadConfig, tls: bool) -> dict[str, Any]:
    """``repeat`` runs of one mode, each in a fresh folder; the medians, printed."""
    runs = []
    for index in range(config.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(await one_mode(Path(tmp) / str(index), tls, config.small, config.large))
    call = statistics.median(r[0] for r in runs)
    report = statistics.median(r[1] for r in runs)
    print(
        f"{'TLS      ' if tls else 'plaintext'}  {call:7.0f} µs per 1-report call"
        f"  {report:6.2f} µs per report (x1000)"
    )
    return {"tls": tls, "us_per_call": call, "us_per_report": report}


def run_tls_overhead(config: TlsOverheadConfig) -> dict[str, Any]:
    """SubmitReports over plaintext, then over TLS; ``{"modes": [...]}``, one row per mode."""

    async def both() -> list[dict[str, Any]]:
        return [await median_of_runs(config, tls) for tls in (False, True)]

    return {"modes": asyncio.run(both())}
