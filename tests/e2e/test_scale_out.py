"""Several shufflers and several aggregators on one PostgreSQL, as separate OS processes.

The same sealed reports (fixed values, fixed randomised payloads, fixed report ids) go through one
shuffler and one aggregator (SQLite, the reference) and through two shufflers sharing a PostgreSQL
spool and two aggregators sharing a PostgreSQL store: the counts must be identical, every report
counted exactly once, and no batch below the campaign's batch target (nor n_min). Plaintext
(``--insecure``) by name: TLS is not the subject here (tests/test_cli.py serves with TLS).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.processes import free_port, wait_listening

from deniable.aggregator.keys import KEYS_DIR, Keyring
from deniable.core.campaigns import randomiser_for
from deniable.core.crypto import PublicKey, seal_report
from deniable.core.rng import Csprng
from deniable.core.wire import Plaintext, encode
from deniable.v1 import deniable_pb2 as pb
from deniable.v1 import deniable_pb2_grpc

CLI = [sys.executable, "-m", "deniable.cli"]
CAMPAIGN = "scale"
LABELS = ["a", "b", "c", "d"]
N_MIN = 60
BATCH_TARGET = 100
"""Requests hold exactly this many reports, so whatever a shuffler holds is released at the target."""


@contextmanager
def _services(commands: list[tuple[list[str], int]], root: Path) -> Iterator[None]:
    """``deniable ... serve`` processes, all started at once; SIGTERM at the end, exit 0 required."""
    procs: list[tuple[subprocess.Popen[bytes], Path]] = []
    root.mkdir(parents=True, exist_ok=True)
    try:
        for i, (args, _) in enumerate(commands):
            log = root / f"{args[0]}{i}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen([*CLI, *args, "--insecure"], stdout=out, stderr=subprocess.STDOUT)
            procs.append((proc, log))
        for (proc, _), (_, port) in zip(procs, commands, strict=True):
            wait_listening(port, proc, timeout=60)
        yield
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, log in procs:
            assert proc.wait(timeout=60) == 0, log.read_text()[-2000:]


@dataclass
class Deployment:
    shufflers: list[str]
    aggregators: list[str]
    aggregator_metrics: list[int]


@contextmanager
def _deploy(
    root: Path, keys: Path, shufflers: int, aggregators: int, spool: str | None, store: str | None
) -> Iterator[Deployment]:
    """``aggregators`` aggregator processes (same keys, one store) and ``shufflers`` shuffler
    processes (one spool); shuffler i forwards to aggregator i mod ``aggregators``."""
    commands: list[tuple[list[str], int]] = []
    agg_ports = [free_port() for _ in range(aggregators)]
    metric_ports = [free_port() for _ in range(aggregators)]
    for i, (port, metrics) in enumerate(zip(agg_ports, metric_ports, strict=True)):
        data = root / f"agg{i}"
        data.mkdir(parents=True)
        shutil.copytree(keys / KEYS_DIR, data / KEYS_DIR)
        args = ["aggregator", "serve", "--data-dir", str(data), "--listen", f"127.0.0.1:{port}"]
        args += ["--metrics-port", str(metrics)] + (["--store", store] if store else [])
        commands.append((args, port))
    shuf_ports = [free_port() for _ in range(shufflers)]
    for i, port in enumerate(shuf_ports):
        args = [
            "shuffler",
            "serve",
            "--data-dir",
            str(root / f"shuf{i}"),
            "--listen",
            f"127.0.0.1:{port}",
        ]
        args += ["--upstream", f"127.0.0.1:{agg_ports[i % aggregators]}", "--quota-per-source", "0"]
        args += ["--spool-store", spool] if spool else []
        commands.append((args, port))
    with _services(commands, root):
        yield Deployment(
            [f"127.0.0.1:{p}" for p in shuf_ports], [f"127.0.0.1:{p}" for p in agg_ports], metric_ports
        )


def _payloads(campaign: pb.Campaign, waves: int, per_wave: int) -> list[list[bytes]]:
    """Deterministic devices: device i answers LABELS[i % 4], randomised once."""
    randomiser = randomiser_for(campaign)
    rng = Csprng()
    return [
        [randomiser.randomise((wave * per_wave + j) % len(LABELS), rng) for j in range(per_wave)]
        for wave in range(waves)
    ]


def _sealed_reports(campaign: pb.Campaign, payloads: list[list[bytes]]) -> list[list[pb.EncryptedReport]]:
    """The payloads sealed for ``campaign`` (its incarnation is bound in), report id = device number."""
    key = PublicKey(campaign.key_id, campaign.public_key)
    sealed: list[list[pb.EncryptedReport]] = []
    for wave, answers in enumerate(payloads):
        reports = []
        for j, payload in enumerate(answers):
            device = wave * len(answers) + j
            plaintext = encode(
                Plaintext(device.to_bytes(16, "big"), campaign.id, key.key_id, payload),
                campaign.plaintext_length,
            )
            ciphertext = seal_report(plaintext, key, campaign.id, campaign.incarnation)
            reports.append(
                pb.EncryptedReport(campaign_id=campaign.id, key_id=key.key_id, ciphertext=ciphertext)
            )
        sealed.append(reports)
    return sealed


async def _create_campaign(aggregator: str) -> pb.Campaign:
    async with grpc.aio.insecure_channel(aggregator) as channel:
        stub = deniable_pb2_grpc.AggregatorStub(channel)
        request = pb.CreateCampaignRequest(
            id=CAMPAIGN,
            question="Which?",
            kind=pb.CATEGORICAL,
            labels=LABELS,
            epsilon0=2.0,
            n_min=N_MIN,
            batch_target=BATCH_TARGET,
        )
        return await stub.CreateCampaign(request, timeout=30)


async def _query(aggregator: str) -> pb.QueryResponse:
    async with grpc.aio.insecure_channel(aggregator) as channel:
        stub = deniable_pb2_grpc.AggregatorStub(channel)
        return await stub.Histogram(pb.QueryRequest(campaign_id=CAMPAIGN), timeout=30)


async def _wait_serving(address: str, timeout: float = 60) -> None:
    """Until the service's health says SERVING (a shuffler: once its aggregator answered)."""
    deadline = time.monotonic() + timeout
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                answer = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            assert time.monotonic() < deadline, f"{address} never became SERVING"
            await asyncio.sleep(0.2)


async def _send(deployment: Deployment, waves: list[list[pb.EncryptedReport]]) -> pb.QueryResponse:
    """Each wave split between the shufflers in requests of BATCH_TARGET; wait until it is all counted."""
    for address in deployment.shufflers:
        await _wait_serving(address)
    channels = [grpc.aio.insecure_channel(s) for s in deployment.shufflers]
    try:
        stubs = [deniable_pb2_grpc.ShufflerStub(c) for c in channels]
        counted = 0
        for wave in waves:
            chunks = [wave[i : i + BATCH_TARGET] for i in range(0, len(wave), BATCH_TARGET)]
            answers = await asyncio.gather(
                *(
                    stubs[i % len(stubs)].SubmitReports(pb.SubmitReportsRequest(reports=chunk), timeout=30)
                    for i, chunk in enumerate(chunks)
                )
            )
            assert sum(a.accepted for a in answers) == len(wave)
            counted += len(wave)
            answer = await _wait_counted(deployment.aggregators[-1], counted)
        return answer
    finally:
        for channel in channels:
            await channel.close()


async def _wait_counted(aggregator: str, n: int, timeout: float = 120) -> pb.QueryResponse:
    deadline = time.monotonic() + timeout
    while True:
        try:
            answer = await _query(aggregator)
            if answer.n >= n:
                return answer
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:  # nothing counted yet
                raise
        assert time.monotonic() < deadline, f"not all {n} reports were counted in time"
        await asyncio.sleep(0.3)


def _counted_by(metrics_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    found = re.search(r"^deniable_aggregator_reports_counted_total(?:\{[^}]*\})? (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def _run(
    root: Path,
    keys: Path,
    counts: tuple[int, int],
    dsns: tuple[str | None, str | None],
    shape: tuple[int, int],
) -> tuple[pb.QueryResponse, list[float]]:
    """Deploy ``counts`` (shufflers, aggregators) on ``dsns`` (spool, store), send the reports."""
    with _deploy(root, keys, *counts, *dsns) as deployment:
        campaign = asyncio.run(_create_campaign(deployment.aggregators[0]))
        answer = asyncio.run(_send(deployment, _sealed_reports_cache(campaign, *shape)))
        return answer, [_counted_by(p) for p in deployment.aggregator_metrics]


_CACHE: dict[tuple[bytes, int, int], list[list[bytes]]] = {}


def _sealed_reports_cache(campaign: pb.Campaign, waves: int, per_wave: int) -> list[list[pb.EncryptedReport]]:
    """Both deployments get the very same answers and report ids (same key, same campaign id and key
    id), each sealed for its own campaign incarnation (a ciphertext of one never opens in another)."""
    key = (campaign.public_key, waves, per_wave)
    if key not in _CACHE:
        _CACHE[key] = _payloads(campaign, waves, per_wave)
    return _sealed_reports(campaign, _CACHE[key])


@pytest.mark.parametrize(
    ("waves", "per_wave"),
    [(2, 200), pytest.param(6, 500, marks=pytest.mark.slow)],
)
@pytest.mark.timeout(600)
def test_two_shufflers_and_two_aggregators_count_exactly_like_one_of_each(
    tmp_path: Path, postgres_server: Any, waves: int, per_wave: int
) -> None:
    """Same reports, 1+1 processes on SQLite vs 2+2 on one PostgreSQL: identical counts, each
    report counted once (by one of the aggregator processes), every batch at least its target."""
    keys = tmp_path / "keys"
    Keyring.load_or_create(keys)  # one keyring, copied to every aggregator
    shape = (waves, per_wave)
    single, single_by = _run(tmp_path / "single", keys, (1, 1), (None, None), shape)

    store_db = asyncio.run(postgres_server.create_database("agg"))
    spool_db = asyncio.run(postgres_server.create_database("spool"))
    dsns = (postgres_server.dsn(spool_db), postgres_server.dsn(store_db))
    many, many_by = _run(tmp_path / "many", keys, (2, 2), dsns, shape)

    total = waves * per_wave
    for answer in (single, many):
        assert answer.n == total and answer.rejected == 0  # every report counted once
        assert answer.privacy.smallest_batch >= BATCH_TARGET  # no batch below its target
    assert [b.raw_count for b in many.buckets] == [b.raw_count for b in single.buckets]
    assert sum(b.raw_count for b in many.buckets) == total
    assert single_by == [total] and sum(many_by) == total  # across processes, once each

    async def batch_sizes() -> list[int]:
        db = await asyncpg.connect(postgres_server.dsn(store_db))
        try:
            return [int(r[0]) for r in await db.fetch("SELECT size FROM batches")]
        finally:
            await db.close()

    sizes = asyncio.run(batch_sizes())
    assert sum(sizes) == total and min(sizes) >= BATCH_TARGET
    print(f"batch sizes {sorted(sizes)}; counted per aggregator {many_by}")


# ---------------------------------------------------------------- NATS JetStream between the two


def _aggregator_args(root: Path, keys: Path, name: str, store: str, nats: str) -> tuple[list[str], int, int]:
    """Arguments of one aggregator worker consuming from NATS (keys copied), its port, metrics port."""
    port, metrics = free_port(), free_port()
    data = root / name
    data.mkdir(parents=True)
    shutil.copytree(keys / KEYS_DIR, data / KEYS_DIR)
    args = ["aggregator", "serve", "--data-dir", str(data), "--listen", f"127.0.0.1:{port}"]
    args += ["--metrics-port", str(metrics), "--store", store, "--nats", nats, "--nats-ack-wait", "2"]
    return args, port, metrics


async def _ack_pending(nats: str) -> tuple[int, int]:
    """(messages held by a worker unacknowledged, messages waiting) of the shared consumer."""
    import nats as nats_py

    from deniable.core.plumbing.jetstream import CONSUMER, STREAM

    client = await nats_py.connect(nats)
    try:
        info = await client.jetstream().consumer_info(STREAM, CONSUMER)
        return int(info.num_ack_pending or 0), int(info.num_pending or 0)
    finally:
        await client.close()


def _batches_by(metrics_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    found = re.findall(
        r'^deniable_aggregator_batches_total\{outcome="(?:ingested|duplicate)"\} (\S+)$', text, re.M
    )
    return sum(float(v) for v in found)


@pytest.mark.timeout(600)
def test_a_worker_killed_mid_batch_has_it_redelivered_and_counted_once(
    tmp_path: Path, postgres_server: Any, nats_url: str
) -> None:
    """Shuffler → JetStream → aggregator workers (OS processes, one PostgreSQL store). Worker A
    takes the one batch and is SIGKILLed while it holds it unacknowledged; workers B and C, started
    only afterwards, get it redelivered (so B or C ingested it) and it is counted exactly once."""
    keys = tmp_path / "keys"
    Keyring.load_or_create(keys)
    store = postgres_server.dsn(asyncio.run(postgres_server.create_database("agg")))
    a_args, a_port, _ = _aggregator_args(tmp_path, keys, "agg-a", store, nats_url)
    a = subprocess.Popen([*CLI, *a_args, "--insecure"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(a_port, a, timeout=60)
        shuffler_port = free_port()
        shuffler = [
            "shuffler",
            "serve",
            "--data-dir",
            str(tmp_path / "shuf"),
            "--listen",
            f"127.0.0.1:{shuffler_port}",
            "--upstream",
            f"127.0.0.1:{a_port}",
            "--quota-per-source",
            "0",
            "--forward-nats",
            nats_url,
        ]
        with _services([(shuffler, shuffler_port)], tmp_path):
            campaign = asyncio.run(_create_campaign(f"127.0.0.1:{a_port}"))
            (reports,) = _sealed_reports(campaign, _payloads(campaign, 1, 6000))
            address = f"127.0.0.1:{shuffler_port}"

            async def submit() -> None:
                await _wait_serving(address)
                async with grpc.aio.insecure_channel(address) as channel:
                    stub = deniable_pb2_grpc.ShufflerStub(channel)
                    request = pb.SubmitReportsRequest(reports=reports)  # one request: one batch to hold
                    assert (await stub.SubmitReports(request, timeout=30)).accepted == len(reports)

            asyncio.run(submit())
            deadline = time.monotonic() + 120
            while asyncio.run(_ack_pending(nats_url))[0] < 1:  # A took the batch, has not acked it
                assert time.monotonic() < deadline and a.poll() is None, "worker A never took the batch"
                time.sleep(0.01)
            a.kill()
            a.wait(timeout=30)

            workers = [_aggregator_args(tmp_path, keys, f"agg-{n}", store, nats_url) for n in "bc"]
            with _services([(args, port) for args, port, _ in workers], tmp_path / "bc"):
                answer = asyncio.run(_wait_counted(f"127.0.0.1:{workers[0][1]}", len(reports)))
                assert answer.n == len(reports) and answer.rejected == 0
                assert sum(_batches_by(metrics) for _, _, metrics in workers) >= 1  # redelivered to B or C
                assert sum(_counted_by(metrics) for _, _, metrics in workers) in (0, len(reports))
                assert asyncio.run(_ack_pending(nats_url)) == (0, 0)
    finally:
        if a.poll() is None:
            a.kill()
            a.wait(timeout=30)
