"""Issue 8 item 8: the poisoning bound. m fake well-formed reports move each estimate by at most the
stated budget, the bound is attained (so a smaller one would be violated), and binary RR matches its
closed form (1 - q)/(p - q) per report."""

from __future__ import annotations

import math

import numpy as np
import pytest

from deniable.core import mechanisms
from deniable.core.mechanisms import manipulation
from deniable.core.mechanisms.base import LocalRandomiser

CASES = [("binary_rr", 2, 1.0), ("grr", 5, 2.0), ("grr", 3, 0.5), ("oue", 4, 1.0), ("sue", 3, 1.5)]


def _estimates(randomiser: LocalRandomiser, counts: np.ndarray, n: int) -> np.ndarray:
    return np.array([e.estimate for e in randomiser.estimate([int(c) for c in counts], n)])


def _honest(randomiser: LocalRandomiser, n: int, seed: int) -> np.ndarray:
    generator = np.random.default_rng(seed)  # a seeded simulation, not privacy noise
    values = generator.integers(0, randomiser.domain_size, n).tolist()
    return np.asarray(randomiser.tally(randomiser.randomise_many(values)).counts, dtype=np.int64)


def _create(name: str, k: int, epsilon0: float) -> LocalRandomiser:
    try:
        return mechanisms.create(name, epsilon0=epsilon0, domain_size=k)
    except (ValueError, KeyError) as exc:  # pragma: no cover - registry names differ
        pytest.fail(f"{name}: {exc}")


@pytest.mark.parametrize(("name", "k", "epsilon0"), CASES)
def test_m_fake_reports_stay_within_the_budget_and_the_budget_is_attained(
    name: str, k: int, epsilon0: float
) -> None:
    randomiser = _create(name, k, epsilon0)
    n = 500
    counts = _honest(randomiser, n, seed=k)
    shift = manipulation.report_shift(randomiser, counts.tolist(), n)
    assert shift is not None
    m = manipulation.default_fake_reports(n)
    assert m == 5
    up, down = shift.for_reports(m)
    before = _estimates(randomiser, counts, n)
    payloads = randomiser.fake_payloads()
    assert payloads is not None
    attained_up = np.zeros(k)
    attained_down = np.zeros(k)
    for payload in payloads:  # m copies of each possible fake payload
        fake = np.asarray(randomiser.tally([payload] * m).counts, dtype=np.int64)
        moved = _estimates(randomiser, counts + fake, n + m) - before
        tolerance = 1e-7 * (1 + np.abs(before))
        assert np.all(moved <= up + tolerance), (payload, moved, up)
        assert np.all(-moved <= down + tolerance), (payload, moved, down)
        attained_up = np.maximum(attained_up, moved)
        attained_down = np.maximum(attained_down, -moved)
    np.testing.assert_allclose(attained_up, up, rtol=1e-7, atol=1e-7)  # tight: 0.99 x would fail
    np.testing.assert_allclose(attained_down, down, rtol=1e-7, atol=1e-7)
    assert np.any(attained_up > 0.99 * up + 1e-9)


@pytest.mark.parametrize(("name", "k", "epsilon0"), CASES)
def test_a_random_mix_of_fakes_stays_within_the_budget(name: str, k: int, epsilon0: float) -> None:
    randomiser = _create(name, k, epsilon0)
    counts = _honest(randomiser, 300, seed=7)
    shift = manipulation.report_shift(randomiser, counts.tolist(), 300)
    assert shift is not None
    payloads = randomiser.fake_payloads()
    assert payloads is not None
    generator = np.random.default_rng(11)
    before = _estimates(randomiser, counts, 300)
    for m in (1, 3, 17):
        up, down = shift.for_reports(m)
        chosen = [payloads[i] for i in generator.integers(0, len(payloads), m)]
        moved = _estimates(randomiser, counts + np.asarray(randomiser.tally(chosen).counts), 300 + m) - before
        assert np.all(moved <= up + 1e-7) and np.all(-moved <= down + 1e-7)


def test_binary_rr_matches_its_closed_form() -> None:
    epsilon0 = 1.0
    randomiser = _create("binary_rr", 2, epsilon0)
    shift = manipulation.report_shift(randomiser, [400, 600], 1000)
    assert shift is not None
    p = math.exp(epsilon0) / (1 + math.exp(epsilon0))
    q = 1 - p
    # A fake "yes" raises the yes estimate by (1 - q)/(p - q); a fake "no" lowers it by q/(p - q).
    assert shift.raise_per_report[1] == pytest.approx((1 - q) / (p - q), rel=1e-9)
    assert shift.lower_per_report[1] == pytest.approx(q / (p - q), rel=1e-9)


def test_the_default_rule_and_where_no_bound_is_derived() -> None:
    assert [manipulation.default_fake_reports(n) for n in (0, 1, 100, 101, 10_000)] == [1, 1, 1, 2, 100]
    # Changed by the budget branch: GRR beyond MAX_BUCKETS now has its closed form (it was None).
    big = _create("grr", manipulation.MAX_BUCKETS + 1, 1.0)
    assert manipulation.report_shift(big, [0] * big.count_cells, 0) is not None
    split = mechanisms.create("multi_message_sum", epsilon0=1.0, domain_size=2, expected_n=1000)
    assert manipulation.report_shift(split, [0] * split.count_cells, 0) is None
