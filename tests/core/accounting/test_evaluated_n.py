"""An analysis evaluated below n is stated: in the bound, the query's PrivacyStatement and its line."""

from __future__ import annotations

from deniable.cli.render import privacy_line
from deniable.core.accounting import GRRFullBlanket, best_bound
from deniable.v1 import deniable_pb2 as pb


def test_the_bound_carries_n_prime_when_the_winner_ran_below_n() -> None:
    """GRR k = 100, eps0 = 5: the full blanket wins at n = 5e5 but runs at n' < n (its budget)."""
    bound = best_bound(5.0, 500_000, 1e-6, "grr", 100)
    assert bound.analysis == GRRFullBlanket.name
    assert 0 < bound.evaluated_n < 500_000 and f"n'={bound.evaluated_n}" in bound.note
    assert best_bound(1.0, 10**6, 1e-6, "binary_rr").evaluated_n == 0  # binary RR runs at n itself


def test_the_privacy_line_says_so() -> None:
    statement = pb.PrivacyStatement(
        epsilon0=5.0, central_epsilon=0.094, delta=1e-6, analysis=GRRFullBlanket.name, amplified=True,
        smallest_batch=500_000, local_guarantee=True, evaluated_n=258_059,
    )  # fmt: skip
    assert "evaluated at n' = 258059 < 500000" in privacy_line(statement)
    statement.evaluated_n = 0
    assert "evaluated at" not in privacy_line(statement)
