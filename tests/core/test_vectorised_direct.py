"""Vectorised ``randomise_many`` of binary RR and GRR: the same exact law as ``randomise``.

Two kinds of evidence:

- exactness: with a fixed-key CSPRNG, the vectorised output equals the scalar decision rule
  applied, in Python integers, to the very same draws (same thresholds, same arithmetic);
- law: chi-square goodness of fit of many vectorised outputs against the exact output
  distribution (``output_distribution``, Fractions), per true value, and a homogeneity test
  against the scalar ``randomise``.

False-failure rate: every statistical assertion uses the threshold ``ALPHA`` below, chosen so that
all of them together fail by chance with probability at most FALSE_FAILURE_RATE = 1e-6 (Bonferroni).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from deniable.core import mechanisms
from deniable.core.mechanisms.direct import (
    BinaryRandomisedResponse,
    GeneralisedRandomisedResponse,
)
from deniable.core.rng import Csprng

FALSE_FAILURE_RATE = 1e-6
# binary: 2 epsilons x 2 values; grr: 2 configs x their values (5 + 3); homogeneity: 1.
STATISTICAL_TESTS = 4 + 8 + 1
ALPHA = FALSE_FAILURE_RATE / STATISTICAL_TESTS
DRAWS_PER_VALUE = 20_000


def _goodness_of_fit(outputs: list[bytes], law: dict[bytes, Fraction]) -> float:
    """p-value of observed payload counts against the exact law (every payload of the law a cell)."""
    cells = sorted(law)
    unexpected = set(outputs) - set(cells)
    assert not unexpected, f"payloads outside the law: {sorted(unexpected)[:3]}"
    observed = [outputs.count(cell) for cell in cells]
    expected = [float(law[cell]) * len(outputs) for cell in cells]
    assert min(expected) >= 5, "too few draws for a chi-square test"
    return float(stats.chisquare(observed, expected).pvalue)


@pytest.mark.parametrize("epsilon0", [0.5, 2.0])
def test_binary_rr_vectorised_law_matches_the_exact_law(epsilon0: float) -> None:
    randomiser = BinaryRandomisedResponse(epsilon0)
    values = [0, 1] * DRAWS_PER_VALUE
    outputs = randomiser.randomise_many(values)
    for value in (0, 1):
        mine = outputs[value::2]
        p_value = _goodness_of_fit(mine, randomiser.output_distribution(value))
        assert p_value > ALPHA, (epsilon0, value, p_value)


@pytest.mark.parametrize(("epsilon0", "k"), [(1.0, 5), (3.0, 3)])
def test_grr_vectorised_law_matches_the_exact_law(epsilon0: float, k: int) -> None:
    randomiser = GeneralisedRandomisedResponse(epsilon0, k)
    values = [i % k for i in range(k * DRAWS_PER_VALUE)]  # interleaved: every value, everywhere
    outputs = randomiser.randomise_many(values)
    for value in range(k):
        mine = outputs[value::k]
        p_value = _goodness_of_fit(mine, randomiser.output_distribution(value))
        assert p_value > ALPHA, (epsilon0, k, value, p_value)


def test_grr_vectorised_and_scalar_outputs_are_homogeneous() -> None:
    randomiser = GeneralisedRandomisedResponse(1.0, 4)
    scalar = [randomiser.randomise(2) for _ in range(8000)]
    vector = randomiser.randomise_many([2] * 8000)
    cells = sorted(randomiser.output_distribution(2))
    table = [[scalar.count(c) for c in cells], [vector.count(c) for c in cells]]
    p_value = float(stats.chi2_contingency(table).pvalue)
    assert p_value > ALPHA, (table, p_value)


def test_binary_rr_vectorised_applies_the_exact_integer_threshold_to_the_same_draws() -> None:
    key = bytes(range(32))
    randomiser = BinaryRandomisedResponse(1.0)
    values = [i % 2 for i in range(5000)]
    outputs = randomiser.randomise_many(values, Csprng(key))
    draws = Csprng(key).uint64_array(len(values)).tolist()
    threshold = randomiser._keep_threshold
    assert randomiser.keep_probability == Fraction(threshold, 1 << 64)
    expected = [bytes((v ^ int(d >= threshold),)) for v, d in zip(values, draws, strict=True)]
    assert outputs == expected


@pytest.mark.parametrize(("epsilon0", "k"), [(1.0, 7), (0.25, 1024), (5.0, 300)])
def test_grr_vectorised_follows_the_scalar_rule_on_the_same_draws(epsilon0: float, k: int) -> None:
    key = bytes(range(1, 33))
    randomiser = GeneralisedRandomisedResponse(epsilon0, k)
    values = [(7 * i) % k for i in range(4000)]
    outputs = randomiser.randomise_many(values, Csprng(key))
    draws = Csprng(key).randbelow_array(randomiser._total_weight, len(values)).tolist()
    keep_weight, other_weight = randomiser._keep_weight, 1 << 40
    expected = []
    for value, draw in zip(values, draws, strict=True):  # the scalar formula, in exact integers
        keep = int(draw < keep_weight)
        other_index = max(draw - keep_weight, 0) // other_weight
        other = other_index + int(other_index >= value)
        expected.append(randomiser._pack(keep * value + (1 - keep) * other))
    assert outputs == expected


def test_grr_with_a_weight_beyond_2_62_takes_the_exact_scalar_path() -> None:
    randomiser = GeneralisedRandomisedResponse(1.0, (1 << 22) + 2)
    assert randomiser._total_weight > 1 << 62
    outputs = randomiser.randomise_many([0, 5, (1 << 22) + 1])
    assert all(len(o) == randomiser.payload_length for o in outputs)
    assert randomiser.tally(outputs).valid_count == 3


@pytest.mark.parametrize("name", ["binary_rr", "grr"])
def test_randomise_many_checks_values_like_randomise(name: str) -> None:
    randomiser = mechanisms.create(name, epsilon0=1.0, domain_size=2)
    assert randomiser.randomise_many([]) == []
    assert len(randomiser.randomise_many(np.array([0, 1, 1], dtype=np.uint8))) == 3  # type: ignore[arg-type]
    assert len(randomiser.randomise_many([True, False])) == 2
    for bad in ([0, 2], [-1], [0.5], ["1"]):
        with pytest.raises(ValueError):
            randomiser.randomise_many(bad)  # type: ignore[arg-type]


def test_tally_of_vectorised_outputs_counts_every_report() -> None:
    randomiser = GeneralisedRandomisedResponse(1.0, 1024)
    outputs = randomiser.randomise_many([i % 1024 for i in range(10_240)])
    tally = randomiser.tally(outputs)
    assert tally.valid_count == 10_240 and int(tally.counts.sum()) == 10_240
