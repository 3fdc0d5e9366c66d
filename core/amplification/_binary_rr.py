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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from deniable.core.amplification._binomial import FloatArray, IntArray, chernoff_window, log_pmf

if TYPE_CHECKING:
    import numpy as np
else:
    from deniable.core.lazy import numpy as np

# Bernstein: mass of Bin(M, r) beyond mean +- t is <= 2 exp(-t^2 / (2 (var + t/3))) = 2 e^-40.
_LOG_TAIL = 40.0
_TAIL_MASS = 2 * 2 * math.exp(-_LOG_TAIL)  # two binomials per configuration
# FFT convolution rounding (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed.,
# Thm 24.2: each FFT is within log2(L) eta relative in the 2-norm, eta ~ 5u): for pmf rows a, b
# (1-norms <= 1), ||conv error||_2 <= _FFT_CONSTANT u log2(L) (||a||_2 + ||b||_2), and a tail sum
# over w entries errs by at most sqrt(w) times that (Cauchy-Schwarz). The constant covers three
# transforms and the pointwise product with a safety factor of about 2.
_FFT_CONSTANT = 32.0
_UNIT_ROUNDOFF = 2.0**-53
_CHUNK_ELEMENTS = 1 << 21
# Configurations with rows at most this wide are convolved directly (exact to relative rounding).
_DIRECT_WIDTH = 192
# The configuration search (few configurations, some with a narrow binomial) convolves directly
# up to this span: a point-mass-like row would make the FFT allowance large.
_GRID_DIRECT_SPAN = 1024


def _fft_allowance(ones: FloatArray, zeros: FloatArray, fft_len: int, width: int) -> float:
    """Bound on the rounding of any tail sum of the FFT-convolved rows (the worst row of the chunk)."""
    norms = np.sqrt(np.sum(ones * ones, axis=1)) + np.sqrt(np.sum(zeros * zeros, axis=1))
    per_vector = _FFT_CONSTANT * _UNIT_ROUNDOFF * math.log2(fft_len) * float(np.max(norms))
    return math.sqrt(2 * width) * per_vector + 1e-300


def _summation_factor(width: int) -> float:
    """Relative rounding of a direct convolution entry (<= width products) and of a cumulative sum of
    <= 2 width positive terms taken from the small end."""
    return 1.0 + 8 * width * _UNIT_ROUNDOFF


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


def _config_pmfs(
    keep: float, ones: IntArray, zeros: IntArray, direct_span: int = _DIRECT_WIDTH
) -> Iterator[tuple[IntArray, FloatArray, float, float, int]]:
    """Per chunk of configurations (ones[i] others with bit 1, zeros[i] with bit 0): their indices,
    rows of the pmf of Y = Bin(ones, p) + Bin(zeros, q) on a Bernstein window, the mass added to
    delta (cut tails and FFT rounding), the FFT allowance of any tail sum, and the row width.

    A configuration whose narrower binomial spans at most ``direct_span`` values (or whose rows are
    at most ``_DIRECT_WIDTH`` wide) is convolved directly (no FFT allowance); the others by FFT.
    """
    q = 1.0 - keep
    lo1, hi1 = _window(ones, keep)
    lo0, hi0 = _window(zeros, q)
    width = int(max(np.max(hi1 - lo1), np.max(hi0 - lo0))) + 1
    narrow = (np.minimum(hi1 - lo1, hi0 - lo0) + 1 <= direct_span) | (width <= _DIRECT_WIDTH)
    fft_len = 1 << max(1, (2 * width - 1).bit_length())
    rows = max(1, _CHUNK_ELEMENTS // fft_len)
    for direct in (True, False):
        chosen = np.flatnonzero(narrow == direct)
        for start in range(0, chosen.size, rows):
            part = chosen[start : start + rows]
            row_ones = _pmf_rows(lo1[part], ones[part], keep, width)
            row_zeros = _pmf_rows(lo0[part], zeros[part], q, width)
            if direct:
                ones_first = (hi1 - lo1)[part] <= (hi0 - lo0)[part]
                first = np.where(ones_first[:, None], row_ones, row_zeros)
                second = np.where(ones_first[:, None], row_zeros, row_ones)
                span = int(np.max(np.minimum(hi1 - lo1, hi0 - lo0)[part])) + 1
                conv, allowance = _direct_convolution(first, second, span), 0.0
            else:
                spectrum = np.fft.rfft(row_ones, fft_len) * np.fft.rfft(row_zeros, fft_len)
                conv = np.fft.irfft(spectrum, fft_len)
                allowance = _fft_allowance(row_ones, row_zeros, fft_len, width)
            y = np.maximum(conv[:, : 2 * width - 1], 0.0)
            yield part, y, _TAIL_MASS + allowance, allowance, width


def _direct_convolution(first: FloatArray, second: FloatArray, span: int) -> FloatArray:
    """Row-wise convolution by summing products (``first`` is zero beyond ``span`` columns):
    positive terms only, so every entry is within width * u relative (``_summation_factor``)."""
    width = first.shape[1]
    out = np.zeros((first.shape[0], 2 * width - 1))
    for shift in range(span):
        out[:, shift : shift + width] += first[:, shift : shift + 1] * second
    return out


def _tails(y: FloatArray) -> FloatArray:
    """Rows of P[Y >= base + i], summed from the small end, with a zero column last."""
    tail = np.zeros((y.shape[0], y.shape[1] + 1))
    tail[:, :-1] = np.cumsum(y[:, ::-1], axis=1)[:, ::-1]
    return tail


def _tail_chunks(keep: float, n: int, band: int | None) -> Iterator[tuple[FloatArray, float, float, int]]:
    """Every configuration of m ones among the N = n - 1 others, both directions.

    Y_{N-m} is Y_m reflected, so only m <= N/2 is convolved and each row is also used reversed.
    ``band`` keeps only m <= band (and N - m): a diagnostic, not the worst case.
    """
    others = n - 1
    top = others // 2 if band is None else min(band, others // 2)
    ms = np.arange(top + 1, dtype=np.int64)
    span = 0 if band is None else _GRID_DIRECT_SPAN  # a band has few rows: convolve narrow ones directly
    for _, y, extra, allowance, width in _config_pmfs(keep, ms, others - ms, span):
        for rows_y in (y, y[:, ::-1]):
            yield _tails(rows_y), extra, allowance, width


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


def _row_ratios(
    tail: FloatArray, keep: float, delta: FloatArray, extra: float, allowance: float, width: int
) -> FloatArray:
    """Per row, max_j (A(j) + extra - delta) / (B(j) - allowance), inflated by the summation
    rounding: e^eps of that configuration (inf when a positive numerator meets no denominator)."""
    a, b = _split(tail, keep)
    numerator = a + (extra - delta[:, None])
    denominator = b - allowance
    positive = numerator > 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = np.where(positive, numerator / denominator, 0.0)
    ratio = np.where(positive & (denominator <= 0), np.inf, ratio)
    out: FloatArray = np.maximum(np.max(ratio, axis=1), 1.0) * _summation_factor(width)
    return out


def _row_lower_ratios(
    tail: FloatArray, keep: float, delta: float, extra: float, allowance: float
) -> FloatArray:
    """Per row, a lower bound on e^eps of the configuration: the cut tails and rounding taken
    against it (A can only be larger than computed minus the allowance, B smaller plus extra)."""
    a, b = _split(tail, keep)
    numerator = a * (1 - 1e-12) - allowance - delta
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(numerator > 0, numerator / (b * (1 + 1e-12) + extra), 0.0)
    out: FloatArray = np.maximum(np.max(ratio, axis=1), 1.0)
    return out


def _check_delta(delta: float, extra: float) -> None:
    if delta <= 10 * extra:
        raise ValueError(f"delta={delta:g} is too close to the numerical allowance {extra:.1e}")


def exact_epsilon(keep: float, n: int, delta: float, band: int | None = None) -> float:
    """Smallest eps with sup over neighbouring datasets of D_{e^eps} <= delta (an upper bound).

    Raises ValueError when delta is within 10x of the numerical allowance.
    """
    if n <= 1:
        return _single_report_epsilon(keep, delta)
    worst = 1.0
    for tail, extra, allowance, width in _tail_chunks(keep, n, band):
        _check_delta(delta, extra)
        deltas = np.full(tail.shape[0], delta)
        worst = max(worst, float(np.max(_row_ratios(tail, keep, deltas, extra, allowance, width))))
    return math.log(worst)


def exact_delta(keep: float, n: int, epsilon: float, band: int | None = None) -> float:
    """sup over neighbouring datasets of D_{e^eps}(K | bit 1 || K | bit 0), as an upper bound."""
    e = math.exp(epsilon)
    if n <= 1:
        return max(0.0, keep - e * (1 - keep))
    worst = 0.0
    for tail, extra, allowance, width in _tail_chunks(keep, n, band):
        worst = max(worst, float(np.max(_row_deltas(tail, keep, e, extra, allowance, width))))
    return min(1.0, worst)


def _row_deltas(
    tail: FloatArray, keep: float, e: float, extra: float, allowance: float, width: int
) -> FloatArray:
    """Per row, an upper bound on D_e of the configuration (its best threshold set)."""
    a, b = _split(tail, keep)
    slack = _summation_factor(width)
    best = np.max(a * slack - e * np.maximum(b / slack - allowance, 0.0), axis=1)
    out: FloatArray = np.maximum(best, 0.0) + extra
    return out


def _single_report_epsilon(keep: float, delta: float) -> float:
    """One report: the randomised-response profile [p - e^eps q]_+ solved for eps."""
    q = 1.0 - keep
    if keep - delta <= q:
        return 0.0
    return math.log((keep - delta) / q)


# --- every n: configuration intervals, each bounded by one smaller configuration (docs/amplification.md §5)

# Intervals at the start (at least _GRID_START, and _GRID_START_PER_RATE per unit of the conversion
# rate, so that in flat regions the first round already meets the tolerance), how many pieces a
# refined interval becomes, and how many configurations per round are evaluated exactly.
_GRID_START = 16
_GRID_START_PER_RATE = 170
_GRID_SPLIT = 4
_EXACT_PER_ROUND = 6
# Chernoff tail beyond the converted-users quantile: at most e^-46 ~ 1e-20, added to delta.
_REDUCTION_LOG_TAIL = 46.0


@dataclass(frozen=True)
class GridResult:
    """A certified bound over every configuration, the exact value of the worst configuration
    evaluated (a lower bound on the true supremum), and how many configurations were computed."""

    value: float
    lower: float
    configurations: int


def _reduction(size: int, converted: float) -> tuple[int, float]:
    """(f, tau): Bin(size, converted) exceeds f with probability at most tau (Chernoff)."""
    if size <= 0:
        return 0, 0.0
    _, hi, neglected = chernoff_window(size, converted, _REDUCTION_LOG_TAIL)
    return hi, neglected


def _pieces(lo: int, hi: int, count: int) -> list[tuple[int, int]]:
    """[lo, hi] cut into at most ``count`` consecutive intervals of near-equal length."""
    edges = sorted({lo + (hi - lo + 1) * i // count for i in range(count)} | {lo})
    ends = [*(e - 1 for e in edges[1:]), hi]
    return list(zip(edges, ends, strict=True))


def _refine(
    keep: float,
    n: int,
    upper: Callable[[IntArray, IntArray, FloatArray], FloatArray],
    exact: Callable[[IntArray, IntArray], tuple[FloatArray, FloatArray]],
    accept: Callable[[float, float], bool],
) -> GridResult:
    """Cover the ones-count a in [0, N] by intervals [lo, hi]; bound each by the configuration
    (lo ones, N - lo - f zeros) with f the converted-users quantile (Lemma 2); evaluate exactly
    (an upper and a strict lower bound of its value) the configuration at lo of the intervals with
    the largest bounds, and split every interval whose bound ``accept`` rejects against the
    largest exact value found so far. Single points are exact."""
    others = n - 1
    converted = (2 * keep - 1) / keep  # a one-user is "always 1" w.p. (p - q)/p, else a zero-user
    start = max(_GRID_START, math.ceil(_GRID_START_PER_RATE * converted))
    pending = [*_pieces(0, others - 1, start), (others, others)] if others > 0 else [(0, 0)]
    accepted, reference, best_lower, computed = 0.0, 0.0, 0.0, 0
    while pending:
        los = np.array([lo for lo, _ in pending], dtype=np.int64)
        cuts = [_reduction(hi - lo, converted) for lo, hi in pending]
        zeros = np.array([max(0, others - lo - f) for (lo, _), (f, _) in zip(pending, cuts, strict=True)])
        bounds = upper(los, zeros.astype(np.int64), np.array([tau for _, tau in cuts]))
        chosen = np.unique(np.concatenate((np.argsort(bounds)[-_EXACT_PER_ROUND:], [0, len(pending) - 1])))
        values, lowers = exact(los[chosen], others - los[chosen])
        reference = max(reference, float(np.max(values)))
        best_lower = max(best_lower, float(np.max(lowers)))
        computed += len(pending) + chosen.size
        refine: list[tuple[int, int]] = []
        for (lo, hi), bound in zip(pending, bounds, strict=True):
            if hi == lo or accept(float(bound), reference):
                accepted = max(accepted, float(bound))
            else:
                refine.extend(_pieces(lo, hi, _GRID_SPLIT))
        pending = refine
    return GridResult(max(accepted, reference), best_lower, computed)


def _per_config(
    keep: float,
    ones: IntArray,
    zeros: IntArray,
    row: Callable[[FloatArray, IntArray, float, float, int], FloatArray],
) -> FloatArray:
    """Apply ``row`` (tail rows, chunk slice, extra, allowance, width) to every configuration."""
    out = np.empty(ones.size)
    for part, y, extra, allowance, width in _config_pmfs(keep, ones, zeros, _GRID_DIRECT_SPAN):
        out[part] = row(_tails(y), part, extra, allowance, width)
    return out


def grid_epsilon(keep: float, n: int, delta: float, tolerance: float) -> GridResult:
    """ln of the certified e^eps over every neighbouring pair at delta, refined until within
    ``tolerance`` (relative, in eps) of the eps of an evaluated configuration."""

    def upper(ones: IntArray, zeros: IntArray, taus: FloatArray) -> FloatArray:
        def row(tail: FloatArray, part: IntArray, extra: float, allowance: float, width: int) -> FloatArray:
            deltas = delta - taus[part]
            _check_delta(float(np.min(deltas)), extra)
            return np.log(_row_ratios(tail, keep, deltas, extra, allowance, width))

        return _per_config(keep, ones, zeros, row)

    def exact(ones: IntArray, zeros: IntArray) -> tuple[FloatArray, FloatArray]:
        both = np.empty((2, ones.size))
        for part, y, extra, allowance, width in _config_pmfs(keep, ones, zeros, _GRID_DIRECT_SPAN):
            tail, deltas = _tails(y), np.full(part.size, delta)
            both[0, part] = np.log(_row_ratios(tail, keep, deltas, extra, allowance, width))
            both[1, part] = np.log(_row_lower_ratios(tail, keep, delta, extra, allowance))
        return both[0], both[1]

    return _refine(keep, n, upper, exact, lambda bound, best: bound <= best * (1 + tolerance))


def grid_delta(keep: float, n: int, epsilon: float, tolerance: float) -> GridResult:
    """The certified D_{e^eps} over every neighbouring pair, refined until within ``tolerance``
    (relative, plus 1e-15 absolute) of the D of an evaluated configuration."""
    e = math.exp(epsilon)

    def upper(ones: IntArray, zeros: IntArray, taus: FloatArray) -> FloatArray:
        def row(tail: FloatArray, part: IntArray, extra: float, allowance: float, width: int) -> FloatArray:
            return _row_deltas(tail, keep, e, extra, allowance, width) + taus[part]

        return _per_config(keep, ones, zeros, row)

    def exact(ones: IntArray, zeros: IntArray) -> tuple[FloatArray, FloatArray]:
        both = np.empty((2, ones.size))
        for part, y, extra, allowance, width in _config_pmfs(keep, ones, zeros, _GRID_DIRECT_SPAN):
            tail = _tails(y)
            both[0, part] = _row_deltas(tail, keep, e, extra, allowance, width)
            a, b = _split(tail, keep)
            found = np.max(a * (1 - 1e-12) - allowance - e * (b * (1 + 1e-12) + extra), axis=1)
            both[1, part] = np.maximum(found, 0.0)
        return both[0], both[1]

    result = _refine(keep, n, upper, exact, lambda bound, best: bound <= best * (1 + tolerance) + 1e-15)
    return GridResult(min(1.0, result.value), result.lower, result.configurations)
