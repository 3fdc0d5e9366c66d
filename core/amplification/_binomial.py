"""Binomial probabilities accurate to ~1e-14 relative for n up to 10^9, vectorised with numpy.

Differences of ``lgamma`` lose about nine digits at n = 10^6 (each term is ~10^7), which would
swamp the cancellations in a hockey-stick divergence; Loader's saddle-point form
(C. Loader, "Fast and accurate computation of binomial probabilities", 2000) keeps full precision.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
else:
    from deniable.core.lazy import numpy as np
    from deniable.core.lazy import numpy_typing as npt

from deniable.core.lazy import FloatArray as FloatArray
from deniable.core.lazy import IntArray as IntArray

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
# stirlerr(k) = ln k! - (k + 1/2) ln k + k - ln sqrt(2 pi) for k = 1..15, from math.lgamma.
_SMALL_STIRLERR = [0.0] + [
    math.lgamma(k + 1) - (k + 0.5) * math.log(k) + k - _HALF_LOG_2PI for k in range(1, 16)
]


def _stirlerr(k: FloatArray) -> FloatArray:
    """Error of Stirling's formula for ln k!, k >= 1 integers (as floats)."""
    safe = np.maximum(k, 1.0)
    inv = 1.0 / safe
    inv2 = inv * inv
    series = inv * (1 / 12 - inv2 * (1 / 360 - inv2 * (1 / 1260 - inv2 * (1 / 1680 - inv2 * (1 / 1188)))))
    table = np.asarray(_SMALL_STIRLERR)[np.clip(safe, 0, 15).astype(np.int64)]
    return np.where(safe <= 15, table, series)


def _bd0(x: FloatArray, mean: FloatArray) -> FloatArray:
    """x ln(x / mean) + mean - x without cancellation (Loader's deviance term), x, mean > 0."""
    diff = x - mean
    total_mass = x + mean
    close = np.abs(diff) < 0.1 * total_mass
    v = np.where(close, diff / total_mass, 0.0)
    v2 = v * v
    term = 2 * x * v
    series = diff * v
    # |v| < 0.1, so each term shrinks by v^2 < 0.01: nine terms reach 1e-18 relative.
    for j in range(1, 10):
        term = term * v2
        series = series + term / (2 * j + 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        direct = x * np.log(x / mean) + mean - x
    return np.where(close, series, direct)


def log_pmf(k: npt.ArrayLike, n: npt.ArrayLike, p: float) -> FloatArray:
    """ln P[Bin(n, p) = k], -inf outside 0..n; k and n broadcast, 0 < p < 1."""
    kk = np.asarray(k, dtype=np.float64)
    nn = np.asarray(n, dtype=np.float64)
    kk, nn = np.broadcast_arrays(kk, nn)
    q = 1.0 - p
    inside = (kk > 0) & (kk < nn)
    ki = np.where(inside, kk, 1.0)
    ni = np.where(inside, nn, 2.0)
    body = (
        _stirlerr(ni)
        - _stirlerr(ki)
        - _stirlerr(ni - ki)
        - _bd0(ki, ni * p)
        - _bd0(ni - ki, ni * q)
        - 0.5 * np.log(2 * math.pi * ki * (1.0 - ki / ni))
    )
    out = np.full(kk.shape, -np.inf)
    out = np.where(inside, body, out)
    out = np.where((kk == 0) & (nn >= 0), nn * math.log1p(-p), out)
    out = np.where((kk == nn) & (nn > 0), nn * math.log(p), out)
    return np.asarray(out, dtype=np.float64)


def pmf(k: npt.ArrayLike, n: npt.ArrayLike, p: float) -> FloatArray:
    """P[Bin(n, p) = k], 0 outside 0..n."""
    return np.exp(log_pmf(k, n, p))


def pmf_run(start: int, count: int, n: int, p: float) -> FloatArray:
    """P[Bin(n, p) = k] for k = start .. start + count - 1: Loader every 1024 points, ratios between.

    The pmf ratios (n - k) p / ((k + 1) q) accumulate in log space, restarted at every exact
    point so that rounding stays below ~1e-12 relative.
    """
    if count <= 0:
        return np.zeros(0)
    segment = 1024
    rows = -(-count // segment)
    ks = start + np.arange(rows * segment, dtype=np.int64).reshape(rows, segment)
    with np.errstate(divide="ignore"):
        steps = np.log(np.maximum(n - ks[:, :-1], 0) / (ks[:, :-1] + 1.0)) + math.log(p / (1 - p))
    logs = np.empty(ks.shape)
    logs[:, 0] = log_pmf(ks[:, 0], n, p)
    np.cumsum(steps, axis=1, out=logs[:, 1:])
    logs[:, 1:] += logs[:, :1]
    out = np.exp(logs).ravel()[:count]
    out[(start + np.arange(count)) > n] = 0.0
    return out


def kl_bernoulli(a: float, q: float) -> float:
    """KL(Bern(a) || Bern(q)) in nats, the exponent of the Chernoff bound on binomial tails."""
    total = 0.0
    if a > 0:
        total += a * math.log(a / q)
    if a < 1:
        total += (1 - a) * math.log((1 - a) / (1 - q))
    return total


def chernoff_window(n: int, q: float, log_tail: float) -> tuple[int, int, float]:
    """[lo, hi] holding Bin(n, q) but for a mass at most the returned bound (<= e^-log_tail).

    P[C < lo] <= exp(-n KL((lo-1)/n || q)) and P[C > hi] <= exp(-n KL((hi+1)/n || q)).
    """
    if n == 0:
        return 0, 0, 0.0
    mean = n * q
    lo = _chernoff_edge(n, q, log_tail, math.floor(mean), -1)
    hi = _chernoff_edge(n, q, log_tail, math.ceil(mean), +1)
    neglected = 0.0
    if lo > 0:
        neglected += math.exp(-n * kl_bernoulli((lo - 1) / n, q))
    if hi < n:
        neglected += math.exp(-n * kl_bernoulli((hi + 1) / n, q))
    return lo, hi, neglected


def _chernoff_edge(n: int, q: float, log_tail: float, start: int, direction: int) -> int:
    """The innermost point from ``start`` outward past which the Chernoff bound is below e^-log_tail."""
    start = min(max(start, 0), n)
    step = 1
    inner, outer = start, start
    # Gallop outward until the bound beyond ``outer`` is small enough (or we hit the end).
    while True:
        outer = start + direction * step
        if outer <= 0 or outer >= n:
            outer = 0 if direction < 0 else n
            break
        beyond = (outer + direction) / n
        if n * kl_bernoulli(beyond, q) >= log_tail:
            break
        inner = outer
        step *= 2
    # Bisect between inner (bound too big) and outer (bound small enough or the end).
    while abs(outer - inner) > 1:
        mid = (inner + outer) // 2
        beyond = (mid + direction) / n
        if 0 <= beyond <= 1 and n * kl_bernoulli(beyond, q) >= log_tail:
            outer = mid
        else:
            inner = mid
    return outer


# Relative error of exp(log_pmf): rounding ln P costs |ln P| units of 2^-53 in P, the Loader terms a
# few more; 2^-45 (4 + |ln P|) is 8x the worst measured against exact rationals (3.4e-15 (1 + |ln P|),
# t up to 1e5; tests/core/accounting/test_half_tails.py).
_PMF_ERROR_UNIT = 2.0**-45
_UNIT_ROUNDOFF = 2.0**-53
_CHUNK = 64  # fewest terms per row in a row's first pass; doubled each further pass
_CELLS = 1 << 18  # rows x terms per block: 2 MB per float array, whatever the input size
_REST = 2.0**-60  # stop once the proven rest of the series is below this fraction of the sum
_LOG_REACH = 48.0  # first pass: terms down to ~e^-48 by the Gaussian estimate (a guess, never trusted)


def _series_block(x: FloatArray, t: FloatArray, last: FloatArray, offset: int, width: int) -> FloatArray:
    """Terms offset + 1 .. offset + width of 1 + r_0 + r_0 r_1 + ... for rows whose term ``offset``
    is ``last``: r_j = (t - x - j) / (x + 1 + j), zero from j = t - x on (the series ends there).

    Each ratio is one rounding of exact integers below 2^53; the first is multiplied by ``last``
    before the running product, so the terms are bit for bit a single sequential product.
    """
    j = offset + np.arange(width, dtype=np.float64)[None, :]
    ratios = np.maximum(t[:, None] - x[:, None] - j, 0.0) / (x[:, None] + 1 + j)
    ratios[:, 0] *= last
    return np.asarray(np.cumprod(ratios, axis=1), dtype=np.float64)


def _first_widths(x: FloatArray, t: FloatArray) -> IntArray:
    """Each row's first pass: a power of two >= _CHUNK covering the terms the series is expected to
    need. ln term_j ~ -(4/t)(d j + j^2/2), d = x - t/2, so e^-L is reached at j = sqrt(d^2 + L t/2) - d.
    Only a starting point: the loop checks the proven rest and doubles where the guess fell short."""
    d = x - t / 2
    guess = np.minimum(np.sqrt(d * d + _LOG_REACH * t / 2) - d, t - x + 1)
    return np.asarray(np.maximum(_CHUNK, 2 ** np.ceil(np.log2(np.maximum(guess, 1.0)))), dtype=np.int64)


def _sum_series(x: FloatArray, t: FloatArray, width: int) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Per row: the sum of the terms taken, the proven bound on the rest and the number of terms
    taken (the leading 1 included); passes of ``width``, 2 ``width``, ... over the rows not done."""
    total, rest, used, last = np.ones(x.size), np.zeros(x.size), np.ones(x.size), np.ones(x.size)
    active = np.arange(x.size)
    offset = 0
    while active.size:
        rows = max(1, _CELLS // width)
        done = []
        for lo in range(0, active.size, rows):
            idx = active[lo : lo + rows]
            terms = _series_block(x[idx], t[idx], last[idx], offset, width)
            total[idx] += terms.sum(axis=1)
            last[idx] = terms[:, -1]
            following = offset + width  # index of the first ratio not yet used
            remaining = t[idx] - x[idx] - following
            r_next = np.maximum(remaining, 0.0) / (x[idx] + 1 + following)
            rest[idx] = last[idx] * r_next / (1 - r_next)
            used[idx] = 1 + np.minimum(following, t[idx] - x[idx])
            done.append((remaining <= 0) | (rest[idx] <= _REST * total[idx]))
        active = active[~np.concatenate(done)]
        offset, width = offset + width, 2 * width
    return total, rest, used


def _half_series(x: IntArray, t: IntArray) -> tuple[FloatArray, FloatArray]:
    """P[Bin(t, 1/2) >= x] for t/2 < x <= t (elementwise) as pmf(x) (1 + r_0 + r_0 r_1 + ...), and
    an absolute error bound for each.

    r_j = (t - x - j) / (x + 1 + j) is the ratio of consecutive terms: below 1 from j = 0 (x > t/2)
    and falling in j, so after the term of index m the rest is at most term_m r_m / (1 - r_m).
    Rows are grouped by their first pass's width (``_first_widths``) and take their terms
    together, in passes of doubling width (blocks of at most ``_CELLS`` cells); a row leaves once
    its rest is below 2^-60 of its sum or its terms have ended (j = t - x, rest 0). Error, for a
    row that used m terms (the leading 1 included): the pmf's relative error
    (``_PMF_ERROR_UNIT`` (4 + |ln pmf|)); term i carries i roundings of ratios and at most i of
    products, so every term is within 2 m u of its exact value (u = 2^-53); the sum of m positive
    terms, in any order (passes, then numpy's pairwise sums), at most m - 1 more; the final
    product 1: relative (3 m + 4) u with room for the second-order terms, plus the neglected rest
    (absolute, times the head).
    """
    xf, tf = x.astype(np.float64), t.astype(np.float64)
    total, rest, used = np.ones(x.size), np.zeros(x.size), np.ones(x.size)
    widths = _first_widths(xf, tf)
    for width in np.unique(widths).tolist():
        group = widths == width
        total[group], rest[group], used[group] = _sum_series(xf[group], tf[group], int(width))
    log_head = log_pmf(x, t, 0.5)
    head = np.exp(log_head)
    relative = _PMF_ERROR_UNIT * (4 + np.abs(log_head)) + (3 * used + 4) * _UNIT_ROUNDOFF
    value = head * total
    return value, value * relative + head * rest * (1 + relative)


def half_upper_tails(x: npt.ArrayLike, t: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
    """P[Bin(t, 1/2) >= x] elementwise (x, t integers, t >= 0) and an absolute error bound for each.

    Our own (ADR 0036): the accountant's only use of scipy was this tail (``betainc``, before it
    ``bdtrc(x - 1, t, 1/2)``), and the aggregator's image leaves scipy out. Above the middle
    (2x > t) the tail is the series of ``_half_series``; below it the symmetry of p = 1/2 gives
    1 - P[Bin(t, 1/2) >= t - x + 1] with the same absolute error plus one rounding.
    Cost: vectorised over the elements; per element the terms until the rest is negligible
    (64 far from t/2, O(sqrt t) near it), memory bounded by ``_CELLS`` per block.
    """
    xs, ts = np.broadcast_arrays(np.asarray(x, dtype=np.int64), np.asarray(t, dtype=np.int64))
    xs, ts = xs.ravel(), ts.ravel()
    values = np.where(xs <= 0, 1.0, 0.0)
    errors = np.zeros(xs.shape)
    inside = (xs >= 1) & (xs <= ts)
    upper = 2 * xs > ts
    reflected = np.where(upper, xs, ts - xs + 1)
    series, series_error = _half_series(reflected[inside], ts[inside])
    up = upper[inside]
    values[inside] = np.where(up, series, 1.0 - series)
    errors[inside] = np.where(up, series_error, series_error + _UNIT_ROUNDOFF)
    shape = np.broadcast(np.asarray(x), np.asarray(t)).shape
    return values.reshape(shape), errors.reshape(shape)
