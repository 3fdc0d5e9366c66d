"""Post-processing of debiased estimates: free of privacy cost, pure functions over numpy arrays.

Fixed order (each step sees the previous one's output): project onto the simplex, clip to
non-negative, suppress buckets under a threshold, keep the top k. The projection comes first so
that it is the exact Euclidean projection of the unbiased estimates; clipping after it changes
nothing. Suppression and top-k set buckets to 0 (flagged), so the total may then fall below n.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

PROJECT_SIMPLEX = "project_simplex"
CLIP_NON_NEGATIVE = "clip_non_negative"
SUPPRESS_BELOW = "suppress_below"
TOP_K = "top_k"
ORDER = (PROJECT_SIMPLEX, CLIP_NON_NEGATIVE, SUPPRESS_BELOW, TOP_K)


@dataclass(frozen=True)
class Options:
    """What to apply; 0 turns ``suppress_below`` and ``top_k`` off."""

    clip_non_negative: bool = False
    project_simplex: bool = False
    suppress_below: float = 0.0
    top_k: int = 0

    @property
    def any(self) -> bool:
        """Whether anything at all was asked for."""
        return self.clip_non_negative or self.project_simplex or self.suppress_below != 0 or self.top_k != 0

    def check(self, buckets: int) -> None:
        """ValueError for a threshold that is negative or not finite, or top_k outside 0..buckets."""
        if not math.isfinite(self.suppress_below) or self.suppress_below < 0:
            raise ValueError(f"suppress_below must be a finite number >= 0, got {self.suppress_below!r}")
        if self.top_k < 0 or self.top_k > buckets:
            raise ValueError(f"top_k must lie in 0..{buckets} (the number of buckets), got {self.top_k}")


@dataclass(frozen=True)
class Processed:
    """Post-processed values, which buckets were suppressed, and the steps applied in order."""

    values: FloatArray
    suppressed: BoolArray
    applied: list[str] = field(default_factory=list)


def clip_non_negative(x: FloatArray) -> FloatArray:
    """Negative entries become 0."""
    return np.maximum(np.asarray(x, dtype=np.float64), 0.0)


def project_simplex(x: FloatArray, total: float) -> FloatArray:
    """Exact Euclidean projection onto {y >= 0, sum y = total} (sort-based; Held, Wolfe, Crowder 1974).

    With u sorted descending, rho = max{j : u_j - (sum_{i<=j} u_i - total) / j > 0},
    theta = (sum_{i<=rho} u_i - total) / rho, and y = max(x - theta, 0).
    """
    v = np.asarray(x, dtype=np.float64)
    if v.ndim != 1 or v.size == 0:
        raise ValueError("project_simplex needs a non-empty vector")
    if not (math.isfinite(total) and total >= 0):
        raise ValueError(f"the simplex total must be finite and >= 0, got {total!r}")
    if not np.all(np.isfinite(v)):
        raise ValueError("cannot project a vector with non-finite entries")
    if total == 0:
        return np.zeros_like(v)
    u = np.sort(v)[::-1]
    excess = np.cumsum(u) - total
    ranks = np.arange(1, v.size + 1)
    rho = int(np.nonzero(u - excess / ranks > 0)[0][-1]) + 1
    theta = float(excess[rho - 1]) / rho
    projected: FloatArray = np.maximum(v - theta, 0.0)
    return projected


def suppress_below(x: FloatArray, threshold: float) -> tuple[FloatArray, BoolArray]:
    """Entries strictly under ``threshold`` become 0 and are flagged."""
    v = np.asarray(x, dtype=np.float64)
    mask = v < threshold
    return np.where(mask, 0.0, v), mask


def top_k(x: FloatArray, k: int) -> tuple[FloatArray, BoolArray]:
    """Keep the k largest entries (ties: the lower index first); the others become 0 and are flagged."""
    v = np.asarray(x, dtype=np.float64)
    if not 0 <= k <= v.size:
        raise ValueError(f"top_k must lie in 0..{v.size}, got {k}")
    order = np.lexsort((np.arange(v.size), -v))  # by value descending, then index ascending
    drop = np.zeros(v.size, dtype=np.bool_)
    drop[order[k:]] = True
    return np.where(drop, 0.0, v), drop


def bonferroni_confidence(confidence: float, buckets: int) -> float:
    """Per-bucket confidence making k two-sided intervals hold together: 1 - (1 - confidence) / k."""
    if not 0 < confidence < 1:
        raise ValueError("confidence must lie in (0, 1)")
    if buckets < 1:
        raise ValueError("need at least one bucket")
    return 1 - (1 - confidence) / buckets


def bonferroni_z(confidence: float, buckets: int) -> float:
    """The normal quantile at 1 - (1 - confidence) / (2k): half-width multiplier of simultaneous CIs."""
    bonferroni_confidence(confidence, buckets)
    return NormalDist().inv_cdf(1 - (1 - confidence) / (2 * buckets))


def apply(estimates: FloatArray, n: float, options: Options) -> Processed:
    """Apply the requested steps in ORDER to a copy of ``estimates``; n is the simplex total."""
    values = np.array(estimates, dtype=np.float64)
    options.check(values.size)
    suppressed = np.zeros(values.size, dtype=np.bool_)
    applied: list[str] = []
    if options.project_simplex:
        values = project_simplex(values, float(n))
        applied.append(PROJECT_SIMPLEX)
    if options.clip_non_negative:
        values = clip_non_negative(values)
        applied.append(CLIP_NON_NEGATIVE)
    if options.suppress_below > 0:
        values, mask = suppress_below(values, options.suppress_below)
        suppressed |= mask
        applied.append(f"{SUPPRESS_BELOW}({options.suppress_below:g})")
    if options.top_k > 0:
        values, mask = top_k(values, options.top_k)
        suppressed |= mask
        applied.append(f"{TOP_K}({options.top_k})")
    return Processed(values=values, suppressed=suppressed, applied=applied)
