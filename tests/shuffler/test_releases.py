"""Release-level shuffling (ADR 0023): one CSPRNG permutation over everything released together,
cut into chunks that fit the byte limit, each chunk carrying its place in the release; durable
across a killed shuffler."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from scipy import stats

from deniable.core.rng import default_rng
from deniable.shuffler.columns import ColumnReports
from deniable.shuffler.segments import SegmentSpool
from deniable.v1 import deniable_pb2 as pb

REQUESTS, PER_REQUEST, CHUNKS = 40, 25, 4
TOTAL = REQUESTS * PER_REQUEST
LATE = 10  # the last LATE requests: late arrivals


def _fill(spool: SegmentSpool) -> None:
    """REQUESTS requests of PER_REQUEST reports; a ciphertext's first two bytes name its request."""
    for request in range(REQUESTS):
        texts = [bytes([request, i]) + bytes(30) for i in range(PER_REQUEST)]
        spool.append(ColumnReports([("c", [1] * PER_REQUEST, texts)]))


def test_the_first_chunk_holds_late_requests_at_the_rate_of_one_permutation(tmp_path: Path) -> None:
    """Chunk membership is not order of arrival: the first chunk of a whole-request release holds
    reports of the LATE last requests at the hypergeometric rate of one uniform permutation.

    Before ADR 0023 (each chunk permuted on its own, cut in arrival order) the first chunk held
    none of them, which this test refuses. Acceptance region [27, 98] around the mean 62.5; its
    exact false-failure rate, computed below, is below 1e-8.
    """
    spool = SegmentSpool(tmp_path / "spool.sqlite3")
    try:
        _fill(spool)
        size = TOTAL // CHUNKS
        formed = spool.form_batch_sizes("c", [size] * CHUNKS, default_rng().permutation, whole=True)
        batches = [pb.ShuffledBatch.FromString(spool.load_wire(b.batch_id)[0]) for b in formed]  # type: ignore[index]
    finally:
        spool.close()
    late = LATE * PER_REQUEST
    law = stats.hypergeom(TOTAL, late, size)  # reports drawn, late ones among them, chunk size
    low, high = 27, 98
    assert law.cdf(low - 1) + law.sf(high) < 1e-8  # the stated false-failure rate
    first = sum(1 for r in batches[0].reports if r.ciphertext[0] >= REQUESTS - LATE)
    assert low <= first <= high, first
    assert len({b.release_id for b in batches}) == 1
    assert [(b.chunk_index, b.chunk_count, b.release_messages) for b in batches] == [
        (i, CHUNKS, TOTAL) for i in range(CHUNKS)
    ]
    every = sorted(r.ciphertext for b in batches for r in b.reports)
    assert len(every) == TOTAL == len(set(every))


_KILLED = """
import json, os, signal, sys
from pathlib import Path
from deniable.core.rng import default_rng
from deniable.shuffler.segments import SegmentSpool
sys.path.insert(0, {here!r})
from test_releases import _fill
spool = SegmentSpool(Path({path!r}))
_fill(spool)
formed = spool.form_batch_sizes("c", [250] * 4, default_rng().permutation, whole=True)
spool.delete_batch(formed[0].batch_id)  # chunk 0 acknowledged
wires = {{b.batch_id: spool.load_wire(b.batch_id)[0].hex() for b in formed[1:]}}
Path({out!r}).write_text(json.dumps(wires))
os.kill(os.getpid(), signal.SIGKILL)  # killed between chunks: no close, nothing flushed by us
"""


def test_a_shuffler_killed_between_chunks_resumes_without_reshuffling_or_losing(tmp_path: Path) -> None:
    """The release's chunks are stored in the transaction that formed them: after a SIGKILL between
    chunks the reopened spool holds exactly the unsent chunks, byte for byte (same ids, same order),
    and nothing pending to shuffle again."""
    path, out = tmp_path / "spool.sqlite3", tmp_path / "wires.json"
    script = _KILLED.format(here=str(Path(__file__).parent), path=str(path), out=str(out))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], timeout=120, check=False)
    assert done.returncode == -signal.SIGKILL
    before = json.loads(out.read_text())
    spool = SegmentSpool(path)
    try:
        assert spool.pending_count("c") == 0  # nothing left to re-shuffle
        after = {batch_id: spool.load_wire(batch_id)[0].hex() for batch_id in spool.batch_ids("c")}  # type: ignore[index]
    finally:
        spool.close()
    assert after == before and len(after) == 3
    chunks = [pb.ShuffledBatch.FromString(bytes.fromhex(w)) for w in after.values()]
    assert sorted(c.chunk_index for c in chunks) == [1, 2, 3]
    assert os.path.exists(path)
