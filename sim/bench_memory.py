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

from deniable.sim import benchkit, render
from deniable.sim.bench import _campaign_request, ingest_batches, shuffled_batches, start_sink
from deniable.sim.benchkit import ServiceProcess

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
    from tqdm import tqdm

    report: dict[str, Any] = {"machine": benchkit.machine(), "config": asdict(config)}
    pool = await asyncio.to_thread(benchkit.start_pool, config.workers)
    aggregator = ServiceProcess(
        "aggregator",
        {"data_dir": workdir / "aggregator", "listen": "127.0.0.1:0", "decrypt_workers": config.workers},
    )
    try:
        await asyncio.to_thread(aggregator.start)
        baseline_aggregator = aggregator.peak_rss_mb()
        campaign = await benchkit.create_campaign(
            aggregator.address, _campaign_request("bench-memory", 1.0, min(1000, config.reports))
        )
        values = benchkit.interleaved_population(benchkit.zipf_shares(8), config.reports)
        if progress:
            print(f"sealing {config.reports:,} reports on {config.workers} cores ...", flush=True)
        with tqdm(total=config.reports, desc="seal", unit="report", disable=not progress) as bar:
            sealed = await asyncio.to_thread(
                benchkit.seal_population, campaign, values, pool, config.workers, bar.update
            )
        await asyncio.to_thread(pool.shutdown)

        # The shuffler: hold everything, then one permutation over all of it.
        if progress:
            print("shuffler: holding, then permuting and forwarding every report ...", flush=True)
        sink_server, sink, sink_address = await start_sink([campaign])
        shuffler = ServiceProcess(
            "shuffler",
            {
                "data_dir": workdir / "shuffler",
                "upstream": sink_address,
                "listen": "127.0.0.1:0",
                "batch_interval_s": 3600.0,
                "max_batch_reports": config.batch_reports,
                "forward_deadline_s": 600.0,
            },
        )
        try:
            await asyncio.to_thread(shuffler.start)
            baseline_shuffler = shuffler.peak_rss_mb()
            elements = benchkit.report_elements(campaign.id, campaign.key_id, sealed.ciphertexts, 1)
            submitted = await benchkit.submit_requests(shuffler.address, benchkit.chunk_requests(elements), 4)
            del elements
            holding = shuffler.peak_rss_mb()
            started = time.perf_counter()
            flushed = await benchkit.flush_shuffler(shuffler.address)
            permute_s = time.perf_counter() - started
            shuffler_peak = shuffler.peak_rss_mb()
        finally:
            usage = await asyncio.to_thread(shuffler.stop)
            await sink_server.stop(None)
        if flushed.reports_forwarded != submitted.acknowledged or sink.reports != submitted.acknowledged:
            raise RuntimeError(f"shuffler forwarded {flushed.reports_forwarded} of {submitted.acknowledged}")
        shuffler_peak = max(shuffler_peak, float(usage.get("peak_rss_mb", 0.0)))
        report["shuffler"] = {
            "reports": submitted.acknowledged,
            "baseline_rss_mb": baseline_shuffler,
            "rss_holding_mb": holding,
            "peak_rss_mb": shuffler_peak,
            "permute_forward_s": permute_s,
            "batches": flushed.batches_forwarded,
            "limit_mb": _scaled(SHUFFLER_LIMIT_MB, config.reports),
        }

        # The aggregator: every report as shuffled batches.
        if progress:
            print("aggregator: ingesting every report ...", flush=True)
        batches = shuffled_batches(sealed, config.batch_reports, "memory")
        del sealed
        started = time.perf_counter()
        counted = await ingest_batches(aggregator.address, batches)
        ingest_s = time.perf_counter() - started
        members = benchkit.process_tree(aggregator.pid)
        workers = [benchkit.peak_rss_mb(pid) for pid in members if pid != aggregator.pid]
        aggregator_peak = aggregator.peak_rss_mb()
        report["aggregator"] = {
            "reports": counted,
            "baseline_rss_mb": baseline_aggregator,
            "peak_rss_mb": aggregator_peak,
            "worker_peak_rss_mb": workers,
            "ingest_s": ingest_s,
            "limit_mb": _scaled(AGGREGATOR_LIMIT_MB, config.reports),
            "worker_limit_mb": WORKER_LIMIT_MB,
        }
    finally:
        await asyncio.to_thread(pool.shutdown, True, cancel_futures=True)
        await asyncio.to_thread(aggregator.stop)
    shuffler_ok = report["shuffler"]["peak_rss_mb"] <= report["shuffler"]["limit_mb"]
    aggregator_ok = report["aggregator"]["peak_rss_mb"] <= report["aggregator"]["limit_mb"] and all(
        w <= WORKER_LIMIT_MB for w in report["aggregator"]["worker_peak_rss_mb"]
    )
    report["within_limits"] = {"shuffler": shuffler_ok, "aggregator": aggregator_ok}
    return report


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
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(render.dumps(report) + "\n")
        print(f"wrote {json_path}")
    return report
