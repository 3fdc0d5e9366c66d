"""core.backoff: exact bounds of every delay, the cap, reset after success, uniform jitter."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from deniable.core.backoff import Backoff, backoff_cap, backoff_delay
from deniable.core.rng import Csprng

FALSE_FAILURE_RATE = 1e-6
SAMPLES = 20_000


def test_backoff_grows_with_jitter_and_resets() -> None:
    now = [100.0]
    backoff = Backoff(0.5, 4.0, clock=lambda: now[0], rng=Csprng(bytes(32)))
    assert backoff.ready()
    caps = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    delays = [backoff.failed() for _ in caps]
    for delay, cap in zip(delays, caps, strict=True):
        assert cap / 2 <= delay < cap
    assert not backoff.ready()
    now[0] += 4.0
    assert backoff.ready()
    backoff.succeeded()
    assert backoff.failures == 0 and backoff.ready()
    assert 0.25 <= backoff.failed() < 0.5


@pytest.mark.parametrize("attempt", [0, 1, 2, 5, 10, 63, 64, 10_000])
def test_every_delay_lies_in_half_the_cap_to_the_cap(attempt: int) -> None:
    cap = backoff_cap(attempt, 0.05, 2.0)
    assert cap == min(2.0, 0.05 * 2.0 ** min(attempt, 64))
    for _ in range(500):
        assert cap / 2 <= backoff_delay(attempt, 0.05, 2.0) < cap


class _Extreme(Csprng):
    """A generator stuck at one value: the smallest or the largest fraction it can draw."""

    def __init__(self, high: bool) -> None:
        super().__init__(bytes(32))
        self._high = high

    def randbits(self, bits: int) -> int:
        return (1 << bits) - 1 if self._high else 0


@pytest.mark.parametrize("cap", [1e-9, 0.05, 0.3, 1.0, 3.0, 30.0, 1e6])
def test_extreme_draws_give_exactly_half_the_cap_and_just_below_the_cap(cap: float) -> None:
    assert backoff_delay(0, cap, cap, _Extreme(high=False)) == cap / 2
    highest = backoff_delay(0, cap, cap, _Extreme(high=True))
    assert highest < cap and highest >= math.nextafter(cap, 0.0) - cap * 2**-51


def test_a_zero_cap_means_no_wait() -> None:
    assert backoff_cap(3, 0.0, 1.0) == 0.0
    assert backoff_delay(3, 0.0, 1.0) == 0.0
    assert backoff_delay(3, 1.0, 0.0) == 0.0


def test_reset_after_success_starts_again_from_base() -> None:
    now = [0.0]
    backoff = Backoff(1.0, 60.0, clock=lambda: now[0])
    for _ in range(10):
        backoff.failed()
    assert 30.0 <= backoff.failed() < 60.0  # capped
    backoff.succeeded()
    assert backoff.failures == 0 and backoff.ready()
    delay = backoff.failed()
    assert 0.5 <= delay < 1.0 and backoff.not_before == now[0] + delay


def test_jitter_is_uniform_over_its_interval() -> None:
    """Kolmogorov-Smirnov against U[cap/2, cap): fails by chance with probability 1e-6.

    A jitter that favoured one end (e.g. full jitter, or no jitter at all) fails with probability ≈ 1.
    """
    cap = backoff_cap(4, 0.5, 30.0)
    fractions = [2 * backoff_delay(4, 0.5, 30.0) / cap - 1 for _ in range(SAMPLES)]
    statistic, p_value = stats.kstest(fractions, "uniform")
    assert p_value > FALSE_FAILURE_RATE, statistic
