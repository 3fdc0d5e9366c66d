"""The public audit API: sound on honest randomisers, refutes over-claiming ones; its planning,
goodness-of-fit and estimator checks pass what is right and catch what is wrong."""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import pytest

from deniable.core import mechanisms
from deniable.core.audit import (
    audit,
    audit_cannot_miss,
    check_estimator,
    chi_square_fit,
    epsilon_lower_bound,
    project_law,
    sampled_rounds,
    sufficient_samples,
)
from deniable.core.mechanisms.direct import GeneralisedRandomisedResponse
from deniable.core.rng import Csprng


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


# ----------------------------------------------------------------------------- planning an audit

LADDER = (1000, 2000, 5000, 10_000, 20_000, 40_000)


def test_project_law_adds_up_the_outputs_of_each_event() -> None:
    law = mechanisms.create("grr", epsilon0=1.0, domain_size=4).output_distribution(0)
    halves = project_law(law, lambda payload: payload[0] // 2)
    assert halves == {0: law[b"\x00"] + law[b"\x01"], 1: law[b"\x02"] + law[b"\x03"]}


def test_audit_sizing_never_promises_to_refute_a_true_claim() -> None:
    """Deterministic: at any size the honest GRR's audit may stay below its claim, not below half."""
    honest = mechanisms.create("grr", epsilon0=1.0, domain_size=4)
    laws = [honest.output_distribution(v) for v in (0, 1)]
    assert not audit_cannot_miss(laws[0], laws[1], 10**7, honest.epsilon0)
    assert sufficient_samples(laws[0], laws[1], honest.epsilon0, LADDER) is None
    assert audit_cannot_miss(laws[0], laws[1], 100_000, honest.epsilon0 / 2)
    assert not audit_cannot_miss(laws[0], laws[1], 1000, honest.epsilon0 / 2)


def test_sufficient_samples_sizes_an_audit_that_refutes_the_over_claimer() -> None:
    """The planned audit refutes the 2x mutant; it fails to with probability <= 1e-6 (miss)."""
    mutant = _OverClaimingGRR(1.0, 4)
    laws = [mutant.output_distribution(v) for v in (0, 1)]
    n = sufficient_samples(laws[0], laws[1], mutant.epsilon0, LADDER)
    assert n is not None and n < LADDER[-1]
    assert audit(mutant, 0, 1, n).refutes_claim


# ----------------------------------------------------------------------------- goodness of fit


def test_chi_square_fit_accepts_the_law_and_rejects_a_shift() -> None:
    """Deterministic: counts at their expectations fit; moving 300 of 10,000 reports is ~8 sigma off."""
    law = mechanisms.create("grr", epsilon0=1.0, domain_size=4).output_distribution(0)
    expected = {out: round(10_000 * float(p)) for out, p in law.items()}
    fit = chi_square_fit(expected, law)
    assert not fit.rejects and fit.cells == 4 and fit.statistic < 0.01
    shifted = {**expected, b"\x00": expected[b"\x00"] - 300, b"\x01": expected[b"\x01"] + 300}
    assert chi_square_fit(shifted, law).rejects
    with pytest.raises(ValueError, match="support"):
        chi_square_fit({**expected, b"\x07": 1}, law)
    with pytest.raises(ValueError, match="too few"):
        chi_square_fit({b"\x00": 3}, law)


def test_chi_square_fit_pools_outputs_expected_fewer_than_5_times() -> None:
    law = mechanisms.create("grr", epsilon0=4.0, domain_size=100).output_distribution(0)
    expected = {out: round(500 * float(p)) for out, p in law.items()}  # the 99 others: 3.3 each
    fit = chi_square_fit(expected, law)
    assert fit.cells == 2 and not fit.rejects


def test_fit_false_rejection_rate_is_at_most_alpha_exactly_where_pearson_is_not() -> None:
    """Exact, not sampled: a law with a rare output (expected 6.7 times in 20,000) and every
    possible count of it. Rejecting on Pearson's chi-square critical value would fail an honest
    sampler ~10 times as often as alpha; the exact per-cell decision stays at most alpha."""
    from scipy import stats

    law = {b"\x00": Fraction(1, 3000), b"\x01": Fraction(2999, 3000)}
    n, alpha = 20_000, 1e-6
    exact_rate = pearson_rate = 0.0
    for rare in range(0, 400):
        fit = chi_square_fit({b"\x00": rare, b"\x01": n - rare}, law, alpha)
        probability = float(stats.binom.pmf(rare, n, 1 / 3000))
        exact_rate += probability * fit.rejects
        pearson_rate += probability * (fit.statistic > fit.critical)
    assert exact_rate <= alpha < pearson_rate / 5


# ----------------------------------------------------------------------------- the estimator


def test_check_estimator_passes_the_real_estimator_and_catches_a_wrong_truth() -> None:
    """200 real rounds of 1,000 reports: the estimator passes (false failure <= 1e-6); held to a
    truth 50 off in two buckets (~40 standard errors of the mean), it is flagged as biased."""
    mech = mechanisms.create("grr", epsilon0=2.0, domain_size=4)
    truth = [600, 300, 100, 0]
    counts = sampled_rounds(mech, truth, 200)
    assert counts.shape == (200, 4) and (counts.sum(axis=1) == 1000).all()
    result = check_estimator(mech, truth, counts)
    assert result.passed, result.failures
    wrong = check_estimator(mech, [650, 250, 100, 0], counts)
    assert not wrong.passed and wrong.failures[0].startswith("biased")
    with pytest.raises(ValueError):
        check_estimator(mech, [600, 400], counts)


class _Garbling(GeneralisedRandomisedResponse):
    """Emits payloads its own tally rejects."""

    def randomise_many(self, values: Sequence[int], rng: Csprng | None = None) -> list[bytes]:
        return [b"\xff\xff"] * len(values)


def test_sampled_rounds_refuses_payloads_the_tally_rejects() -> None:
    with pytest.raises(ValueError, match="rejected"):
        sampled_rounds(_Garbling(1.0, 4), [1, 1, 0, 0], 1)
