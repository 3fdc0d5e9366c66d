"""The public audit API: sound on honest randomisers, refutes over-claiming ones."""

from __future__ import annotations

from deniable.core import mechanisms
from deniable.core.audit import audit, epsilon_lower_bound
from deniable.core.mechanisms.direct import GeneralisedRandomisedResponse


def test_honest_grr_is_not_refuted() -> None:
    """Sound at level alpha = 1e-6: a refutation of an honest randomiser has probability <= 1e-6."""
    result = audit(mechanisms.create("grr", epsilon0=1.0, domain_size=4), 0, 1, 40_000)
    assert not result.refutes_claim
    assert 0.5 < result.epsilon_lower_bound <= 1.0  # also shows the audit has power


class _OverClaimingGRR(GeneralisedRandomisedResponse):
    """Runs at 2 epsilon0 while claiming epsilon0."""

    def __init__(self, epsilon0: float, domain_size: int) -> None:
        super().__init__(2 * epsilon0, domain_size)
        self.epsilon0 = epsilon0


def test_over_claiming_mutant_is_refuted() -> None:
    """At 40k samples the 2x mutant (true eps 2, claimed 1) is caught except with negligible chance."""
    assert audit(_OverClaimingGRR(1.0, 4), 0, 1, 40_000).refutes_claim


def test_bound_is_zero_without_evidence() -> None:
    assert epsilon_lower_bound({}, 10, {}, 10, [b"x"], 1e-6) == 0.0
