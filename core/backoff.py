"""One retry backoff for client, forwarder and MQTT ingress: exponential, capped, "equal jitter".

The n-th consecutive failure (n = 0, 1, ...) waits uniformly in [cap_n / 2, cap_n), where
cap_n = min(max_s, base_s * 2**n); the jitter comes from the CSPRNG (ADR 0026). Equal jitter keeps
a floor of half the cap, so retries still back off exponentially, and spreads a crowd of
reconnecting peers over a factor of two.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Final

from deniable.core.rng import Csprng, default_rng

_FRACTION_BITS: Final = 52
"""Bits of the jitter fraction: with 52, 1 + fraction is exact in a double, so the delay stays < cap."""
_MAX_DOUBLINGS: Final = 64


def backoff_cap(attempt: int, base_s: float, max_s: float) -> float:
    """The upper end of the ``attempt``-th delay (0-based): base_s * 2**attempt, at most max_s."""
    return max(0.0, min(max_s, base_s * 2.0 ** min(max(attempt, 0), _MAX_DOUBLINGS)))


def backoff_delay(attempt: int, base_s: float, max_s: float, rng: Csprng | None = None) -> float:
    """The ``attempt``-th delay (0-based): uniform in [cap/2, cap) from the CSPRNG; 0 if cap is 0."""
    cap = backoff_cap(attempt, base_s, max_s)
    if cap <= 0:
        return 0.0
    fraction = (rng or default_rng()).randbits(_FRACTION_BITS) / float(1 << _FRACTION_BITS)
    return min(cap * (1.0 + fraction) / 2.0, math.nextafter(cap, 0.0))


class Backoff:
    """Consecutive failures of one thing (a batch, a connection) and when it may be tried again."""

    def __init__(
        self,
        base_s: float,
        max_s: float,
        clock: Callable[[], float] = time.monotonic,
        rng: Csprng | None = None,
    ) -> None:
        """Delays start at ``base_s`` and double per consecutive failure up to ``max_s``."""
        self._base_s = base_s
        self._max_s = max_s
        self._clock = clock
        self._rng = rng
        self.failures = 0
        self.not_before = -math.inf

    def ready(self) -> bool:
        """Whether the next attempt may be made now."""
        return self._clock() >= self.not_before

    def failed(self) -> float:
        """Record a failure; return the delay before the next attempt (``backoff_delay``)."""
        delay = backoff_delay(self.failures, self._base_s, self._max_s, self._rng)
        self.failures += 1
        self.not_before = self._clock() + delay
        return delay

    def succeeded(self) -> None:
        """Reset after a success: the next failure waits about ``base_s`` again."""
        self.failures = 0
        self.not_before = -math.inf
