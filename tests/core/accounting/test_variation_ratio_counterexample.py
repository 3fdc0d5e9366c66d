"""Why Wang et al.'s variation-ratio pair is not in the accountant (docs/amplification.md §5).

Read as in the paper's reference code, the pair for k-ary randomised response has each of the
n - 1 other users report symbol 0 or 1 with probability r = αp/q each (else a residual symbol 2)
and the victim report (0, 1, 2) with probabilities (αp, α, 1 - α(1 + p)) under P and (α, αp, ...)
under Q, with p = q = e^ε0 and α = β/(p - 1), β = (e^ε0 - 1)/(e^ε0 + k - 1). At k = 3, n = 5,
ε0 = 1 the hockey-stick divergence of that pair at ε = 0.99 is about 1.2e-5, while the real shuffled
GRR histogram, worst case over the other users' values, has 6.3e-4: the pair does not dominate the
real view, so a bound computed from it would understate δ. Both sides are computed exactly here,
so this test fails if either computation changes (and is the reason the analysis stays out).
"""

from __future__ import annotations

import itertools
import math

K, N, EPS0, EPS = 3, 5, 1.0, 0.99


def _hockey_stick(p: dict[tuple[int, ...], float], q: dict[tuple[int, ...], float], eps: float) -> float:
    return sum(max(0.0, p.get(h, 0.0) - math.exp(eps) * q.get(h, 0.0)) for h in set(p) | set(q))


def _histogram_law(laws: list[list[float]]) -> dict[tuple[int, ...], float]:
    """Law of the histogram of independent reports with the given output laws (exact enumeration)."""
    law: dict[tuple[int, ...], float] = {(0,) * len(laws[0]): 1.0}
    for output in laws:
        nxt: dict[tuple[int, ...], float] = {}
        for hist, mass in law.items():
            for symbol, prob in enumerate(output):
                key = tuple(c + (i == symbol) for i, c in enumerate(hist))
                nxt[key] = nxt.get(key, 0.0) + mass * prob
        law = nxt
    return law


def _grr(value: int) -> list[float]:
    e = math.exp(EPS0)
    return [e / (e + K - 1) if y == value else 1 / (e + K - 1) for y in range(K)]


def test_the_real_shuffled_grr_view_has_a_larger_delta_than_the_variation_ratio_pair() -> None:
    true_delta = 0.0
    for others in itertools.product(range(K), repeat=N - 1):
        p = _histogram_law([_grr(0)] + [_grr(x) for x in others])
        q = _histogram_law([_grr(1)] + [_grr(x) for x in others])
        true_delta = max(true_delta, _hockey_stick(p, q, EPS), _hockey_stick(q, p, EPS))

    e = math.exp(EPS0)
    beta = (e - 1) / (e + K - 1)
    alpha = beta / (e - 1)
    r = alpha * e / e
    others_law = [r, r, 1 - 2 * r]
    rest = 1 - alpha * (1 + e)
    pair_p = _histogram_law([[alpha * e, alpha, rest]] + [others_law] * (N - 1))
    pair_q = _histogram_law([[alpha, alpha * e, rest]] + [others_law] * (N - 1))
    pair_delta = max(_hockey_stick(pair_p, pair_q, EPS), _hockey_stick(pair_q, pair_p, EPS))

    assert true_delta > 6e-4
    assert pair_delta < 2e-5
    assert pair_delta < true_delta / 30  # the pair understates the real divergence 50-fold
