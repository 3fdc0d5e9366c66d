"""The full privacy blanket of shuffled k-ary randomised response (Balle, Bell, Gascon, Nissim 2019).

GRR with keep probability p and other probability o = (1 - p)/(k - 1): every report is, w.p.
g = k o, a uniform draw over the k values (the blanket) and otherwise the true value. An
adversary told which of the others are not blanket (and their values) sees the victim's report
mixed with B ~ Bin(n - 1, g) uniform draws. For the histogram h of those u = B + 1 reports,

    P_x0(h) = Z_u(h) * o k / u * (u + a h0),   P_x1(h) = Z_u(h) * o k / u * (u + a h1),

a = p/o - 1, Z_u the uniform multinomial law of u draws, h0/h1 the counts on x0/x1 (the victim's
report is x0 w.p. p, another value w.p. o; M(h - e_v) = Z_u(h) h_v / (u pi_v)). The ratio depends
only on (u, h0, h1), so the hockey-stick divergence is a sum over t = h0 + h1 ~ Bin(u, 2/k) and
h0 | t ~ Bin(t, 1/2) of o k / u [u (1 - E) + a ((1 + E) h0 - E t)]_+ (E = e^eps), which is positive
for h0 >= x*(u, t) = floor((E t a + u (E - 1)) / (a (1 + E))) + 1. With S = P[Bin(t, 1/2) >= x*]
and E[X 1{X >= x}] = (t/2) P[Bin(t - 1, 1/2) >= x - 1] the inner sum is

    (1 - E)(u + a t / 2) S + a (1 + E) (t / 4) P[Bin(t - 1, 1/2) = x* - 1]   (>= 0).

Unlike the restricted blanket (``GRRBlanket``) nobody tells the adversary whether the victim's
report fell outside {x0, x1}: the residual reports dilute the ratio, which helps at large k.
Swapping x0 and x1 maps one direction to the other, so one direction suffices.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from deniable.core.amplification._binomial import (
    FloatArray,
    IntArray,
    chernoff_window,
    half_upper_tails,
    log_pmf,
    pmf,
    pmf_run,
)

if TYPE_CHECKING:
    import numpy as np
else:
    from deniable.core.lazy import numpy as np

_LOG_TAIL = 40.0  # Chernoff windows: dropped binomial mass below e^-40 ~ 4e-18 per window (added)
_ROWS = 128  # values of t per vectorised chunk
ROUNDING_ALLOWANCE = 1e-10  # relative, on the magnitudes of the two cancelling inner terms


def window_cells(others: int, blanket: float, k: int) -> int:
    """(u values) x (t values) the sum visits: the cost of one evaluation."""
    lo, hi, _ = chernoff_window(others, blanket, _LOG_TAIL)
    t_lo = chernoff_window(lo + 1, 2 / k, _LOG_TAIL)[0]
    t_hi = chernoff_window(hi + 1, 2 / k, _LOG_TAIL)[1]
    return (hi - lo + 1) * (t_hi - t_lo + 1)


def _kl(rate: FloatArray, q: float) -> FloatArray:
    """KL(Bern(rate) || Bern(q)) elementwise, rate in [0, 1]."""
    with np.errstate(divide="ignore", invalid="ignore"):
        first = np.where(rate > 0, rate * np.log(rate / q), 0.0)
        second = np.where(rate < 1, (1 - rate) * np.log((1 - rate) / (1 - q)), 0.0)
    return np.asarray(first + second, dtype=np.float64)


def _chernoff_outside(size: FloatArray, q: float, lo: int, hi: int) -> FloatArray:
    """Upper bound on P[Bin(size, q) < lo] + P[Bin(size, q) > hi], per size (Chernoff)."""
    mean = size * q
    below = np.where(
        (lo > 0) & ((lo - 1) < mean), np.exp(-size * _kl(np.clip((lo - 1) / size, 0, 1), q)), 0.0
    )
    below = np.where((lo > 0) & ((lo - 1) >= mean), 1.0, below)
    above = np.where((hi + 1) > mean, np.exp(-size * _kl(np.clip((hi + 1) / size, 0, 1), q)), 1.0)
    above = np.where(hi >= size, 0.0, above)
    return np.asarray(below + above, dtype=np.float64)


def _weights_along_u(ts: IntArray, u0: int, width: int, q: float) -> FloatArray:
    """Rows t of P[Bin(u, q) = t] for u = u0 .. u0 + width - 1: Loader at each row's first u >= t
    in every block of 1024, the ratio (u + 1)(1 - q) / (u + 1 - t) in log space between."""
    out = np.zeros((ts.size, width))
    tcol = ts[:, None].astype(np.float64)
    for start in range(0, width, 1024):
        stop = min(width, start + 1024)
        us = (u0 + np.arange(start, stop, dtype=np.int64)).astype(np.float64)
        anchor = np.maximum(us[0], ts.astype(np.float64))
        anchor_log = log_pmf(ts, anchor, q)
        valid_step = us[None, 1:] - 1 >= tcol  # transition from u - 1 >= t to u
        with np.errstate(divide="ignore", invalid="ignore"):
            steps = np.where(
                valid_step,
                np.log((us[None, 1:] * (1 - q)) / np.maximum(us[None, 1:] - tcol, 1.0)),
                0.0,
            )
        logs = np.empty((ts.size, stop - start))
        logs[:, 0] = 0.0
        np.cumsum(steps, axis=1, out=logs[:, 1:])
        logs += anchor_log[:, None]
        logs[us[None, :] < tcol] = -np.inf
        out[:, start:stop] = np.exp(logs)
    return out


def full_blanket_delta(epsilon: float, keep: float, other: float, k: int, n: int) -> float:
    """An upper bound on D_{e^eps} of the shuffled GRR histogram via the full blanket (k >= 3)."""
    if k < 3:
        raise ValueError("the full blanket needs k >= 3 (k = 2 is the restricted blanket)")
    e = math.exp(epsilon)
    a = keep / other - 1
    if e >= keep / other:
        return 0.0
    scale = other * k  # o k
    others = n - 1
    if others == 0:
        # u = 1: the victim alone, D = sum_v [P(v|x0) - E P(v|x1)]_+ = [p - E o]_+
        return max(0.0, keep - e * other)
    blanket = min(1.0, k * other)
    b_lo, b_hi, neglected_b = chernoff_window(others, blanket, _LOG_TAIL)
    bs = np.arange(b_lo, b_hi + 1, dtype=np.int64)
    u = (bs + 1).astype(np.float64)
    weight_b = pmf(bs, others, blanket)
    pair = 2 / k
    t_lo = chernoff_window(b_lo + 1, pair, _LOG_TAIL)[0]
    t_hi = chernoff_window(b_hi + 1, pair, _LOG_TAIL)[1]
    hoeffding = math.exp(-_LOG_TAIL)

    total = 0.0
    magnitude = 0.0
    beyond = 0.0  # allowance for pmf values of Bin(t, 1/2) beyond the Hoeffding window
    for chunk in range(t_lo, t_hi + 1, _ROWS):
        ts = np.arange(chunk, min(chunk + _ROWS, t_hi + 1), dtype=np.int64)
        tf = ts[:, None].astype(np.float64)
        x = np.floor((e * a * tf + (e - 1) * u[None, :]) / (a * (1 + e))).astype(np.int64) + 1
        # Bin(t, 1/2) on columns [first_t, last_t]: from the smallest threshold of the row to the
        # Hoeffding edge t/2 + sqrt(t log_tail / 2), beyond which the mass is <= e^-log_tail.
        first = np.clip(x.min(axis=1) - 1, 0, ts)
        last = np.minimum(ts, np.ceil(ts / 2 + np.sqrt(ts * _LOG_TAIL / 2)).astype(np.int64) + 1)
        last = np.maximum(last, first)
        width = int((last - first).max()) + 1
        cols = first[:, None] + np.arange(width, dtype=np.int64)[None, :]
        run = np.exp(log_pmf(cols, ts[:, None], 0.5))
        run[cols > last[:, None]] = 0.0
        upper = np.concatenate((np.cumsum(run[:, ::-1], axis=1)[:, ::-1], np.zeros((ts.size, 1))), axis=1)
        index = np.clip(x - first[:, None], 0, width)
        tail = np.take_along_axis(upper, index, axis=1)  # P[Bin(t) >= x] less the mass beyond last
        at_x = np.take_along_axis(np.concatenate((run, np.zeros((ts.size, 1))), axis=1), index, axis=1)
        outside = x > last[:, None]  # pmf there is <= e^-log_tail: allowance, not a value
        # E[X 1{X >= x}] = x P[X = x] / 2 + ... folded: the inner sum is
        # (1 - E)(u + a t / 2) S + a (1 + E) (x / 2) P[Bin(t) = x]   (P[Bin(t-1) = x-1] = 2x/t P[Bin(t) = x])
        first_term = (1 - e) * (u[None, :] + a * tf / 2) * tail
        second_term = a * (1 + e) * (x / 2) * at_x
        inner = np.maximum(first_term + second_term, 0.0)
        weights = _weights_along_u(ts, b_lo + 1, u.size, pair) * (weight_b / u)[None, :]
        total += float((weights * inner).sum())
        magnitude += float((weights * (np.abs(first_term) + second_term)).sum())
        beyond += float((weights * outside * (a * (1 + e) * (x / 2) * hoeffding)).sum())
    # Bin(u, 2/k) outside [t_lo, t_hi], per u, by Chernoff; a cell there contributes at most
    # o k / u * (u + a t) * its mass <= o k (1 + a) * mass
    omitted_t = float(np.dot(weight_b, _chernoff_outside(u, pair, t_lo, t_hi)))
    bound = scale * (total + ROUNDING_ALLOWANCE * magnitude + beyond)
    bound += scale * (1 + a) * omitted_t
    return min(1.0, bound + neglected_b)


BLOCKS = 16  # u values the blocked evaluation visits (the window of U is cut into this many runs)


def _conditional_divergences(epsilon: float, keep: float, other: float, k: int, us: IntArray) -> FloatArray:
    """Upper bounds on D_u = D_{e^eps}(P_x0(. | u) || P_x1(. | u)) for each u in ``us`` (u >= 1).

    The Bin(t, 1/2) tails come from our own series (``_binomial.half_upper_tails``, with a proven
    error bound) and a recurrence along t, so one u costs O(width of Bin(u, 2/k)), not its square.
    """
    e = math.exp(epsilon)
    a = keep / other - 1
    pair = 2 / k
    out = np.zeros(us.size)
    for i, u_int in enumerate(us.tolist()):
        t_lo, t_hi, neglected_t = chernoff_window(u_int, pair, _LOG_TAIL)
        ts = np.arange(t_lo, t_hi + 1, dtype=np.int64)
        tf = ts.astype(np.float64)
        u = float(u_int)
        x = np.floor((e * a * tf + (e - 1) * u) / (a * (1 + e))).astype(np.int64) + 1
        xc = np.clip(x, 0, ts + 1)
        tail, tail_error = _upper_tails(xc, ts)
        at_x = np.where(xc > ts, 0.0, np.exp(log_pmf(xc, ts, 0.5)))
        first_term = (1 - e) * (u + a * tf / 2) * tail
        second_term = a * (1 + e) * (xc / 2) * at_x
        inner = np.maximum(first_term + second_term, 0.0)
        weights = pmf_run(t_lo, ts.size, u_int, pair) / u
        total = float(np.dot(weights, inner))
        magnitude = float(np.dot(weights, np.abs(first_term) + second_term))
        total += float(np.dot(weights, (e - 1) * (u + a * tf / 2) * tail_error))
        # t outside the window: a cell contributes at most o k / u (u + a t) * mass <= o k (1 + a) mass
        out[i] = other * k * (total + ROUNDING_ALLOWANCE * magnitude + (1 + a) * neglected_t)
    return np.minimum(out, 1.0)


_SEGMENT = 256  # t values between exact tails in the recurrence
_TAIL_ERROR = 1e-10  # relative; measured worst ~4e-11 (tests/core/accounting/test_grr_blanket.py)


def _tails(x: IntArray, ts: IntArray) -> tuple[FloatArray, FloatArray]:
    """P[Bin(t, 1/2) >= x] and its proven absolute error bound: our own ``half_upper_tails``
    (vectorised; it agrees with scipy's ``betainc``, used here before, to ~1e-15, ADR 0036)."""
    return half_upper_tails(x, ts)


def _upper_tails(x: IntArray, ts: IntArray) -> tuple[FloatArray, FloatArray]:
    """P[Bin(t, 1/2) >= x] along consecutive t, and an absolute error bound for each.

    Where x rises by 0 or 1 per t inside 1..t: the tail (``half_upper_tails``, our own: ADR 0036)
    every ``_SEGMENT`` t and between them S(t + 1, x) = S(t, x) +
    pmf(t, x - 1) / 2, S(t, x + 1) = S(t, x) - pmf(t, x) summed; the bound is ``_TAIL_ERROR`` of
    the anchor (or the anchor's proven bound where larger) plus the summed magnitudes (measured
    against exact rationals: the sums ~4e-11). Elsewhere ``half_upper_tails`` at every t.
    """
    steps = np.diff(x)
    if ts.size < 2 or x.min() < 1 or bool(np.any(x > ts)) or bool(np.any((steps != 0) & (steps != 1))):
        direct, direct_error = _tails(x, ts)
        return direct, np.maximum(direct_error, _TAIL_ERROR * direct)
    rows = -(-ts.size // _SEGMENT)
    inc = np.zeros(rows * _SEGMENT)
    below = np.exp(log_pmf(x[:-1] - 1, ts[:-1], 0.5))  # P[Bin(t) = x - 1]; P[Bin(t + 1) = x] is
    inc[: ts.size - 1] = below * (0.5 - (steps == 1) * (ts[:-1] + 1) / (2.0 * x[:-1]))  # it (t+1)/(2x)
    firsts = np.arange(rows) * _SEGMENT
    anchors, anchor_errors = _tails(x[firsts], ts[firsts])
    grid = inc.reshape(rows, _SEGMENT)
    zero = np.zeros((rows, 1))
    partial = np.concatenate((zero, np.cumsum(grid, axis=1)[:, :-1]), axis=1)
    spread = np.concatenate((zero, np.cumsum(np.abs(grid), axis=1)[:, :-1]), axis=1)
    tails = (anchors[:, None] + partial).ravel()[: ts.size]
    anchor_bound = np.maximum(anchor_errors, _TAIL_ERROR * anchors)
    errors = (anchor_bound[:, None] + _TAIL_ERROR * spread).ravel()[: ts.size]
    return np.clip(tails, 0.0, 1.0), errors


def blocked_delta(
    epsilon: float, keep: float, other: float, k: int, n: int, blocks: int | None = None
) -> float:
    """The full blanket at the real n, u blocked: sum_j P[U in block j] D_{first u of block j}.

    D_u falls with u (u + 1 draws are u draws plus one independent uniform draw, the same
    post-processing of both hypotheses), so each block's first u bounds the whole block.
    """
    if k < 3:
        raise ValueError("the full blanket needs k >= 3 (k = 2 is the restricted blanket)")
    if math.exp(epsilon) >= keep / other:
        return 0.0
    others = n - 1
    if others == 0:
        return max(0.0, keep - math.exp(epsilon) * other)
    blanket = min(1.0, k * other)
    b_lo, b_hi, neglected_b = chernoff_window(others, blanket, _LOG_TAIL)
    mass = pmf_run(b_lo, b_hi - b_lo + 1, others, blanket)
    count = min(blocks or BLOCKS, mass.size)
    edges = np.linspace(0, mass.size, count + 1).astype(np.int64)
    starts = edges[:-1]
    block_mass = np.add.reduceat(mass, starts) * (1 + ROUNDING_ALLOWANCE)
    divergences = _conditional_divergences(epsilon, keep, other, k, (b_lo + 1 + starts).astype(np.int64))
    return min(1.0, float(np.dot(block_mass, divergences)) + neglected_b)


def blocked_cells(others: int, blanket: float, k: int) -> int:
    """(blocks) x (t values at the largest u): the cost of one blocked evaluation."""
    lo, hi, _ = chernoff_window(others, blanket, _LOG_TAIL)
    t_lo, t_hi, _ = chernoff_window(hi + 1, 2 / k, _LOG_TAIL)
    return min(BLOCKS, hi - lo + 1) * (t_hi - t_lo + 1)
