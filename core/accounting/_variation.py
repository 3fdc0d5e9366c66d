"""The variation-ratio reduction (Wang et al., PVLDB 17(8), 2024), its dominating pair computed exactly.

A local randomiser with the (p, beta, q) variation-ratio property (every output-probability ratio
between two inputs <= p, their total variation <= beta, every ratio to a third input <= q) is, after
shuffling n reports, dominated by this pair (derivation in docs/amplification.md §6): with
alpha = beta / (p - 1) and r = alpha p / q, each of the N = n - 1 others reports 0 w.p. r, 1 w.p. r,
2 otherwise; the victim reports (0, 1, 2) w.p. (alpha p, alpha, 1 - alpha (1 + p)) under P and
(alpha, alpha p, ...) under Q. The adversary sees the counts. Given the count c on {0, 1} (same law
under P and Q), n0 ~ a mixture of Bin(c, 1/2) shapes whose P - e^eps Q is B_c(n0) times a function
increasing linearly in n0, so D_{e^eps} = sum over c of two binomial tails at the sign change:

    D_c = alpha pi(c-1) (p-1)(1+e) S_{c-1}(x_c - 1)
          + [2 alpha pi(c-1) (1 - e p) + (1 - e)(1 - w) pi(c)] S_c(x_c),

pi the Bin(N, 2r) pmf, w = alpha (1 + p), S_c(x) = P[Bin(c, 1/2) >= x], x_c the first n0 where the
bracket turns positive. Swapping the labels 0 and 1 maps P to Q, so D(P||Q) = D(Q||P).
"""

from __future__ import annotations

import math

import numpy as np

from deniable.core.accounting._binomial import FloatArray, IntArray, chernoff_window, pmf, pmf_run

_LOG_TAIL = 46.0  # Chernoff window of the blanket count: the rest (<= 2 e^-46) is added to delta
_HOEFFDING = 48.0  # S_c(x) sums Bin(c, 1/2) over c/2 +- sqrt(c * 48 / 2): e^-48 left out per side
_BLOCK = 2048  # tails carried along consecutive c, recomputed directly every _BLOCK values
ROUNDING_ALLOWANCE = 1e-10  # relative to the magnitudes of the cancelling terms


def _direct_tail(c: int, x: int) -> float:
    """P[Bin(c, 1/2) >= x] summed over the Hoeffding window: low by at most e^-48."""
    if x <= 0:
        return 1.0
    if x > c:
        return 0.0
    radius = math.ceil(math.sqrt(c * _HOEFFDING / 2)) + 2
    start, stop = max(x, c // 2 - radius), min(c, c // 2 + radius)
    if start > stop:
        return 0.0
    return float(np.sum(pmf_run(start, stop - start + 1, c, 0.5)))


def upper_tails(cs: IntArray, xs: IntArray) -> FloatArray:
    """S_c(x_c) = P[Bin(c, 1/2) >= x_c] for consecutive c = cs[0], cs[0] + 1, ... (each low by at
    most ~1e-20 plus rounding): S_{c+1}(x) = S_c(x) + B_c(x - 1) / 2, then moved from x_c to
    x_{c+1} by adding or removing pmf terms; restarted by a direct sum every _BLOCK values."""
    out = np.empty(cs.size)
    if cs.size == 0:
        return out
    steps = xs[1:] - xs[:-1]
    span = int(np.max(np.abs(steps))) if steps.size else 0
    inc = 0.5 * pmf(xs[:-1] - 1, cs[:-1], 0.5)
    low = np.minimum(xs[:-1], xs[1:])
    for k in range(span):
        moved = pmf(low + k, cs[1:], 0.5) * (k < np.abs(steps))
        inc -= np.sign(steps) * moved
    for start in range(0, cs.size, _BLOCK):
        stop = min(start + _BLOCK, cs.size)
        out[start] = _direct_tail(int(cs[start]), int(xs[start]))
        if stop - start > 1:
            out[start + 1 : stop] = out[start] + np.cumsum(inc[start : stop - 1])
    return np.clip(out, 0.0, 1.0)


def vr_delta(epsilon: float, p: float, beta: float, q: float, n: int) -> float:
    """An upper bound on D_{e^eps} of the variation-ratio pair for n shuffled reports."""
    e = math.exp(epsilon)
    alpha = beta / (p - 1)
    r = alpha * p / q
    w = alpha * (1 + p)
    others = max(n - 1, 0)
    if epsilon >= math.log(p) or beta <= 0:
        return 0.0
    if 2 * r >= 1 or others == 0:
        lo, hi, neglected = others, others, 0.0
    else:
        lo, hi, neglected = chernoff_window(others, 2 * r, _LOG_TAIL)
    cs = np.arange(max(lo, 1), hi + 2, dtype=np.int64)  # the count on {0, 1}: C or C + 1
    blanket = min(2 * r, 1.0)
    before = pmf(cs - 1, others, blanket) if blanket < 1 else (cs - 1 == others).astype(float)
    at = pmf(cs, others, blanket) if blanket < 1 else (cs == others).astype(float)
    first = alpha * before * (p - 1) * (1 + e)  # times S_{c-1}(x - 1)
    second = 2 * alpha * before * (1 - e * p) + (1 - e) * (1 - w) * at  # times S_c(x)
    # bracket(n0) = (2 alpha pi(c-1) / c) (p-1)(1+e) n0 + second > 0  <=>  n0 > z_c
    slope = 2 * first / np.maximum(cs, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(slope > 0, -second / slope, np.inf)
    xs = np.clip(np.floor(z) + 1, 0, cs + 1).astype(np.int64)
    tail_first = upper_tails(cs - 1, xs - 1)
    tail_second = upper_tails(cs, xs)
    terms = first * tail_first + second * tail_second
    magnitude = float(np.sum(first * tail_first + np.abs(second) * tail_second))
    total = float(np.sum(np.maximum(terms, 0.0)))
    omitted = float(np.sum(first)) * 2 * math.exp(-_HOEFFDING)  # S_{c-1} sums low by <= 2 e^-48
    return min(1.0, total + ROUNDING_ALLOWANCE * magnitude + omitted + 2 * neglected)
