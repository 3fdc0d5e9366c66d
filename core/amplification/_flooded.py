"""Exact two-bucket profile of the flooded (signed-noise) histogram.

Per bucket the analyser sees two counts: U = S + N1 + F ("+1" messages) and V = N2 + F ("-1"
messages), N1, N2 the totals of the devices' Polya draws and F the total of their flood pairs
(one "+1" and one "-1" together). F is Bin(n, r) (a Bernoulli pair per device, ADR 0035) or
NB(n / S, b) (each device draws NB(1 / S, b) pairs, a Polya draw; ADR 0044): the NB flood has
variance / mean = 1 / (1 - b), so it hides the same with fewer messages.
Buckets are independent given the data, and a changed value moves one device's "+1" from
bucket b to bucket a, so the whole view's divergence is the exact composition of two 2-D shifts:
(U + 1, V) vs (U, V) in bucket a and the reverse in bucket b.
In the coordinates (D, V) = (U - V, V) = (S + N1 - N2, N2 + F) the shift moves D only.

P[D = t, V = v] = sum_k P[N2 = k] P[N1 = t + k] P[F = v - k]; every atom's privacy loss is
computed and the two buckets composed exactly (sorted losses and prefix sums, as in
``protocols.two_bucket_delta``). Windows leave out at most e^-60 of each law, added to delta.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Final

from deniable.core.amplification._binomial import chernoff_window, pmf_run

if TYPE_CHECKING:
    import numpy as np
else:
    from deniable.core.lazy import numpy as np

_SAFETY: Final = 1 + 1e-9
_LOG_TAIL: Final = 60.0


@functools.lru_cache(maxsize=64)
def polya_single(n: int, shares: int, nonzero: float) -> tuple[np.ndarray, float]:
    """(pmf from 0, tail): NB(n / shares, a), a = 1 - (1 - nonzero)^shares, the sum of n devices'
    Polya draws; the window leaves out at most e^-60 (returned as ``tail``)."""
    s = n / shares
    a = -math.expm1(shares * math.log1p(-nonzero))
    mean, var = s * a / (1 - a), s * a / (1 - a) ** 2
    top = max(8, math.ceil(mean + 40 * math.sqrt(var) + _LOG_TAIL / -math.log(a)))
    while True:
        k = np.arange(top, dtype=np.float64)
        steps = math.log(a) + np.log((k[:-1] + s) / (k[:-1] + 1))
        logs = np.concatenate(([n * math.log1p(-nonzero)], n * math.log1p(-nonzero) + np.cumsum(steps)))
        ratio = a * (top - 1 + s) / top if s > 1 else a
        tail = math.exp(float(logs[-1])) * ratio / (1 - ratio) if ratio < 1 else math.inf
        if tail <= math.exp(-_LOG_TAIL):
            return np.exp(logs), tail
        top *= 2


@functools.lru_cache(maxsize=64)
def flood_law(n: int, rate: float, shares: int = 0) -> tuple[int, np.ndarray, float]:
    """(lo, pmf, neglected) of the total flood F: Bin(n, rate) on its Chernoff window when
    ``shares`` is 0, else NB(n / shares, b), b = 1 - (1 - rate)^shares (every device's pairs a
    Polya draw that is nonzero w.p. ``rate``) with each end trimmed of at most e^-60."""
    if rate <= 0:
        return 0, np.ones(1), 0.0
    if shares == 0:
        lo, hi, neglected = chernoff_window(n, rate, _LOG_TAIL)
        return lo, pmf_run(lo, hi - lo + 1, n, rate), neglected
    pmf, tail = polya_single(n, shares, rate)
    cut = math.exp(-_LOG_TAIL)
    lower, upper = np.cumsum(pmf), np.cumsum(pmf[::-1])
    lo = int(np.searchsorted(lower, cut, side="right"))  # pmf[:lo] sums to <= e^-60
    drop = int(np.searchsorted(upper, cut, side="right"))  # so does pmf[len - drop:]
    dropped = (float(lower[lo - 1]) if lo else 0.0) + (float(upper[drop - 1]) if drop else 0.0)
    return lo, pmf[lo : pmf.size - drop], tail + dropped


def joint_law(noise: np.ndarray, flood: np.ndarray) -> np.ndarray:
    """P[D = t, V = v] on rows t = -(K-1)..K-1, columns v - lo = 0..F + K - 2 (K = len(noise))."""
    size, width = noise.size, flood.size
    joint = np.zeros((2 * size - 1, width + size - 1))
    block = np.outer(noise, flood)
    for k in range(size):
        if noise[k] > 0:
            joint[size - 1 - k : 2 * size - 1 - k, k : k + width] += noise[k] * block
    return joint


Prepared = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]


def prepare(joint: np.ndarray, neglected: float) -> Prepared:
    """Bucket a gains a "+1" (P_a = law shifted by one in D, Q_a = law), bucket b loses one (the
    reverse): a's atoms with their losses, b's losses sorted with suffix sums of P_b and Q_b."""
    zero = np.zeros((1, joint.shape[1]))
    shifted, here = np.concatenate((zero, joint)).ravel(), np.concatenate((joint, zero)).ravel()
    p_a, q_a, p_b, q_b = shifted, here, here, shifted
    with np.errstate(divide="ignore", invalid="ignore"):
        loss_a = np.log(p_a) - np.log(q_a)
        loss_b = np.log(p_b) - np.log(q_b)
    keep_a, keep_b = p_a > 0, p_b > 0
    order = np.argsort(loss_b[keep_b], kind="stable")
    p_suffix = np.concatenate((np.cumsum(p_b[keep_b][order][::-1])[::-1], [0.0]))
    q_suffix = np.concatenate((np.cumsum(q_b[keep_b][order][::-1])[::-1], [0.0]))
    sorted_loss = loss_b[keep_b][order]
    return loss_a[keep_a], p_a[keep_a], q_a[keep_a], sorted_loss, p_suffix, q_suffix, neglected


def atoms_delta(prepared: Prepared, epsilon: float) -> float:
    """D_{e^eps}((U_a + 1, V_a), (U_b, V_b) || (U_a, V_a), (U_b + 1, V_b)): for each a-atom the
    b-atoms with total loss above eps are a suffix in loss order. The pair is symmetric (swap a
    and b), so this is the divergence in both directions; the windows' missing mass is added."""
    loss_a, p_a, q_a, sorted_loss, p_suffix, q_suffix, neglected = prepared
    start = np.searchsorted(sorted_loss, epsilon - loss_a, side="right")
    terms = p_a * p_suffix[start] - math.exp(epsilon) * q_a * q_suffix[start]
    hockey = float(np.clip(terms, 0.0, None).sum())
    return min(1.0, hockey * _SAFETY + 2 * neglected + 1e-300)


@functools.lru_cache(maxsize=16)
def bucket_law(n: int, shares: int, nonzero: float, rate: float, flood_shares: int = 0) -> Prepared:
    """The prepared two-bucket atoms of the per-bucket (D, V) law at n devices."""
    noise, tail = polya_single(n, shares, nonzero)
    _, flood, neglected = flood_law(n, rate, flood_shares)
    return prepare(joint_law(noise, flood), 2 * tail + neglected)


def flooded_delta(
    n: int, shares: int, nonzero: float, rate: float, epsilon: float, flood_shares: int = 0
) -> float:
    """delta(eps) of the whole shuffled view at n devices (exact but for the e^-60 windows);
    ``flood_shares`` 0: Bernoulli(rate) pairs per device, else NB(1 / flood_shares, b) pairs."""
    if n < 1:
        return 1.0
    law = bucket_law(int(n), int(shares), float(nonzero), float(rate), int(flood_shares))
    return atoms_delta(law, epsilon)
