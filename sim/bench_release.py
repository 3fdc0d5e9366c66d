"""Peak memory of forming one large release in a spool (ADR 0023, ADR 0042): the engine of
``bench/release_memory.py``.

The SQLite ``SegmentSpool`` by default; with a DSN the ``PostgresSpool`` (the figure is this
process's, the shuffler's side: the server's own memory is PostgreSQL's, bounded by its settings).
The peak (ru_maxrss) is per process: run it in a fresh one for a meaningful figure.
"""

from __future__ import annotations

import resource
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deniable.core.rng import default_rng
from deniable.shuffler.batcher import MAX_BATCH_BYTES, chunk_sizes
from deniable.shuffler.columns import ColumnReports
from deniable.shuffler.segments import SegmentSpool
from deniable.shuffler.spool_common import SegmentStoreBase

CAMPAIGN = "c"
REQUESTS_PER_TRANSACTION = 500


@dataclass
class ReleaseMemoryConfig:
    """Messages in the release, messages per request (segment), bytes per message."""

    messages: int = 1_300_000
    per_request: int = 65
    width: int = 144


def peak_mib() -> float:
    """Peak resident set of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def fill(spool: SegmentStoreBase, config: ReleaseMemoryConfig) -> None:
    """Append the messages as requests of ``per_request``, 500 requests per transaction."""
    payload = default_rng().bytes(config.per_request * config.width)
    texts = [payload[i : i + config.width] for i in range(0, len(payload), config.width)]
    keys = [1] * config.per_request
    requests = config.messages // config.per_request
    for first in range(0, requests, REQUESTS_PER_TRANSACTION):
        count = min(REQUESTS_PER_TRANSACTION, requests - first)
        spool.append(ColumnReports([(CAMPAIGN, keys, texts)] * count))


def run_release_memory(config: ReleaseMemoryConfig, dsn: str | None = None) -> dict[str, Any]:
    """Fill a fresh spool (PostgreSQL at ``dsn``, else SQLite), form the whole release under the batch
    byte limit; sizes, seconds, peaks."""
    with tempfile.TemporaryDirectory() as folder:
        spool: SegmentStoreBase
        if dsn is None:
            spool = SegmentSpool(Path(folder) / "spool.sqlite3")
        else:
            from deniable.shuffler.spool_postgres import PostgresSpool

            spool = PostgresSpool(dsn)
        fill(spool, config)
        filled = peak_mib()
        total = sum(spool.pending_segment_counts(CAMPAIGN))
        sizes = chunk_sizes(total, MAX_BATCH_BYTES // (config.width + 32), 1)
        started = time.perf_counter()
        formed = spool.form_batch_sizes(CAMPAIGN, sizes, default_rng().permutation, whole=True)
        seconds = time.perf_counter() - started
        spool.close()
    return {
        "spool": "sqlite" if dsn is None else "postgresql",
        "messages": total,
        "ciphertext_mib": total * config.width / 2**20,
        "chunks": len(formed),
        "form_s": seconds,
        "peak_mib_filled": filled,
        "peak_mib_formed": peak_mib(),
    }
