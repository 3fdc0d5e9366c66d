"""``deniable bench``: the machine's ceiling, each stage's throughput, and the whole pipeline's.

One run measures, on this machine:

- the ceiling: HPKE decryptions per second on every core (one process per core: the ``hpke``
  binding holds the interpreter lock, so threads would not add up), and encryptions per second;
- the device stage: randomise + encode + seal, simulated devices on every core;
- the shuffler's ingest (SubmitReports, spooled durably) and its permute + forward (Flush to an
  upstream that only acknowledges), with the shuffler's CPU per report;
- the aggregator's ingest + decrypt + count (IngestBatch of shuffled batches), with its CPU per
  report (service process and decryption workers);
- end to end through the real services: reports are sealed first, then timed from the first
  SubmitReports to the moment the aggregator has counted the last one.

Every service runs in its own spawned process on loopback (see ``benchkit``), so CPU time and
memory are read per service from /proc. Figures are reports per second and a ratio to the
decryption ceiling; nothing here is a pass/fail assertion.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from deniable.shuffler.forwarder import DEFAULT_WINDOW as FORWARD_WINDOW
from deniable.sim import benchkit, populations, render
from deniable.sim.benchkit import ServiceProcess, say
from deniable.sim.sink import SinkAggregator, ingest_batches, shuffled_batches, start_sink
from deniable.v1 import deniable_pb2 as pb

SHUFFLER_CPU_TARGET: Final = 0.05
"""Target: shuffler CPU per report below 5% of the aggregator's."""
LABELS: Final = tuple(f"bucket-{i}" for i in range(8))


@dataclass
class BenchConfig:
    """Sizes of one run (``quick`` shrinks everything to seconds, for tests and smoke runs)."""

    reports: int = 200_000
    ceiling_reports: int = 40_000
    workers: int = field(default_factory=benchkit.cores)
    batch_reports: int = 50_000
    request_reports: int = benchkit.REQUEST_REPORTS
    concurrency: int = 4
    single_requests: int = 3000
    """Requests of one report each for the device-like ingest stage."""
    single_concurrency: int = 16
    epsilon0: float = 1.0
    progress: bool = True

    @classmethod
    def quick(cls, **overrides: Any) -> BenchConfig:
        """Tiny sizes: every measurement runs, none means much."""
        settings: dict[str, Any] = {
            "reports": 3000,
            "ceiling_reports": 2000,
            "batch_reports": 1000,
            "request_reports": 250,
            "single_requests": 200,
        }
        settings.update(overrides)
        return cls(**settings)


@dataclass
class Stage:
    """One measured stage."""

    name: str
    reports: int
    seconds: float
    cpu_s: float | None = None
    where: str = ""
    per_s: float = 0.0
    ratio_to_ceiling: float = 0.0
    cpu_us_per_report: float | None = None

    def finish(self, ceiling: float) -> Stage:
        """Fill in the derived rates."""
        self.per_s = self.reports / self.seconds if self.seconds > 0 else 0.0
        self.ratio_to_ceiling = self.per_s / ceiling if ceiling > 0 else 0.0
        if self.cpu_s is not None and self.reports:
            self.cpu_us_per_report = self.cpu_s / self.reports * 1e6
        return self


# --- ceiling workers (run in pool processes) -----------------------------------------------------


def _seal_fixed(
    public_raw: bytes, key_id: int, campaign_id: str, count: int, length: int
) -> tuple[bytes, float]:
    from deniable.core.crypto import PublicKey, seal_report

    key = PublicKey(key_id, public_raw)
    started = time.process_time()
    plaintext = bytes(length)
    joined = b"".join(seal_report(plaintext, key, campaign_id) for _ in range(count))
    return joined, time.process_time() - started


def _open_fixed(
    private_raw: bytes, key_id: int, campaign_id: str, blob: bytes, width: int
) -> tuple[int, float]:
    from deniable.core.crypto import KeyPair, open_report

    pair = KeyPair(key_id, private_raw)
    started = time.process_time()
    opened = 0
    for offset in range(0, len(blob), width):
        open_report(blob[offset : offset + width], pair, campaign_id)
        opened += 1
    return opened, time.process_time() - started


def measure_ceiling(pool: Any, workers: int, count: int, repeats: int = 3) -> tuple[Stage, Stage, Stage]:
    """HPKE encrypt and decrypt rates on ``workers`` processes; decrypt is the ceiling.

    Returns (decrypt on all cores, decrypt per core, encrypt on all cores): decryption is timed
    ``repeats`` times over the same ciphertexts and the fastest run kept (on a shared machine the
    least disturbed one is the closest to what the hardware can do). Plaintexts are 96 bytes,
    the size of a small-payload report.
    """
    from deniable.core.crypto import KeyPair

    pair = KeyPair.generate(1)
    public = pair.public
    per_worker = max(1, count // workers)
    started = time.perf_counter()
    sealed = [
        pool.submit(_seal_fixed, public.raw, 1, "bench-ceiling", per_worker, 96) for _ in range(workers)
    ]
    parts = [f.result() for f in sealed]
    encrypt_wall = time.perf_counter() - started
    width = 96 + 48
    total = per_worker * workers
    runs = []
    for _ in range(max(1, repeats)):
        started = time.perf_counter()
        opened = [
            pool.submit(_open_fixed, pair.private_raw, 1, "bench-ceiling", blob, width) for blob, _ in parts
        ]
        results = [f.result() for f in opened]
        runs.append((time.perf_counter() - started, sum(cpu for _, cpu in results)))
    decrypt_wall, decrypt_cpu = min(runs)
    return (
        Stage("ceiling: HPKE decrypt, all cores", total, decrypt_wall, decrypt_cpu, f"{workers} processes"),
        Stage("HPKE decrypt, one core (CPU time)", total, decrypt_cpu, decrypt_cpu, "per core"),
        Stage(
            "HPKE encrypt, all cores",
            total,
            encrypt_wall,
            sum(cpu for _, cpu in parts),
            f"{workers} processes",
        ),
    )


# --- the run: one named step per measurement -------------------------------------------------------


@dataclass
class Measured:
    """What the end-to-end stage leaves for the summary: the stage and each service's CPU."""

    stage: Stage
    shuffler_cpu_s: float
    aggregator_cpu_s: float


class BenchRun:
    """One ``deniable bench`` run: the services, the sealed reports and the stages measured so far."""

    def __init__(self, config: BenchConfig, workdir: Path) -> None:
        self.config = config
        self.workdir = workdir
        self.workers = max(1, config.workers)
        self.stages: list[Stage] = []
        self.ceiling = 0.0
        self.pool: ProcessPoolExecutor | None = None
        self.aggregator = benchkit.aggregator_process(workdir / "aggregator", self.workers)
        self.services: list[ServiceProcess] = [self.aggregator]

    def add(self, stage: Stage) -> None:
        """Record a stage with its rates against the ceiling measured so far."""
        self.stages.append(stage.finish(self.ceiling))

    async def measure_ceiling(self) -> None:
        """HPKE on every core before anything else runs: the first ceiling."""
        self.pool = await asyncio.to_thread(benchkit.start_pool, self.workers)
        say(self.config.progress, "measuring the ceiling (HPKE on every core) ...")
        first, one_core, encrypt = await asyncio.to_thread(
            measure_ceiling, self.pool, self.workers, self.config.ceiling_reports
        )
        self.ceiling = first.reports / first.seconds
        for stage in (first, one_core, encrypt):
            self.add(stage)

    async def seal_reports(self) -> None:
        """Start the aggregator, create the campaigns and seal their reports as simulated devices."""
        config, pool = self.config, self.pool
        assert pool is not None
        await asyncio.to_thread(self.aggregator.start)
        n_min = min(1000, config.reports)
        stage, e2e, warm = [
            await benchkit.create_campaign(
                self.aggregator.address,
                benchkit.bucket_campaign_request(name, len(LABELS), config.epsilon0, size),
            )
            for name, size in (("bench-stages", n_min), ("bench-e2e", n_min), ("bench-warmup", 1))
        ]
        values = populations.interleaved_population(populations.zipf_shares(len(LABELS)), config.reports)
        say(config.progress, "sealing reports as simulated devices (every core) ...")
        self.sealed_stage, self.sealed_e2e = [
            await asyncio.to_thread(
                benchkit.seal_with_bar, c, values, pool, self.workers, "seal", config.progress
            )
            for c in (stage, e2e)
        ]
        self.warm = await asyncio.to_thread(
            benchkit.seal_population, warm, [0] * (512 * self.workers + 8), pool, self.workers
        )
        sealed = self.sealed_stage
        where = f"{self.workers} processes"
        self.add(
            Stage("device: randomise + seal, all cores", sealed.count, sealed.wall_s, sealed.cpu_s, where)
        )
        await asyncio.to_thread(pool.shutdown)

    async def measure_shuffler(self) -> None:
        """The shuffler alone: ingest, then permute + forward to a sink that only acknowledges."""
        say(self.config.progress, "shuffler stages (upstream: an acknowledging sink) ...")
        campaign = self.sealed_stage.campaign
        sink_server, sink, sink_address = await start_sink([campaign])
        shuffler = benchkit.shuffler_process(
            self.workdir / "shuffler-stage",
            sink_address,
            batch_interval_s=3600.0,
            max_batch_reports=self.config.batch_reports,
        )
        self.services.append(shuffler)
        try:
            await asyncio.to_thread(shuffler.start)
            await self._shuffler_ingest(shuffler)
            await self._shuffler_forward(shuffler, sink)
            await self._shuffler_single_reports(shuffler)
        finally:
            await asyncio.to_thread(shuffler.stop)
            await sink_server.stop(None)

    async def _shuffler_ingest(self, shuffler: ServiceProcess) -> None:
        """SubmitReports of every stage report, in gateway-sized requests, spooled durably."""
        sealed, config = self.sealed_stage, self.config
        elements = benchkit.report_elements(sealed.campaign.id, sealed.campaign.key_id, sealed.ciphertexts, 1)
        requests = benchkit.chunk_requests(elements, config.request_reports)
        cpu_before = shuffler.cpu_seconds()
        submitted = await benchkit.submit_requests(shuffler.address, requests, config.concurrency)
        cpu = shuffler.cpu_seconds() - cpu_before
        if submitted.acknowledged != sealed.count:
            raise RuntimeError(f"shuffler acknowledged {submitted.acknowledged} of {sealed.count}")
        wall = submitted.last_acked - submitted.first_sent
        name = "shuffler: ingest (SubmitReports, durable spool)"
        self.add(Stage(name, submitted.acknowledged, wall, cpu, "shuffler process"))

    async def _shuffler_forward(self, shuffler: ServiceProcess, sink: SinkAggregator) -> None:
        """Flush: one permutation of everything held, forwarded in batches."""
        count = self.sealed_stage.count
        cpu_before = shuffler.cpu_seconds()
        started = time.perf_counter()
        flushed = await benchkit.flush_shuffler(shuffler.address)
        wall = time.perf_counter() - started
        cpu = shuffler.cpu_seconds() - cpu_before
        if flushed.reports_forwarded != count or sink.reports != count:
            raise RuntimeError(f"shuffler forwarded {flushed.reports_forwarded} of {count}")
        where = f"shuffler process; {flushed.batches_forwarded} batches"
        self.add(Stage("shuffler: permute + forward (Flush)", flushed.reports_forwarded, wall, cpu, where))

    async def _shuffler_single_reports(self, shuffler: ServiceProcess) -> None:
        """Devices that send one report per request (no gateway batching): the per-call cost."""
        sealed, config = self.sealed_stage, self.config
        single = benchkit.report_elements(
            sealed.campaign.id, sealed.campaign.key_id, sealed.ciphertexts[: config.single_requests], 1
        )
        cpu_before = shuffler.cpu_seconds()
        submitted = await benchkit.submit_requests(
            shuffler.address, [(e, 1) for e in single], config.single_concurrency
        )
        wall = submitted.last_acked - submitted.first_sent
        cpu = shuffler.cpu_seconds() - cpu_before
        where = f"shuffler process; {config.single_concurrency} requests in flight"
        self.add(Stage("shuffler: ingest, 1 report per request", submitted.acknowledged, wall, cpu, where))

    async def measure_aggregator(self) -> None:
        """The aggregator alone: shuffled batches straight to IngestBatch, the forwarder's window."""
        say(self.config.progress, "aggregator stage (IngestBatch of shuffled batches) ...")
        address, batch_reports = self.aggregator.address, self.config.batch_reports
        await ingest_batches(address, shuffled_batches(self.warm, len(self.warm.ciphertexts), "warm"))
        batches = shuffled_batches(self.sealed_stage, batch_reports, "stage")
        cpu_before = self.aggregator.cpu_seconds()
        started = time.perf_counter()
        counted = await ingest_batches(address, batches, concurrency=FORWARD_WINDOW)
        wall = time.perf_counter() - started
        cpu = self.aggregator.cpu_seconds() - cpu_before
        if counted != self.sealed_stage.count:
            raise RuntimeError(f"aggregator counted {counted} of {self.sealed_stage.count}")
        where = (
            f"aggregator + {self.workers} decryption processes; batches of {batch_reports},"
            f" {FORWARD_WINDOW} in flight"
        )
        self.add(Stage("aggregator: ingest + decrypt + count", counted, wall, cpu, where))

    async def measure_end_to_end(self) -> Measured:
        """Devices (pre-sealed) -> shuffler -> aggregator, from the first submit to the last count."""
        say(self.config.progress, "end to end through the real services ...")
        shuffler = benchkit.shuffler_process(
            self.workdir / "shuffler-e2e",
            self.aggregator.address,
            max_batch_reports=self.config.batch_reports,
            forward_deadline_s=600.0,
        )
        self.services.append(shuffler)
        try:
            await asyncio.to_thread(shuffler.start)
            answer, wall, shuffler_cpu, aggregator_cpu = await self._submit_and_count(shuffler)
        finally:
            await asyncio.to_thread(shuffler.stop)
        if answer.messages != self.sealed_e2e.count:
            raise RuntimeError(f"end to end: {answer.messages} counted of {self.sealed_e2e.count} sealed")
        stage = Stage(
            "end to end: first submit -> last counted",
            answer.messages,
            wall,
            shuffler_cpu + aggregator_cpu,
            "shuffler + aggregator processes",
        )
        self.add(stage)
        return Measured(stage, shuffler_cpu, aggregator_cpu)

    async def _submit_and_count(
        self, shuffler: ServiceProcess
    ) -> tuple[pb.QueryResponse, float, float, float]:
        """Submit every e2e report, flush, wait for the count.

        Returns (answer, wall seconds, shuffler CPU s, aggregator CPU s).
        """
        aggregator, sealed = self.aggregator, self.sealed_e2e
        elements = benchkit.report_elements(sealed.campaign.id, sealed.campaign.key_id, sealed.ciphertexts, 1)
        requests = benchkit.chunk_requests(elements, self.config.request_reports)
        baseline = await asyncio.to_thread(benchkit.scrape_counted, aggregator.metrics_port or 0)
        shuffler_cpu, aggregator_cpu = shuffler.cpu_seconds(), aggregator.cpu_seconds()
        submitted = await benchkit.submit_requests(shuffler.address, requests, self.config.concurrency)
        await benchkit.flush_shuffler(shuffler.address)
        answer, reached = await benchkit.wait_counted(
            aggregator.address,
            sealed.campaign.id,
            submitted.acknowledged,
            timeout_s=600,
            metrics_port=aggregator.metrics_port,
            baseline=baseline,
        )
        return (
            answer,
            reached - submitted.first_sent,
            shuffler.cpu_seconds() - shuffler_cpu,
            aggregator.cpu_seconds() - aggregator_cpu,
        )

    async def stop(self) -> None:
        """Stop the pool and every service started (safe to call whatever failed)."""
        if self.pool is not None:
            await asyncio.to_thread(self.pool.shutdown, True, cancel_futures=True)
        for service in self.services:
            await asyncio.to_thread(service.stop)

    async def measure_ceiling_again(self) -> list[float]:
        """The ceiling again with everything else stopped; the best of the two is the ceiling.

        A shared machine drifts within a run: every stage is compared with the machine's best.
        """
        say(self.config.progress, "measuring the ceiling again ...")
        pool = await asyncio.to_thread(benchkit.start_pool, self.workers)
        try:
            again, _, _ = await asyncio.to_thread(
                measure_ceiling, pool, self.workers, self.config.ceiling_reports, 2
            )
        finally:
            await asyncio.to_thread(pool.shutdown, True, cancel_futures=True)
        runs = [self.ceiling, again.reports / again.seconds]
        if runs[1] > runs[0]:
            self.stages[0] = again
        self.ceiling = max(runs)
        for stage in self.stages:
            stage.finish(self.ceiling)
        return runs

    def summary(self, runs: list[float], e2e: Measured) -> dict[str, Any]:
        """The report's headline figures (the stages included)."""
        shuffler_us = e2e.shuffler_cpu_s / e2e.stage.reports * 1e6
        aggregator_us = e2e.aggregator_cpu_s / e2e.stage.reports * 1e6
        return {
            "decrypt_ceiling_per_s": self.ceiling,
            "decrypt_ceiling_runs_per_s": runs,
            "decrypt_one_core_us": self.stages[1].cpu_us_per_report,
            "encrypt_per_s": self.stages[2].per_s,
            "end_to_end_per_s": e2e.stage.per_s,
            "ratio_end_to_end_to_ceiling": e2e.stage.ratio_to_ceiling,
            "shuffler_cpu_us_per_report": shuffler_us,
            "aggregator_cpu_us_per_report": aggregator_us,
            "shuffler_to_aggregator_cpu_ratio": shuffler_us / aggregator_us if aggregator_us else 0.0,
            "shuffler_cpu_target_ratio": SHUFFLER_CPU_TARGET,
            "stages": [asdict(s) for s in self.stages],
        }


async def _run(config: BenchConfig, workdir: Path) -> dict[str, Any]:
    """Every measurement in order; the services are stopped before the ceiling is measured again."""
    report: dict[str, Any] = {"machine": benchkit.machine(), "config": asdict(config)}
    run = BenchRun(config, workdir)
    say(config.progress, f"deniable bench: {run.workers} cores, {config.reports} reports per stage")
    try:
        await run.measure_ceiling()
        await run.seal_reports()
        await run.measure_shuffler()
        await run.measure_aggregator()
        e2e = await run.measure_end_to_end()
    finally:
        await run.stop()
    runs = await run.measure_ceiling_again()
    report.update(run.summary(runs, e2e))
    return report


def format_report(report: dict[str, Any]) -> str:
    """The table ``deniable bench`` prints."""
    machine = report["machine"]
    lines = [
        f"machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gb']} GB,"
        f" Python {machine['python']}; load average at start {machine['load_average_at_start']}",
        "",
        f"{'stage':52} {'reports/s':>11} {'x ceiling':>9} {'CPU µs/report':>14}  where",
    ]
    for stage in report["stages"]:
        cpu = stage["cpu_us_per_report"]
        lines.append(
            f"{stage['name']:52} {stage['per_s']:>11,.0f} {stage['ratio_to_ceiling']:>9.2f}"
            f" {'' if cpu is None else f'{cpu:,.1f}':>14}  {stage['where']}"
        )
    ratio = report["shuffler_to_aggregator_cpu_ratio"]
    verdict = "met" if ratio < report["shuffler_cpu_target_ratio"] else "NOT met"
    first, second = report["decrypt_ceiling_runs_per_s"]
    lines += [
        "",
        f"ceiling: best of {first:,.0f}/s (start) and {second:,.0f}/s (end of the run)",
        f"end to end: {report['end_to_end_per_s']:,.0f} reports/s ="
        f" {report['ratio_end_to_end_to_ceiling']:.2f} x the decryption ceiling"
        f" ({report['decrypt_ceiling_per_s']:,.0f}/s)",
        f"CPU per report end to end: shuffler {report['shuffler_cpu_us_per_report']:.2f} µs,"
        f" aggregator {report['aggregator_cpu_us_per_report']:.2f} µs -> {ratio * 100:.1f}%"
        f" (target < {report['shuffler_cpu_target_ratio'] * 100:.0f}%: {verdict})",
    ]
    return "\n".join(lines)


def run_bench(config: BenchConfig, json_path: Path | None = None) -> dict[str, Any]:
    """Run every measurement, print the table, write JSON if asked; returns the report."""
    if not benchkit.proc_available():
        print("note: /proc is not available: CPU figures will read 0")
    with tempfile.TemporaryDirectory(prefix="deniable-bench-") as tmp:
        report = asyncio.run(_run(config, Path(tmp)))
    print(format_report(report))
    render.write_json(report, json_path)
    return report
