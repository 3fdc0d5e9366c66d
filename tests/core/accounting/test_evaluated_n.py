"""An analysis evaluated below n is stated: in the bound, the query's PrivacyStatement and its line."""

from __future__ import annotations

import pytest

from deniable.core.accounting import GRRFullBlanket, best_bound
from deniable.core.accounting.accountant import clear_cache
from deniable.core.amplification import _blanket
from deniable.core.amplification.analyses import _cached_full_blanket_epsilon
from deniable.sim.render import privacy_line
from deniable.v1 import deniable_pb2 as pb


def test_the_bound_carries_n_prime_when_the_winner_ran_below_n(monkeypatch: pytest.MonkeyPatch) -> None:
    """GRR k = 100, eps0 = 5, n = 5e5: the full blanket wins and now runs at n (u blocked, issue 9
    item 6); with the blocked evaluation made unaffordable it runs at n' < n and says so."""
    assert best_bound(5.0, 500_000, 1e-6, "grr", 100).evaluated_n == 0
    clear_cache()
    _cached_full_blanket_epsilon.cache_clear()
    monkeypatch.setattr(_blanket, "blocked_cells", lambda others, blanket, k: 4 * others)
    bound = best_bound(5.0, 500_000, 1e-6, "grr", 100)
    assert bound.analysis == GRRFullBlanket.name
    assert 0 < bound.evaluated_n < 500_000 and f"n'={bound.evaluated_n}" in bound.note
    clear_cache()
    assert best_bound(1.0, 10**6, 1e-6, "binary_rr").evaluated_n == 0  # binary RR runs at n itself


def test_the_privacy_line_says_so() -> None:
    statement = pb.PrivacyStatement(
        epsilon0=5.0, central_epsilon=0.094, delta=1e-6, analysis=GRRFullBlanket.name, amplified=True,
        smallest_batch=500_000, local_guarantee=True, evaluated_n=258_059,
    )  # fmt: skip
    assert "evaluated at n' = 258059 < 500000" in privacy_line(statement)
    statement.evaluated_n = 0
    assert "evaluated at" not in privacy_line(statement)
