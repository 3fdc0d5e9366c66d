"""The FMT 2021 closed form as an analysis: its inverted privacy profile and its validity condition."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from deniable.core.accounting import FMT21ClosedForm, NotApplicable, fmt21_closed_form


@pytest.mark.parametrize(("eps0", "n"), [(0.5, 10_000), (1.0, 100_000), (4.0, 10**6)])
def test_profile_inverts_the_closed_form(eps0: float, n: int) -> None:
    analysis = FMT21ClosedForm(eps0, n)
    for delta in (1e-4, 1e-6, 1e-9):
        eps = fmt21_closed_form(eps0, n, delta).epsilon
        assert analysis.epsilon_for_delta(delta) == eps
        back = analysis.delta_for_epsilon(eps)
        assert back <= delta * (1 + 1e-9)
        assert back == pytest.approx(delta, rel=1e-6)
        assert fmt21_closed_form(eps0, n, back).epsilon <= eps


def test_profile_respects_the_validity_condition_and_decreases() -> None:
    analysis = FMT21ClosedForm(2.0, 5000)
    values = [analysis.delta_for_epsilon(float(e)) for e in np.linspace(0, 2.0, 50)]
    assert all(b <= a for a, b in itertools.pairwise(values))
    assert values[0] == 1.0 and values[-1] == 0.0
    smallest = min(v for v in values if v > 0)
    assert smallest >= 2 * np.exp(-5000 / (16 * np.exp(2.0)))


def test_not_applicable_outside_its_condition() -> None:
    analysis = FMT21ClosedForm(4.0, 1000)
    assert analysis.not_applicable_reason(1e-6) is not None
    with pytest.raises(NotApplicable):
        analysis.epsilon_for_delta(1e-6)
    bound = analysis.bound(1e-6)
    assert not bound.amplified and bound.epsilon == 4.0 and "not applicable" in bound.note
