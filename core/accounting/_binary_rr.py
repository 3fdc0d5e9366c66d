"""Exact privacy profile of shuffled binary randomised response, worst case over the other users.

With keep probability p (q = 1 - p), the shuffled output is the count of ones K. For the victim's
bit 1 vs 0 and m ones among the N = n - 1 others, K = Y_m + V with Y_m = Bin(m, p) + Bin(N - m, q)
and V ~ Bern(p) vs Bern(q). Y_m is a sum of independent Bernoullis, hence log-concave, so the
likelihood ratio of the pair rises with K and the optimal distinguishing sets are {K >= j}:

    D_m(eps) = max_j [A_m(j) - e^eps B_m(j)],  A_m(j) = P[Y_m + Bern(p) >= j], B_m(j) likewise with q,

and the smallest eps with D_m(eps) <= delta is ln max_j (A_m(j) - delta) / B_m(j). Complementing
every bit maps (m, 1 vs 0) to (N - m, 0 vs 1), so the one direction over all m covers both.
The worst m is not always 0 or N (parity and a drift put it a few steps inside for some
parameters), so every m is evaluated: O(n) convolutions of windowed binomials by FFT.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

from deniable.core.accounting._binomial import FloatArray, IntArray, log_pmf

if TYPE_CHECKING:
    import numpy as np
else:
    from deniable.core.lazy import numpy as np

# Bernstein: mass of Bin(M, r) beyond mean +- t is <= 2 exp(-t^2 / (2 (var + t/3))) = 2 e^-40.
_LOG_TAIL = 40.0
_TAIL_MASS = 2 * 2 * math.exp(-_LOG_TAIL)  # two binomials per configuration
# Rounding allowance per FFT-convolved tail sum, per entry summed.
_FFT_ALLOWANCE_PER_ENTRY = 1e-15
_CHUNK_ELEMENTS = 1 << 21


def _window(size: IntArray, rate: float) -> tuple[IntArray, IntArray]:
    """[lo, hi] outside which Bin(size, rate) has mass <= 2 e^-40 (Bernstein), vectorised over size."""
    mean = size * rate
    var = size * rate * (1 - rate)
    radius = _LOG_TAIL / 3 + np.sqrt(_LOG_TAIL**2 / 9 + 2 * _LOG_TAIL * var)
    lo = np.maximum(np.floor(mean - radius), 0).astype(np.int64)
    hi = np.minimum(np.ceil(mean + radius), size).astype(np.int64)
    return lo, hi


def _pmf_rows(lo: IntArray, size: IntArray, rate: float, width: int) -> FloatArray:
    """Rows of Bin(size_i, rate) pmf at lo_i, lo_i + 1, ...: one Loader value, then pmf ratios."""
    ks = lo[:, None] + np.arange(width - 1, dtype=np.int64)
    with np.errstate(divide="ignore"):
        steps = np.log(np.maximum(size[:, None] - ks, 0) / (ks + 1.0)) + math.log(rate / (1 - rate))
    logs = np.empty((lo.size, width))
    logs[:, 0] = log_pmf(lo, size, rate)
    np.cumsum(steps, axis=1, out=logs[:, 1:])
    logs[:, 1:] += logs[:, :1]
    return np.exp(logs)


def _tail_chunks(keep: float, n: int, band: int | None) -> Iterator[tuple[FloatArray, float, float]]:
    """Per chunk of configurations: rows of P[Y_m >= base + i] (a zero column last) and allowances.

    Y_{N-m} is Y_m reflected, so only m <= N/2 is convolved and each row is also used reversed.
    ``band`` keeps only m <= band (and N - m): a diagnostic, not the worst case.
    """
    others = n - 1
    q = 1.0 - keep
    top = others // 2 if band is None else min(band, others // 2)
    ms = np.arange(top + 1, dtype=np.int64)
    lo1, hi1 = _window(ms, keep)
    lo0, hi0 = _window(others - ms, q)
    width = int(max(np.max(hi1 - lo1), np.max(hi0 - lo0))) + 1
    fft_len = 1 << max(1, (2 * width - 1).bit_length())
    rows = max(1, _CHUNK_ELEMENTS // fft_len)
    allowance_fft = 2 * width * _FFT_ALLOWANCE_PER_ENTRY
    for start in range(0, ms.size, rows):
        m = ms[start : start + rows]
        ones = _pmf_rows(lo1[start : start + rows], m, keep, width)
        zeros = _pmf_rows(lo0[start : start + rows], others - m, q, width)
        conv = np.fft.irfft(np.fft.rfft(ones, fft_len) * np.fft.rfft(zeros, fft_len), fft_len)
        y = np.maximum(conv[:, : 2 * width - 1], 0.0)
        for rows_y in (y, y[:, ::-1]):
            tail = np.zeros((m.size, 2 * width))
            tail[:, : 2 * width - 1] = np.cumsum(rows_y[:, ::-1], axis=1)[:, ::-1]
            yield tail, _TAIL_MASS + allowance_fft, allowance_fft


def work(keep: float, n: int) -> int:
    """Cells the exact computation touches (configurations x FFT length): its cost model."""
    others = n - 1
    if others <= 0:
        return 1
    variance = others * keep * (1 - keep)
    radius = _LOG_TAIL / 3 + math.sqrt(_LOG_TAIL**2 / 9 + 2 * _LOG_TAIL * variance)
    width = int(2 * radius) + 3
    return (others // 2 + 1) * (1 << max(1, (2 * width - 1).bit_length()))


def _split(tail: FloatArray, keep: float) -> tuple[FloatArray, FloatArray]:
    """A(j) = P[Y + Bern(p) >= j] and B(j) = P[Y + Bern(q) >= j] for j = base + 1 .. base + 2w - 1.

    j = base is left out: there A = B (both the window's mass), which never beats the empty set.
    """
    previous, current = tail[:, :-1], tail[:, 1:]
    return keep * previous + (1 - keep) * current, (1 - keep) * previous + keep * current


def exact_epsilon(keep: float, n: int, delta: float, band: int | None = None) -> float:
    """Smallest eps with sup over neighbouring datasets of D_{e^eps} <= delta (an upper bound).

    Raises ValueError when delta is within 100x of the numerical allowance (about 1e-11).
    """
    if n <= 1:
        return _single_report_epsilon(keep, delta)
    worst = 1.0
    for tail, extra, allowance in _tail_chunks(keep, n, band):
        if delta <= 100 * extra:
            raise ValueError(f"delta={delta:g} is too close to the numerical allowance {extra:.1e}")
        a, b = _split(tail, keep)
        numerator = a + (extra - delta)
        denominator = b - allowance
        positive = numerator > 0
        if np.any(positive & (denominator <= 0)):
            return math.inf
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(positive, numerator / denominator, 0.0)
        worst = max(worst, float(np.max(ratio)))
    return math.log(worst)


def exact_delta(keep: float, n: int, epsilon: float, band: int | None = None) -> float:
    """sup over neighbouring datasets of D_{e^eps}(K | bit 1 || K | bit 0), as an upper bound."""
    e = math.exp(epsilon)
    if n <= 1:
        return max(0.0, keep - e * (1 - keep))
    worst = 0.0
    for tail, extra, allowance in _tail_chunks(keep, n, band):
        a, b = _split(tail, keep)
        worst = max(worst, float(np.max(a - e * np.maximum(b - allowance, 0.0))) + extra)
    return min(1.0, worst)


def _single_report_epsilon(keep: float, delta: float) -> float:
    """One report: the randomised-response profile [p - e^eps q]_+ solved for eps."""
    q = 1.0 - keep
    if keep - delta <= q:
        return 0.0
    return math.log((keep - delta) / q)
