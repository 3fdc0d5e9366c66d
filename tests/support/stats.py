"""Test-only helpers for the randomiser tests: exact e**x, worst ratios, payload bits, simulated rounds.

Statistics an external auditor would also use (goodness of fit, audit sizing, estimator checks,
the empirical-epsilon lower bound) are public in ``deniable.core.audit``; what is here only
serves the tests. Simulated rounds use numpy's seeded generator for reproducibility only: what
they test is the estimator given counts with the right law, never the seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction
from typing import Any, TypeVar

import numpy as np
import pytest

from deniable.core import mechanisms
from deniable.core.audit import (
    AuditResult,
    EstimatorCheck,
    audit,
    check_estimator,
    project_law,
    sufficient_samples,
)
from deniable.core.mechanisms.base import Estimate, IntArray, LocalRandomiser
from deniable.core.mechanisms.unary import BitmapOracle

Mechanism = TypeVar("Mechanism", bound=LocalRandomiser)


def created(cls: type[Mechanism], name: str | None = None, /, **params: Any) -> Mechanism:
    """``mechanisms.create`` (registry and parameter checks included) narrowed to ``cls``, whose
    registered name is the default: how the mechanism tests build the mechanism they test."""
    mech = mechanisms.create(name or cls.name, **params)
    assert isinstance(mech, cls)
    return mech


DIGITS = 60  # decimal digits of the exp behind exp_interval


def exp_interval(x: float) -> tuple[Fraction, Fraction]:
    """Rationals lo < e**x < hi (lo <= 1 for x = 0), from a correctly rounded 60-digit exp."""
    with localcontext() as ctx:
        ctx.prec = DIGITS
        value = Decimal(x).exp()  # Decimal(float) is exact; exp is correctly rounded
        ulp = Decimal(1).scaleb(value.adjusted() - DIGITS + 1)
        lo, hi = Fraction(value - ulp), Fraction(value + ulp)
    # below ~1e-59 the 60 digits see only 1; e**x > 1 + x for x > 0 keeps "lo" strict there
    return max(lo, 1 + Fraction(x)) if x > 0 else lo, hi


def law_worst_ratio(laws: Sequence[Mapping[bytes, Fraction]]) -> Fraction:
    """max over outputs o and inputs v, w of P(o | v) / P(o | w), exactly (laws: one per input).

    Every input must have the same support (else the ratio is infinite and this fails)."""
    support = set(laws[0])
    worst = Fraction(1)
    for law in laws:
        assert set(law) == support, "every input must have the same support (else the ratio is infinite)"
    for output in support:
        column = [law[output] for law in laws]
        assert min(column) > 0
        worst = max(worst, max(column) / min(column))
    return worst


def bit(payload: bytes, j: int) -> int:
    """Bit j of a big-endian bitmap payload (unary encodings, subset selection)."""
    return (payload[j // 8] >> (7 - j % 8)) & 1


def pair(payload: bytes) -> tuple[int, int]:
    """The bitmap audit's projection: bits 0 and 1 ((1, 0) carries the worst ratio for inputs 0, 1)."""
    return bit(payload, 0), bit(payload, 1)


PAIR_EVENTS = ((0, 0), (0, 1), (1, 0), (1, 1))


def big_endian_cell(payload: bytes) -> int:
    """The count cell of a payload that is its cell index, big-endian (RR, GRR, Hadamard)."""
    return int.from_bytes(payload, "big")


def multinomial_rounds(
    mech: LocalRandomiser,
    truth: Sequence[int],
    rounds: int,
    seed: int,
    cell_of: Callable[[bytes], int] = big_endian_cell,
    *,
    normalise: bool = True,
) -> IntArray:
    """Count cells of ``rounds`` independent rounds drawn from the exact law, one multinomial per value.

    numpy's seeded generator only makes the simulation reproducible; what is tested is the
    estimator given counts with the right law, not the seed (the sampler is tested on its own).
    ``normalise`` divides each cell law by its float sum first.
    """
    generator = np.random.default_rng(seed)
    counts = np.zeros((rounds, mech.count_cells), dtype=np.int64)
    for v, x in enumerate(truth):
        if x:
            law = np.zeros(mech.count_cells)
            for payload, prob in mech.output_distribution(v).items():
                law[cell_of(payload)] = float(prob)
            counts += generator.multinomial(x, law / law.sum() if normalise else law, size=rounds)
    return counts


def binomial_rounds(mech: BitmapOracle, truth: Sequence[int], rounds: int, seed: int) -> IntArray:
    """Per-bucket counts c_j = Bin(x_j, p*) + Bin(n - x_j, q*) of ``rounds`` rounds (seeded numpy).

    Bit j of a report is 1 w.p. p* for holders of j and q* for the rest, so this is the exact
    marginal law of every count (independent over j for unary encodings; subset selection's
    counts depend on each other, which per-bucket checks do not mind). The seed only makes this
    reproducible; it is not what is tested.
    """
    generator = np.random.default_rng(seed)
    n, x = sum(truth), np.asarray(truth)
    p, q = float(mech.support_true), float(mech.support_other)
    counts: IntArray = generator.binomial(x, p, size=(rounds, len(x))) + generator.binomial(
        n - x, q, size=(rounds, len(x))
    )
    return counts


def assert_estimator(
    mech: LocalRandomiser, truth: Sequence[int], counts: IntArray, alpha: float
) -> EstimatorCheck:
    """``core.audit.check_estimator`` at false-failure rate alpha; fails the test with its findings."""
    result = check_estimator(mech, truth, counts, alpha=alpha)
    assert result.passed, result.failures
    return result


def assert_refuted(
    mech: LocalRandomiser,
    ladder: Sequence[int],
    alpha: float,
    *,
    events: Sequence[Hashable] | None = None,
    event_of: Callable[[bytes], Hashable] | None = None,
) -> AuditResult:
    """``core.audit.audit`` of inputs 0 and 1 refutes the claim at the least ladder size for which
    ``sufficient_samples`` proves it must, except w.p. alpha (the false-failure rate)."""
    laws = [project_law(mech.output_distribution(v), event_of or (lambda p: p)) for v in (0, 1)]
    n = sufficient_samples(laws[0], laws[1], mech.epsilon0, ladder, alpha=alpha, miss=alpha, events=events)
    assert n is not None, "no ladder size detects this mutant reliably"
    result = audit(mech, 0, 1, n, alpha=alpha, events=events, event_of=event_of)
    assert result.refutes_claim, f"mutant not caught with n = {n}: bound {result.epsilon_lower_bound:.4f}"
    return result


def decoded_sums(mech: LocalRandomiser, values: Sequence[int], rounds: int) -> tuple[np.ndarray, list[bool]]:
    """Per round: every device through randomise, split, tally and the decoder; the "ones"
    estimate and whether its CI covers the true number of ones (multi-message sums)."""
    truth = sum(values)
    ones = np.empty(rounds)
    covered: list[bool] = []
    for r in range(rounds):
        messages = [m for p in mech.randomise_many(values) for m in mech.split_messages(p)]
        tally = mech.tally(messages)
        assert not tally.invalid.any()
        n = mech.devices(tally.counts.tolist(), len(messages))
        rows = mech.estimate(tally.counts.tolist(), n)
        assert rows[0].estimate + rows[1].estimate == n == len(values)
        ones[r] = rows[1].estimate
        covered.append(rows[1].ci_low <= truth <= rows[1].ci_high)
    return ones, covered


def assert_normal_ci(mech: LocalRandomiser, rows: Sequence[Estimate], n: int) -> None:
    """Each 95% row is estimate +- z * se, with se from ``variance`` at the estimate clipped to [0, n]."""
    from scipy import stats

    z = stats.norm.isf(0.025)
    for row in rows:
        se = math.sqrt(mech.variance([min(max(row.estimate, 0), n)], n)[0])
        assert row.std_error == pytest.approx(se, rel=1e-12)
        assert row.ci_low == pytest.approx(row.estimate - z * se, rel=1e-9, abs=1e-9)
        assert row.ci_high == pytest.approx(row.estimate + z * se, rel=1e-9, abs=1e-9)


@dataclass(frozen=True)
class Kit:
    """The helpers above as one object: the ``kit`` fixture of tests/core hands it to the protocol tests."""

    exp_interval: Callable[[float], tuple[Fraction, Fraction]] = exp_interval
    bit: Callable[[bytes, int], int] = bit
    pair: Callable[[bytes], tuple[int, int]] = pair
    pair_events: tuple[tuple[int, int], ...] = PAIR_EVENTS
    multinomial_rounds: Callable[..., IntArray] = multinomial_rounds
    binomial_rounds: Callable[..., IntArray] = binomial_rounds
    assert_estimator: Callable[[LocalRandomiser, Sequence[int], IntArray, float], EstimatorCheck] = (
        assert_estimator
    )
    assert_refuted: Callable[..., AuditResult] = assert_refuted
    decoded_sums: Callable[[LocalRandomiser, Sequence[int], int], tuple[np.ndarray, list[bool]]] = (
        decoded_sums
    )
