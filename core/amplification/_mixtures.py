"""Hockey-stick divergences of the clone pair, P_c = a Bin(c, 1/2) + (1-a) (Bin(c, 1/2) + 1) vs Q_c.

Q_c swaps a and 1-a. With a > 1/2 the likelihood ratio P_c(x)/Q_c(x) =
(a (c+1-x) + (1-a) x) / ((1-a)(c+1-x) + a x) falls in x, so D_{e^eps}(P_c || Q_c) is the sum over
x <= X_c = floor(t (c+1)), t = (a - e^eps (1-a)) / ((2a-1)(1+e^eps)), which telescopes to
a' B_c(X_c) - (e^eps - 1) F_c(X_c - 1) with a' = a - e^eps (1-a), B_c / F_c the Bin(c, 1/2) pmf / CDF.
x -> c+1-x maps P_c to Q_c, so D(P_c||Q_c) = D(Q_c||P_c): one direction suffices.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from deniable.core.amplification._binomial import FloatArray, IntArray, chernoff_window, pmf, pmf_run

if TYPE_CHECKING:
    import numpy as np
else:
    from deniable.core.lazy import numpy as np

# F_c(y) is carried from c to c+1 by F_{c+1}(y) = F_c(y) - B_c(y)/2 and
# F_{c+1}(y+1) = F_{c+1}(y) + B_{c+1}(y+1); every _BLOCK steps it is recomputed by direct summation.
_BLOCK = 4096
# A direct sum stops _WINDOW_SD * sqrt(c) below its top term: Hoeffding puts the rest below e^-72.
_WINDOW_SD = 6.0
# Relative allowance for rounding, applied to the magnitudes of the two cancelling terms.
ROUNDING_ALLOWANCE = 1e-10
# Binomial tails of C dropped from the sum are bounded by Chernoff at most e^-46 ~ 1e-20.
_LOG_TAIL = 46.0


def _cdf_lower_sum(c: int, y: int) -> float:
    """Sum of Bin(c, 1/2) pmf over [y - W, y]: F_c(y) minus a tail below e^-72 (a lower bound)."""
    if y < 0:
        return 0.0
    top = min(y, c)
    width = int(_WINDOW_SD * math.sqrt(c + 1)) + 10
    start = max(0, top - width)
    return float(np.sum(pmf_run(start, top - start + 1, c, 0.5)))


def clone_divergences(epsilon: float, alpha: float, cs: IntArray) -> tuple[FloatArray, FloatArray]:
    """D_{e^eps}(P_c || Q_c) for consecutive c = cs[0], cs[0]+1, ..., and each one's rounding scale."""
    e = math.exp(epsilon)
    lead = alpha - e * (1 - alpha)
    if lead <= 0 or cs.size == 0:
        return np.zeros(cs.size), np.zeros(cs.size)
    t = lead / ((2 * alpha - 1) * (1 + e))
    xs = np.floor(t * (cs + 1.0)).astype(np.int64)
    ys = xs - 1
    b_top = pmf(xs, cs, 0.5)
    # Increments of G_c = F_c(Y_c) from c to c+1 (Y moves by 0 or 1 because t < 1).
    step_up = ys[1:] - ys[:-1]
    inc = -0.5 * pmf(ys[:-1], cs[:-1], 0.5) + step_up * pmf(ys[:-1] + 1, cs[1:], 0.5)
    g = np.empty(cs.size)
    for start in range(0, cs.size, _BLOCK):
        stop = min(start + _BLOCK, cs.size)
        g[start] = _cdf_lower_sum(int(cs[start]), int(ys[start]))
        if stop - start > 1:
            g[start + 1 : stop] = g[start] + np.cumsum(inc[start : stop - 1])
    g = np.maximum(g, 0.0)
    divergence = np.maximum(lead * b_top - (e - 1) * g, 0.0)
    scale = lead * b_top + (e - 1) * g
    return divergence, scale


def clone_delta(epsilon: float, alpha: float, others: int, clone_probability: float, weight: float) -> float:
    """weight * E_{C ~ Bin(others, clone_probability)} D_{e^eps}(P_C || Q_C), an upper bound.

    The sum over C keeps a Chernoff window; the dropped mass (D <= 1 there) and a rounding allowance
    are added, so the result never undershoots the exact value.
    """
    if alpha - math.exp(epsilon) * (1 - alpha) <= 0:
        return 0.0
    if clone_probability <= 0 or others == 0:
        cs = np.zeros(1, dtype=np.int64)
        weights = np.ones(1)
        neglected = 0.0
    else:
        q = min(clone_probability, 1.0)
        if q >= 1.0:
            lo = hi = others
            neglected = 0.0
        else:
            lo, hi, neglected = chernoff_window(others, q, _LOG_TAIL)
        cs = np.arange(lo, hi + 1, dtype=np.int64)
        weights = pmf(cs, others, q) if q < 1.0 else np.ones(1)
    divergence, scale = clone_divergences(epsilon, alpha, cs)
    total = float(np.dot(weights, divergence))
    allowance = ROUNDING_ALLOWANCE * float(np.dot(weights, scale))
    return min(1.0, weight * (total + allowance) + neglected)
