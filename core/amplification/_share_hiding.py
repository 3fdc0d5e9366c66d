"""The split-and-mix share-hiding bound, valid for every batch of at least n devices.

Derivation: docs/mechanisms/multi_message_sum_binomial.md ("Theorem", steps 1-5). With
w(j, k) = C(j-1, k) C(j, k) / C(jm, km), Phi(1) = 1 and

    Phi(j) = 1 + (q - 1) sum_{k=1}^{j-1} w(j, k) Phi(j - k),

the shuffled shares of any j devices are within TV 1/2 sqrt(Phi(j) - 1) of uniform shares with the
same sum. The bound the protocols state, ``envelope_excess(n, m, q)``, is an upper bound on
sup_{j >= n} Phi(j) - 1: a statement made at the smallest batch then holds for every larger batch
(the aggregator states a release at its smallest batch), with no monotonicity of Phi assumed.

How (step 5 of the proof). Phi(j) is computed exactly (in floats, log space) for j <= J. Beyond J
three facts, proved in the document for m >= 3, bound Phi(j) for every j > J at once:
(a) w(j, k) <= C(j, k)^(2-m) (Vandermonde: C(jm, km) >= C(j, k)^m);
(b) for fixed k, w(j, k) and w(j, j - k) do not increase with j;
(c) j C(j, K+1)^(2-m) does not increase with j.
Splitting the sum into k <= K (near: Phi(j - k) at large indices), K < k < j - K (middle) and
k >= j - K (far: Phi(i) for i <= K, known), every weight is at most its value at J + 1, so an
induction on j shows Phi(j) <= 1 + u for all j > J as soon as u solves the fixed-point inequality
``_fixed_point``. The same three facts at n > J bound sup_{j >= n} Phi(j) by weights taken at n.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    import numpy as np
else:
    from deniable.core.lazy import numpy as np

EXACT_MAX_N: Final = 3000  # Phi is computed exactly up to here (O(J^2), ~0.3 s at 3000, cached)
NEAR: Final = 8  # K: near and far terms taken one by one beyond J
_LOG_HUGE: Final = 700.0  # exp() of more overflows: no bound


def _log_choose(a: int, b: int) -> float:
    return math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(a - b + 1)


def _margin(j: int, m: int) -> float:
    """Relative upward margin for a log-gamma difference at arguments up to jm: lgamma of x is
    exact to a few ulps of x ln x, so 1e-13 x ln x covers the rounding (1e-6 at jm = 8e5)."""
    size = j * m + 2
    return math.exp(1e-13 * size * math.log(size) + 1e-12)


def _weight(j: int, k: int, m: int) -> float:
    """w(j, k) = C(j - 1, k) C(j, k) / C(jm, km), rounded up."""
    log_w = _log_choose(j - 1, k) + _log_choose(j, k) - _log_choose(j * m, k * m)
    return math.exp(log_w) * _margin(j, m)


def _middle(j: int, m: int) -> float:
    """j C(j, K+1)^(2-m): bounds the sum of w(j, k) over K < k < j - K (facts a and c)."""
    return math.exp(math.log(j) - (m - 2) * _log_choose(j, NEAR + 1)) * _margin(j, m)


@functools.lru_cache(maxsize=64)
def exact_log_excess(top: int, m: int, q: int) -> tuple[float, ...]:
    """log(Phi(j) - 1) for j = 0..top (-inf for j <= 1), from the recursion in log space."""
    total = top * m
    log_fact = np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, total + 1, dtype=np.float64)))))

    def log_choose(a: np.ndarray | int, b: np.ndarray) -> np.ndarray:
        return np.asarray(log_fact[a] - log_fact[b] - log_fact[np.asarray(a) - b], dtype=np.float64)

    log_q1 = math.log(q - 1)
    log_phi = np.zeros(top + 1)
    excess = [-math.inf] * (top + 1)
    for j in range(2, top + 1):
        k = np.arange(1, j)
        terms = log_choose(j - 1, k) + log_choose(j, k) - log_choose(j * m, k * m) + log_phi[j - k]
        peak = float(terms.max())
        excess[j] = log_q1 + peak + math.log(float(np.exp(terms - peak).sum()))
        log_phi[j] = float(np.logaddexp(0.0, excess[j]))
    return tuple(excess)


def _excess(log_excess: tuple[float, ...], i: int) -> float:
    return math.exp(log_excess[i]) if log_excess[i] > -math.inf else 0.0


def _fixed_point(top: int, m: int, q: int, log_excess: tuple[float, ...]) -> float | None:
    """u with Phi(j) <= 1 + u for every j > top (induction on j), or None when none is found.

    For j > top: Phi(j) - 1 <= (q-1) [(1 + max(u, top_near)) a + (1 + max(u, g)) mid + far], with
    a, mid, far the near, middle and far weights at top + 1 (facts b, c) and top_near, g the largest
    exact excesses among the near indices and among all indices <= top.
    """
    if max(log_excess) > _LOG_HUGE:
        return None
    j = top + 1
    near = sum(_weight(j, k, m) for k in range(1, NEAR + 1))
    mid = _middle(j, m)
    far = sum(_weight(j, j - i, m) * (1 + _excess(log_excess, i)) for i in range(1, NEAR + 1))
    top_near = max(_excess(log_excess, i) for i in range(top - NEAR + 1, top + 1))
    g = max(_excess(log_excess, i) for i in range(top + 1))
    slope = (q - 1) * near
    if slope >= 1:
        return None
    u = max(top_near, (q - 1) * (near + (1 + g) * mid + far) / (1 - slope))
    check = (q - 1) * ((1 + max(u, top_near)) * near + (1 + max(u, g)) * mid + far)
    return u if check <= u and math.isfinite(u) else None


def _beyond(n: int, top: int, m: int, q: int, log_excess: tuple[float, ...], u: float) -> float:
    """sup_{j >= n} Phi(j) - 1 for n > top + NEAR, from the weights at n (facts b, c): every
    Phi(j - k) with k <= K is beyond top (at most 1 + u), the middle ones at most 1 + max(u, g)."""
    g = max(u, max(_excess(log_excess, i) for i in range(top + 1)))
    near = sum(_weight(n, k, m) for k in range(1, NEAR + 1))
    far = sum(_weight(n, n - i, m) * (1 + _excess(log_excess, i)) for i in range(1, NEAR + 1))
    return (q - 1) * ((1 + u) * near + (1 + g) * _middle(n, m) + far)


@functools.lru_cache(maxsize=256)
def envelope_excess(n: int, m: int, q: int) -> float:
    """An upper bound on sup_{j >= n} Phi(j) - 1 (inf when none is proved: m < 3, or the tail
    induction fails even at J = EXACT_MAX_N)."""
    if m < 3 or n < 2:
        return math.inf
    top = max(min(n, EXACT_MAX_N), 2 * NEAR + 2)
    while True:
        log_excess = exact_log_excess(top, m, q)
        u = _fixed_point(top, m, q, log_excess)
        if u is not None or top >= EXACT_MAX_N:
            break
        top = min(2 * top, EXACT_MAX_N)
    if u is None:
        return math.inf
    if n > top + NEAR:
        return _beyond(n, top, m, q, log_excess, u)
    inside = max((_excess(log_excess, j) for j in range(n, top + 1)), default=0.0)
    return max(inside, u)


def share_distance(n: int, m: int, q: int) -> float:
    """1/2 sqrt(sup_{j >= n} Phi(j) - 1), at most 1: the TV bound for every batch of >= n devices."""
    excess = envelope_excess(int(n), int(m), int(q))
    return 1.0 if not math.isfinite(excess) else min(1.0, 0.5 * math.sqrt(excess * (1 + 1e-9)))
