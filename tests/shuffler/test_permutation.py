"""The shuffle is uniform: chi-square over the 24 orders of 4 reports, formed by the real store."""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

from scipy import stats

from deniable.core.rng import default_rng
from deniable.shuffler.batcher import Batcher
from deniable.shuffler.segments import SegmentSpool
from deniable.shuffler.spool import Envelope

FALSE_FAILURE_RATE = 1e-6
FORMATIONS = 2400  # 100 expected per order


def test_batch_orders_are_uniform_over_all_24_permutations(tmp_path: Path) -> None:
    """Fails by chance with probability FALSE_FAILURE_RATE (1e-6) if the shuffle is uniform.

    A shuffle that never moved anything, or favoured half the orders 2:1, fails with probability ≈ 1.
    """
    store = SegmentSpool(tmp_path / "spool.sqlite3")
    ciphertexts = [b"report-%d" % i for i in range(4)]
    store.append([Envelope(f"c{j}", 1, c) for j in range(FORMATIONS) for c in ciphertexts])
    orders: Counter[tuple[int, ...]] = Counter()
    for j in range(FORMATIONS):
        record = store.form_batch(f"c{j}", 4, default_rng().permutation)
        assert record is not None
        orders[tuple(ciphertexts.index(r.ciphertext) for r in record.reports)] += 1
    store.close()
    observed = [orders[p] for p in itertools.permutations(range(4))]
    assert sum(observed) == FORMATIONS
    statistic, p_value = stats.chisquare(observed)
    assert p_value > FALSE_FAILURE_RATE, (statistic, observed)


def test_the_batcher_shuffles_with_the_process_csprng(tmp_path: Path) -> None:
    store = SegmentSpool(tmp_path / "spool.sqlite3")
    try:
        batcher = Batcher(store, directory=None)  # type: ignore[arg-type]
        assert batcher._permutation == default_rng().permutation
    finally:
        store.close()
