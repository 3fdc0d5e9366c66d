"""``deniable bench --memory``: peak resident memory of the services at 1,000,000 reports.

- The shuffler holds every report pending (no batching until told), then permutes all of them
  at once (one CSPRNG permutation, Flush) and forwards them in batches to a sink.
- The aggregator ingests them as shuffled batches (decrypt on every core, dedupe, count).

Each service runs in its own spawned process; its peak RSS is VmHWM from /proc (the decryption
workers are read the same way while alive) and ``ru_maxrss`` reported by the process itself at
exit. The limits below are what we state and check against; the run prints pass or fail.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from deniable.sim import benchkit, populations, render
from deniable.sim.benchkit import ServiceProcess, say
from deniable.sim.sink import ingest_batches, shuffled_batches, start_sink

SHUFFLER_LIMIT_MB: Final = 768.0
"""Stated bound: the shuffler's peak RSS while holding and permuting 1,000,000 reports."""
AGGREGATOR_LIMIT_MB: Final = 512.0
"""Stated bound: the aggregator process's peak RSS while ingesting them (batches of 50,000)."""
WORKER_LIMIT_MB: Final = 256.0
"""Stated bound: each decryption worker's peak RSS."""
REFERENCE_REPORTS: Final = 1_000_000


@dataclass
class MemoryConfig:
    """Sizes of the memory run."""

    reports: int = REFERENCE_REPORTS
    batch_reports: int = 50_000
    workers: int = field(default_factory=benchkit.cores)

    @classmethod
    def quick(cls) -> MemoryConfig:
        """Seconds, for smoke runs."""
        return cls(reports=4000, batch_reports=1000)


async def _run(config: MemoryConfig, workdir: Path, progress: bool) -> dict[str, Any]:
    """Seal, measure the shuffler holding and permuting everything, then the aggregator ingesting it."""
    report: dict[str, Any] = {"machine": benchkit.machine(), "config": asdict(config)}
    pool = await asyncio.to_thread(benchkit.start_pool, config.workers)
    aggregator = benchkit.aggregator_process(workdir / "aggregator", config.workers, metrics=False)
    try:
        await asyncio.to_thread(aggregator.start)
        baseline_aggregator = aggregator.peak_rss_mb()
        request = benchkit.bucket_campaign_request("bench-memory", 8, 1.0, min(1000, config.reports))
        campaign = await benchkit.create_campaign(aggregator.address, request)
        values = populations.interleaved_population(populations.zipf_shares(8), config.reports)
        say(progress, f"sealing {config.reports:,} reports on {config.workers} cores ...")
        sealed = await asyncio.to_thread(
            benchkit.seal_with_bar, campaign, values, pool, config.workers, "seal", progress
        )
        await asyncio.to_thread(pool.shutdown)
        say(progress, "shuffler: holding, then permuting and forwarding every report ...")
        report["shuffler"] = await _measure_shuffler(config, workdir, sealed)
        say(progress, "aggregator: ingesting every report ...")
        batches = shuffled_batches(sealed, config.batch_reports, "memory")
        del sealed
        report["aggregator"] = await _measure_aggregator(config, aggregator, batches, baseline_aggregator)
    finally:
        await asyncio.to_thread(pool.shutdown, True, cancel_futures=True)
        await asyncio.to_thread(aggregator.stop)
    report["within_limits"] = _within_limits(report)
    return report


async def _measure_shuffler(config: MemoryConfig, workdir: Path, sealed: benchkit.Sealed) -> dict[str, Any]:
    """The shuffler holds every report (no batching until told), then one permutation over all."""
    campaign = sealed.campaign
    sink_server, sink, sink_address = await start_sink([campaign])
    shuffler = benchkit.shuffler_process(
        workdir / "shuffler",
        sink_address,
        batch_interval_s=3600.0,
        max_batch_reports=config.batch_reports,
        forward_deadline_s=600.0,
    )
    try:
        await asyncio.to_thread(shuffler.start)
        baseline = shuffler.peak_rss_mb()
        elements = benchkit.report_elements(campaign.id, campaign.key_id, sealed.ciphertexts, 1)
        submitted = await benchkit.submit_requests(shuffler.address, benchkit.chunk_requests(elements), 4)
        del elements
        holding = shuffler.peak_rss_mb()
        started = time.perf_counter()
        flushed = await benchkit.flush_shuffler(shuffler.address)
        permute_s = time.perf_counter() - started
        peak = shuffler.peak_rss_mb()
    finally:
        usage = await asyncio.to_thread(shuffler.stop)
        await sink_server.stop(None)
    if flushed.reports_forwarded != submitted.acknowledged or sink.reports != submitted.acknowledged:
        raise RuntimeError(f"shuffler forwarded {flushed.reports_forwarded} of {submitted.acknowledged}")
    return {
        "reports": submitted.acknowledged,
        "baseline_rss_mb": baseline,
        "rss_holding_mb": holding,
        "peak_rss_mb": max(peak, float(usage.get("peak_rss_mb", 0.0))),
        "permute_forward_s": permute_s,
        "batches": flushed.batches_forwarded,
        "limit_mb": _scaled(SHUFFLER_LIMIT_MB, config.reports),
    }


async def _measure_aggregator(
    config: MemoryConfig, aggregator: ServiceProcess, batches: list[tuple[bytes, int]], baseline: float
) -> dict[str, Any]:
    """The aggregator ingests every report as shuffled batches; its and its workers' peak RSS."""
    started = time.perf_counter()
    counted = await ingest_batches(aggregator.address, batches)
    ingest_s = time.perf_counter() - started
    members = benchkit.process_tree(aggregator.pid)
    workers = [benchkit.peak_rss_mb(pid) for pid in members if pid != aggregator.pid]
    return {
        "reports": counted,
        "baseline_rss_mb": baseline,
        "peak_rss_mb": aggregator.peak_rss_mb(),
        "worker_peak_rss_mb": workers,
        "ingest_s": ingest_s,
        "limit_mb": _scaled(AGGREGATOR_LIMIT_MB, config.reports),
        "worker_limit_mb": WORKER_LIMIT_MB,
    }


def _within_limits(report: dict[str, Any]) -> dict[str, bool]:
    """Each service's verdict against its stated limits."""
    shuffler, aggregator = report["shuffler"], report["aggregator"]
    return {
        "shuffler": shuffler["peak_rss_mb"] <= shuffler["limit_mb"],
        "aggregator": aggregator["peak_rss_mb"] <= aggregator["limit_mb"]
        and all(w <= WORKER_LIMIT_MB for w in aggregator["worker_peak_rss_mb"]),
    }


def _scaled(limit_mb: float, reports: int) -> float:
    """The stated limit is for 1,000,000 reports; smaller runs keep it (it is a ceiling)."""
    return limit_mb if reports <= REFERENCE_REPORTS else limit_mb * reports / REFERENCE_REPORTS


def format_memory(report: dict[str, Any]) -> str:
    """The lines printed by ``deniable bench --memory``."""
    shuffler, aggregator = report["shuffler"], report["aggregator"]
    ok = report["within_limits"]
    workers = ", ".join(f"{w:.0f}" for w in aggregator["worker_peak_rss_mb"]) or "none"
    return "\n".join(
        [
            f"shuffler, {shuffler['reports']:,} reports held then permuted at once:"
            f" peak RSS {shuffler['peak_rss_mb']:.0f} MiB (idle {shuffler['baseline_rss_mb']:.0f},"
            f" holding {shuffler['rss_holding_mb']:.0f}); limit {shuffler['limit_mb']:.0f} MiB:"
            f" {'within' if ok['shuffler'] else 'EXCEEDED'};"
            f" permute + forward {shuffler['permute_forward_s']:.1f} s",
            f"aggregator, {aggregator['reports']:,} reports ingested:"
            f" peak RSS {aggregator['peak_rss_mb']:.0f} MiB"
            f" (idle {aggregator['baseline_rss_mb']:.0f}), decryption workers {workers} MiB;"
            f" limits {aggregator['limit_mb']:.0f} / {aggregator['worker_limit_mb']:.0f} MiB:"
            f" {'within' if ok['aggregator'] else 'EXCEEDED'}; ingest {aggregator['ingest_s']:.1f} s",
        ]
    )


def run_memory(config: MemoryConfig, json_path: Path | None = None, progress: bool = True) -> dict[str, Any]:
    """Run, print, write JSON if asked."""
    with tempfile.TemporaryDirectory(prefix="deniable-memory-") as tmp:
        report = asyncio.run(_run(config, Path(tmp), progress))
    print(format_memory(report))
    render.write_json(report, json_path)
    return report
