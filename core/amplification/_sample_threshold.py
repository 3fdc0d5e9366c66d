"""Sample and threshold: the two changed buckets composed jointly (docs/mechanisms/sample_and_threshold.md).

Replacing one user's value moves bucket a (gains the user: R(m_a + 1) against R(m_a)) and bucket b
(loses it: R(m_b) against R(m_b + 1)), R(m) the thresholded release of a bucket of m users. For
every (m_a, m_b), conditioning on bucket b's output y,

    D_{e^eps}(P_a x P_b || Q_a x Q_b) = E_{y ~ P_b}[ D_{e^(eps - L_b(y))}(P_a || Q_a) ]
                                    <= E_{y ~ P_b}[ gain(eps - L_b(y)) ],

L_b = ln(P_b / Q_b) and gain(t) = sup_m D_{e^t}(R(m + 1) || R(m)), non-increasing in t.

* Past ``ROWS`` users a bucket's pair is a post-processing of the UNthresholded pair at ROWS:
  R(m) = thr(Bin(ROWS, s) + Z), R(m + 1) = thr(Bin(ROWS + 1, s) + Z), Z ~ Bin(m - ROWS, s) independent.
  So gain(t) is the largest of the thresholded pairs below ROWS and the raw pair at ROWS, and every
  m_b >= ROWS is covered by the raw losing pair (Bin(ROWS, s), Bin(ROWS + 1, s)): no tail bound.
* gain is tabulated on t_i = i / 128 from just below -ln(1/(1 - s)) (the least eps - L_b can be at
  eps >= 0) to 2, and read at the grid point at or below t (that only raises it).

The old statement, gain(eps - ln(1/(1 - s))), is this expectation with L_b replaced by its maximum.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Final

from deniable.core.amplification.shuffle import AmplificationBound

if TYPE_CHECKING:
    import numpy as np
else:
    from deniable.core.lazy import numpy as np

ROWS_BEYOND: Final = 400  # thresholded pairs up to tau + this many users; the raw pair beyond
_STEPS: Final = 128  # grid steps per unit of t
_T_MAX: Final = 2.0  # the grid's top; beyond it gain is read at the top (it only falls)
_SAFETY: Final = 1 + 1e-9


def _rows(rate: float, top: int) -> list[np.ndarray]:
    """P[Bin(m, s) = k], k = 0..m, for m = 0..top."""
    rows = [np.array([1.0])]
    for _ in range(top):
        row = rows[-1]
        rows.append(np.concatenate((row * (1 - rate), [0.0])) + np.concatenate(([0.0], row * rate)))
    return rows


def _release(row: np.ndarray, threshold: int, length: int, raw: bool) -> np.ndarray:
    """The row on a common grid: index 0 = suppressed (0 when raw), index k + 1 = count k."""
    out = np.zeros(length + 1)
    out[1 : len(row) + 1] = row
    if not raw:
        out[0] = row[: threshold + 1].sum()
        out[1 : threshold + 2] = 0.0
    return out


def _pairs(rate: float, threshold: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(R(m + 1), R(m)) for m = threshold..top - 1 (thresholded) and the raw pair at top."""
    top = threshold + ROWS_BEYOND
    rows = _rows(rate, top + 1)
    length = top + 2
    pairs = [
        (_release(rows[m + 1], threshold, length, False), _release(rows[m], threshold, length, False))
        for m in range(threshold, top)
    ]
    pairs.append(
        (_release(rows[top + 1], threshold, length, True), _release(rows[top], threshold, length, True))
    )
    return pairs


def _first_step(rate: float) -> int:
    """Grid index of the lowest t tabulated: just below -ln(1/(1 - s)), the least eps - L_b at eps >= 0."""
    return -math.ceil(-math.log1p(-rate) * _STEPS) - 1


@functools.lru_cache(maxsize=32)
def gain_table(rate: float, threshold: int) -> np.ndarray:
    """gain(t_i), t_i = i / _STEPS for i = _first_step.._T_MAX * _STEPS: an upper bound at each."""
    t = np.arange(_first_step(rate), int(_T_MAX * _STEPS) + 1) / _STEPS
    e = np.exp(t)
    worst = np.zeros_like(t)
    for p, q in _pairs(rate, threshold):  # (m < threshold: both always suppressed, divergence 0)
        keep = p > 0
        worst = np.maximum(worst, np.clip(p[keep][None, :] - np.outer(e, q[keep]), 0.0, None).sum(axis=1))
    return np.minimum(1.0, worst * _SAFETY + 1e-300)


def _read(rate: float, table: np.ndarray, t: np.ndarray) -> np.ndarray:
    """gain at t, read at the grid point at or below t (1 below the grid, the top above it)."""
    index = np.floor(np.asarray(t) * _STEPS - 1e-6) - _first_step(rate)  # rounds t down, never up
    safe = np.clip(index, 0, len(table) - 1).astype(np.int64)
    return np.where(index < 0, 1.0, table[safe])


@functools.lru_cache(maxsize=32)
def losing_views(rate: float, threshold: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(P_b, L_b, starts): bucket b's pairs R(m_b) against R(m_b + 1), flattened one run per pair,
    for m_b = 0..top - 1 (thresholded) and the raw pair at top (covering every larger m_b)."""
    probs, losses, starts, offset = [], [], [], 0
    for q, p in _pairs(rate, threshold):  # the gaining pair read backwards is the losing one
        keep = p > 0
        with np.errstate(divide="ignore"):
            loss = np.log(p[keep]) - np.log(q[keep])
        probs.append(p[keep])
        losses.append(loss)
        starts.append(offset)
        offset += int(keep.sum())
    return np.concatenate(probs), np.concatenate(losses), np.array(starts)


def joint_delta(rate: float, threshold: int, epsilon: float) -> float:
    """An upper bound on sup over (m_a, m_b) of the two changed buckets' joint divergence at e^eps.

    Losing sizes m_b < threshold release "suppressed" under both datasets (divergence of the pair
    = gain(eps)); the runs cover m_b = threshold.. and the raw pair beyond.
    """
    if not 0 < rate < 1 or threshold < 0:
        return 1.0
    table = gain_table(rate, threshold)
    probs, losses, starts = losing_views(rate, threshold)
    read = _read(rate, table, epsilon - losses)
    worst = max(
        float(np.add.reduceat(probs * read, starts).max()), float(_read(rate, table, np.array([epsilon]))[0])
    )
    return min(1.0, worst * _SAFETY + 1e-300)


SAMPLE_THRESHOLD_JOINT = "sample-and-threshold: the two changed buckets composed jointly (certified bound)"


def joint_profile(rate: float, threshold: int, epsilon: float) -> float:
    """delta(eps): the smaller of the joint bound and the one-bucket-plus-ln(1/(1-s)) bound (both valid)."""
    from deniable.core.amplification.protocols import sample_threshold_delta

    return min(joint_delta(rate, threshold, epsilon), sample_threshold_delta(rate, threshold, epsilon))


@functools.lru_cache(maxsize=256)
def joint_guarantee(rate: float, threshold: int, delta: float) -> AmplificationBound:
    """Smallest eps with ``joint_profile`` <= delta; the separate composition's verdict when that
    says "not applicable" (s^(tau+1) > delta, or parameters out of range)."""
    from deniable.core.amplification.protocols import sample_threshold_guarantee, smallest_epsilon

    separate = sample_threshold_guarantee(rate, threshold, delta)
    if not separate.amplified:
        return separate
    epsilon = min(separate.epsilon, smallest_epsilon(lambda eps: joint_profile(rate, threshold, eps), delta))
    note = (
        "released histogram only (suppressed counts and the raw sampled counts are the aggregator's);"
        f" two changed buckets composed jointly: eps = {epsilon:.4g}"
        f" (adding ln(1/(1-s)) to the gaining bucket's profile gave {separate.epsilon:.4g})"
    )
    return AmplificationBound(epsilon, delta, SAMPLE_THRESHOLD_JOINT, True, note)
