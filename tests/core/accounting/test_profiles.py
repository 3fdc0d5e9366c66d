"""Privacy profiles delta(eps) for every registered mechanism: in [0, 1], non-increasing in eps,
and consistent with the central guarantee (at the eps a guarantee states for delta, the profile
is at most delta: both come from the same analyses)."""

from __future__ import annotations

import itertools
import math

import pytest

from deniable.core import mechanisms
from deniable.core.accounting import best_delta
from deniable.core.amplification.protocols import balcer_cheu_exact_guarantee
from deniable.core.mechanisms.balcer_cheu import BalcerCheuHistogram
from deniable.core.mechanisms.base import LocalRandomiser

N = 10_000
SHUFFLE_PARAMS = {"expected_n": float(N), "delta": 1e-6}


def build(name: str) -> LocalRandomiser:
    """Each mechanism at a setting where shuffling helps: binary where it must be, else k = 8."""
    cls = mechanisms.mechanism_class(name)
    eps = 3.0 if cls.local_privacy else 1.0
    for k in (8, 2):
        try:
            if cls.local_privacy:
                return mechanisms.create(name, epsilon0=eps, domain_size=k)
            accepted = {key: v for key, v in SHUFFLE_PARAMS.items() if key in _parameters(name)}
            return mechanisms.create(name, epsilon0=eps, domain_size=k, **accepted)
        except ValueError:
            continue
    raise AssertionError(f"{name}: no k in (8, 2) builds")


def _parameters(name: str) -> set[str]:
    import inspect

    return set(inspect.signature(mechanisms.mechanism_class(name)).parameters)


@pytest.mark.parametrize("name", mechanisms.names())
def test_profile_is_a_non_increasing_probability_consistent_with_the_guarantee(name: str) -> None:
    mech = build(name)
    grid = [0.125 * i for i in range(1, 17)]
    deltas = [mech.privacy_profile(N, eps) for eps in grid]
    assert all(0.0 <= d <= 1.0 for d in deltas)
    assert all(b <= a * (1 + 1e-9) + 1e-15 for a, b in itertools.pairwise(deltas))
    for target in (1e-4, 1e-6, 1e-8):
        bound = mech.central_guarantee(N, target)
        if math.isfinite(bound.epsilon) and bound.delta > 0:
            assert mech.privacy_profile(N, bound.epsilon) <= target * (1 + 1e-6)
        if bound.amplified and bound.epsilon > 0.01:
            # and not much slack below it: a tenth less epsilon needs a larger delta
            assert mech.privacy_profile(N, 0.9 * bound.epsilon) > target


def test_local_randomisers_take_the_pointwise_minimum_of_their_analyses() -> None:
    delta, name = best_delta(3.0, N, 0.2, "grr", 8)
    grr = mechanisms.create("grr", epsilon0=3.0, domain_size=8)
    assert grr.privacy_profile(N, 0.2) == delta and "blanket" in name
    generic, generic_name = best_delta(3.0, N, 0.2)
    assert delta <= generic and "FMT" in generic_name
    assert best_delta(3.0, N, 3.0) == (0.0, best_delta(3.0, N, 5.0)[1])  # the local guarantee
    assert best_delta(3.0, 1, 0.5)[0] == 1.0  # one report hides among nobody
    with pytest.raises(ValueError):
        best_delta(3.0, N, -0.1)


def test_balcer_cheu_profile_inverts_its_exact_guarantee() -> None:
    mech = mechanisms.create("balcer_cheu_histogram", epsilon0=1.0, domain_size=8, expected_n=N)
    assert isinstance(mech, BalcerCheuHistogram)
    for target in (1e-5, 1e-7):
        eps = balcer_cheu_exact_guarantee(mech.skip, N, target).epsilon
        assert mech.privacy_profile(N, eps) <= target
        assert mech.privacy_profile(N, eps * (1 - 1e-4)) > target
    assert mech.privacy_profile(N, 3.0) <= mech.privacy_profile(N, 2.0)
