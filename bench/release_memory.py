"""Peak memory of forming one large release in the segment spool (ADR 0023).

    python bench/release_memory.py [--messages 1300000] [--per-request 65] [--width 144]

Fills a fresh ``SegmentSpool`` with requests of ``--per-request`` messages of ``--width`` bytes
(a multi-message campaign), then forms the whole release as chunks under the 48 MiB byte limit
with one permutation. Prints the process's peak RSS (ru_maxrss) before and after forming, in
MiB. Run it in a fresh process: the peak is per process. Nothing here is a test assertion.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from deniable.core.rng import default_rng
from deniable.shuffler.batcher import MAX_BATCH_BYTES, chunk_sizes
from deniable.shuffler.columns import ColumnReports
from deniable.shuffler.segments import SegmentSpool


def peak_mib() -> float:
    """Peak resident set of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    """Fill, form, print."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=1_300_000)
    parser.add_argument("--per-request", type=int, default=65)
    parser.add_argument("--width", type=int, default=144)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        spool = SegmentSpool(Path(folder) / "spool.sqlite3")
        payload = default_rng().bytes(args.per_request * args.width)
        texts = [payload[i : i + args.width] for i in range(0, len(payload), args.width)]
        keys = [1] * args.per_request
        requests = args.messages // args.per_request
        for first in range(0, requests, 500):  # 500 requests (segments) per transaction
            spool.append(ColumnReports([("c", keys, texts)] * min(500, requests - first)))
        filled = peak_mib()
        segments = spool.pending_segment_counts("c")
        sizes = chunk_sizes(sum(segments), MAX_BATCH_BYTES // (args.width + 32), 1)
        started = time.perf_counter()
        formed = spool.form_batch_sizes("c", sizes, default_rng().permutation, whole=True)
        seconds = time.perf_counter() - started
        spool.close()
    total = sum(segments)
    data = total * args.width / 2**20
    print(
        f"{total} messages ({data:.0f} MiB of ciphertexts) in {len(formed)} chunks, formed in {seconds:.1f} s"
    )
    print(f"peak RSS after filling {filled:.0f} MiB, after forming the release {peak_mib():.0f} MiB")


if __name__ == "__main__":
    main()
