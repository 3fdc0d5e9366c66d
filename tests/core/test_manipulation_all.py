"""Issue 8 item 8 for every registered mechanism: closed-form per-report shifts checked against
exhaustive enumeration (exact Fractions) and the real estimator; threshold estimators checked
against brute force over every mix of fake messages; split-and-mix sums shown unbounded."""

from __future__ import annotations

import itertools
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

from deniable.aggregator.queries import manipulation_budget
from deniable.core import mechanisms
from deniable.core.mechanisms import manipulation
from deniable.core.mechanisms.base import LocalRandomiser
from deniable.core.mechanisms.hadamard import HadamardResponse
from deniable.core.mechanisms.olh import OptimisedLocalHashing

# (name, d, epsilon0, params): small enough to enumerate every payload the randomiser can emit.
AFFINE_SMALL: list[tuple[str, int, float, dict[str, Any]]] = [
    ("binary_rr", 2, 1.0, {}),
    ("grr", 4, 2.0, {}),
    ("cheu_binary_sum", 2, 1.0, {"expected_n": 1000}),
    ("sue", 5, 1.0, {}),
    ("oue", 6, 2.0, {}),
    ("subset_selection", 6, 1.0, {"subset_size": 2}),
    ("olh", 5, 1.0, {"g": 3}),
    ("hadamard_response", 5, 1.5, {}),
]


def _create(name: str, d: int, epsilon0: float, params: dict[str, Any]) -> LocalRandomiser:
    return mechanisms.create(name, epsilon0=epsilon0, domain_size=d, **params)


def _estimates(randomiser: LocalRandomiser, counts: np.ndarray, n: int) -> np.ndarray:
    return np.array([e.estimate for e in randomiser.estimate([int(c) for c in counts], n)])


def _support(randomiser: LocalRandomiser, payload: bytes) -> list[int]:
    """Per bucket: does this one payload count towards the bucket's support (0 or 1)?"""
    cells = randomiser.tally([payload]).counts
    if isinstance(randomiser, OptimisedLocalHashing | HadamardResponse):
        return [int(x) for x in randomiser.support_counts(cells)]
    return [int(x) for x in cells[: randomiser.domain_size]]


def _exact_probabilities(randomiser: LocalRandomiser) -> tuple[Fraction, Fraction]:
    """(P[report supports v | v], P[report supports v | u != v]) as exact Fractions."""
    law0 = randomiser.output_distribution(0)
    law1 = randomiser.output_distribution(1)
    p = sum((w for pl, w in law0.items() if _support(randomiser, pl)[0]), Fraction(0))
    q = sum((w for pl, w in law1.items() if _support(randomiser, pl)[0]), Fraction(0))
    return p, q


def _emitted(randomiser: LocalRandomiser) -> list[bytes]:
    return sorted({pl for v in range(randomiser.domain_size) for pl in randomiser.output_distribution(v)})


@pytest.mark.parametrize(("name", "d", "epsilon0", "params"), AFFINE_SMALL)
def test_closed_form_equals_exhaustive_enumeration_exactly(
    name: str, d: int, epsilon0: float, params: dict[str, Any]
) -> None:
    """est_v = (S_v - n q)/(p - q) exactly (every estimator here has this form); a fake moves it by
    (t_v - q)/(p - q) with t_v in {0, 1}: the max and min over every emitted payload, in Fractions."""
    randomiser = _create(name, d, epsilon0, params)
    p, q = _exact_probabilities(randomiser)
    if isinstance(randomiser, HadamardResponse):  # (2 S - n)/(2 p_in - 1) is the same with q = 1/2
        assert q == Fraction(1, 2)
    closed = randomiser.manipulation_per_report()
    assert closed is not None
    supports = np.array([_support(randomiser, pl) for pl in _emitted(randomiser)])
    for v in range(d):
        exact_up = max((Fraction(int(t)) - q) / (p - q) for t in supports[:, v])
        exact_down = max((q - Fraction(int(t))) / (p - q) for t in supports[:, v])
        assert closed[0][v] == pytest.approx(float(exact_up), rel=1e-9)
        assert closed[1][v] == pytest.approx(float(exact_down), rel=1e-9)
        assert exact_up > 0 and exact_down > 0  # both directions are open to a single fake


@pytest.mark.parametrize(("name", "d", "epsilon0", "params"), AFFINE_SMALL)
def test_real_estimator_moves_within_the_closed_form_and_attains_it(
    name: str, d: int, epsilon0: float, params: dict[str, Any]
) -> None:
    randomiser = _create(name, d, epsilon0, params)
    generator = np.random.default_rng(d)  # a seeded simulation of honest devices, not privacy noise
    n, m = 400, 4
    honest = randomiser.randomise_many(generator.integers(0, d, n).tolist())
    counts = np.asarray(randomiser.tally(honest).counts, dtype=np.int64)
    shift = manipulation.report_shift(randomiser, counts.tolist(), n)
    assert shift is not None
    up, down = shift.for_reports(m)
    before = _estimates(randomiser, counts, n)
    seen_up, seen_down = np.zeros(d), np.zeros(d)
    for payload in _emitted(randomiser):
        fake = np.asarray(randomiser.tally([payload] * m).counts, dtype=np.int64)
        moved = _estimates(randomiser, counts + fake, n + m) - before
        tolerance = 1e-7 * (1 + np.abs(before))
        assert np.all(moved <= up + tolerance) and np.all(-moved <= down + tolerance)
        seen_up, seen_down = np.maximum(seen_up, moved), np.maximum(seen_down, -moved)
    np.testing.assert_allclose(seen_up, up, rtol=1e-7)  # attained: any smaller bound is violated
    np.testing.assert_allclose(seen_down, down, rtol=1e-7)


@pytest.mark.parametrize(
    ("name", "d", "params"),
    [("grr", 300, {}), ("oue", 40, {}), ("sue", 13, {}), ("subset_selection", 30, {"subset_size": 5})],
)
def test_beyond_enumeration_the_closed_form_holds_and_is_attained(
    name: str, d: int, params: dict[str, Any]
) -> None:
    """Where payloads are too many to list: the extreme payloads (v alone / all-but-v) hit the bound."""
    randomiser = _create(name, d, 1.0, params)
    counts, n, m = np.full(d, 50, dtype=np.int64), 50 * d, 3
    shift = manipulation.report_shift(randomiser, counts.tolist(), n)
    assert shift is not None
    up, down = shift.for_reports(m)
    before = _estimates(randomiser, counts, n)
    target = 7
    if name == "grr":
        raising, lowering = [target], [target + 1]
    else:
        size = params.get("subset_size", 1)
        raising = list(range(target, target + size))
        others = [v for v in range(d) if v != target]
        lowering = others[:size] if name == "subset_selection" else others
    for members, bound, sign in ((raising, up, 1), (lowering, down, -1)):
        payload = randomiser._bitmap(members) if name != "grr" else members[0].to_bytes(2, "big")  # type: ignore[attr-defined]
        fake = np.asarray(randomiser.tally([payload] * m).counts)
        moved = sign * (_estimates(randomiser, counts + fake, n + m) - before)
        assert np.all(moved <= bound + 1e-7 * (1 + np.abs(before)))
        assert moved[target] == pytest.approx(bound[target], rel=1e-7)


def _all_mixes(values: int, most: int) -> list[tuple[int, ...]]:
    """Every multiset of at most ``most`` message values from range(values), as per-value counts."""
    mixes = []
    for size in range(most + 1):
        for combo in itertools.combinations_with_replacement(range(values), size):
            mixes.append(tuple(combo.count(v) for v in range(values)))
    return mixes


@pytest.mark.parametrize("n_offset", [-3, 0, 2, 40])
def test_balcer_cheu_bound_is_exact_against_every_mix_of_fake_messages(n_offset: int) -> None:
    """One fake device = at most d + 2 messages of any valid values (sealed apart, so unlinkable)."""
    randomiser = _create("balcer_cheu_histogram", 2, 1.0, {"expected_n": 1000})
    n = 60
    counts = np.array([n + n_offset, n // 3, n])  # bucket 0 near the c > n threshold; presence = n
    fakes = 1
    up, down = randomiser.manipulation_at(counts.tolist(), n, fakes)  # type: ignore[misc]
    before = _estimates(randomiser, counts, n)
    worst_up, worst_down = np.zeros(2), np.zeros(2)
    for mix in _all_mixes(3, fakes * randomiser.max_messages_per_device):  # type: ignore[operator]
        after = counts + np.array(mix)
        moved = _estimates(randomiser, after, int(after[2])) - before
        worst_up, worst_down = np.maximum(worst_up, moved), np.maximum(worst_down, -moved)
    np.testing.assert_allclose(worst_up, up, atol=1e-9)
    np.testing.assert_allclose(worst_down, down, atol=1e-9)


@pytest.mark.parametrize("level", [0, 3, 9])
def test_sample_and_threshold_bound_is_exact_against_every_mix_of_fakes(level: int) -> None:
    randomiser = _create("sample_and_threshold", 3, 1.0, {})
    tau = randomiser.threshold  # type: ignore[attr-defined]
    counts = np.array([tau + level - 3, tau, tau + 5, 400])  # last cell: null messages
    fakes = 3
    up, down = randomiser.manipulation_at(counts.tolist(), 500, fakes)  # type: ignore[misc]
    before = _estimates(randomiser, counts, 500)
    worst_up, worst_down = np.zeros(3), np.zeros(3)
    for combo in itertools.combinations_with_replacement(range(4), fakes):  # one message per fake
        mix = np.array([combo.count(v) for v in range(4)])
        moved = _estimates(randomiser, counts + mix, 500 + fakes) - before
        worst_up, worst_down = np.maximum(worst_up, moved), np.maximum(worst_down, -moved)
    np.testing.assert_allclose(worst_up, up, atol=1e-9)
    np.testing.assert_allclose(worst_down, down, atol=1e-9)
    assert up[1] > fakes  # crossing tau: far more than the m/s a fake moves an already released count


def _shifted_first_share(randomiser: LocalRandomiser, payload: bytes, delta: int, width: int) -> bytes:
    """The device's payload with its first share raised by delta mod q: still a well-formed message."""
    messages = randomiser.split_messages(payload)
    first = messages[0]
    q = randomiser.modulus  # type: ignore[attr-defined]
    value = (int.from_bytes(first[-width:], "big") + delta) % q
    messages[0] = first[:-width] + value.to_bytes(width, "big")
    return b"".join(messages)


def _message_counts(randomiser: LocalRandomiser, payloads: list[bytes]) -> np.ndarray:
    return np.asarray(randomiser.tally([m for p in payloads for m in randomiser.split_messages(p)]).counts)


@pytest.mark.parametrize(
    "name", ["multi_message_sum", "multi_message_sum_binomial", "multi_message_histogram"]
)
def test_one_fake_split_and_mix_device_moves_the_sum_anywhere(name: str) -> None:
    """Without range checks one device's shares carry any residue: no finite budget exists."""
    d = 3 if name == "multi_message_histogram" else 2
    randomiser = _create(name, d, 1.0, {"expected_n": 200})
    generator = np.random.default_rng(5)
    n = 200
    honest = randomiser.randomise_many(generator.integers(0, d, n).tolist())
    q = randomiser.modulus  # type: ignore[attr-defined]
    width = randomiser.share_width if name == "multi_message_histogram" else randomiser.payload_length - 1  # type: ignore[attr-defined]
    before = _estimates(randomiser, _message_counts(randomiser, honest), n)
    for delta in (q // 4, q - q // 4):  # up by q/4, then down by q/4 (mod q)
        fake = _shifted_first_share(randomiser, randomiser.randomise(0), delta, width)
        after_counts = _message_counts(randomiser, [*honest, fake])
        after = _estimates(randomiser, np.asarray(after_counts), n + 1)
        moved = (after - before)[-1]  # the last bucket holds the shifted share's sum (sum: "ones")
        if name == "multi_message_histogram":
            moved = (after - before)[0]
        wanted = delta if delta < q // 2 else delta - q
        assert abs(moved - wanted) < 100  # exactly delta, up to the fake's own value and noise
        assert abs(moved) > 10 * n  # one device moved a count by 10x what all devices could hold
    budget = manipulation_budget(randomiser, after_counts.tolist(), n + 1)
    assert not budget.computed and budget.note.startswith("unbounded") and "mod q" in budget.note


def test_every_registered_mechanism_states_a_budget_or_why_not() -> None:
    """No mechanism is left at "not derived": a bound, a threshold bound, or "unbounded" and why."""
    params: dict[str, dict[str, Any]] = {
        "olh": {"g": 3},
        "subset_selection": {"subset_size": 2},
    }
    for name in mechanisms.names():
        cls = mechanisms.mechanism_class(name)
        extra = dict(params.get(name, {}))
        if not cls.local_privacy and name != "sample_and_threshold":
            extra["expected_n"] = 1000
        two = {"binary_rr", "cheu_binary_sum", "multi_message_sum", "multi_message_sum_binomial"}
        d = 2 if name in two else 6
        randomiser = _create(name, d, 1.0, extra)
        counts = [0] * randomiser.count_cells
        unbounded = bool(randomiser.manipulation_unbounded)
        closed = randomiser.manipulation_per_report() is not None
        threshold = randomiser.manipulation_at(counts, 1, 1) is not None
        assert unbounded + closed + threshold == 1, name
