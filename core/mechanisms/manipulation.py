"""How far fake well-formed reports can move each estimate: the poisoning bound every answer states.

Encryption and the shuffle stop outsiders from reading or tracing reports, not from sending
well-formed lies: anyone who can submit can add reports with payloads the randomiser could have
emitted. Every estimator here is affine in (counts, n): estimate_j = Σ_i A[j, i] c_i + B[j] n + C_j.
A fake report with count-cell vector t (its tally) also adds 1 to n, so it moves estimate j by
exactly s_j(t) = (A t)_j + B_j, whatever the other reports are, and m fakes move it by the sum of
their shifts. Hence m fakes raise estimate j by at most m · max_t s_j(t) and lower it by at most
m · max_t (−s_j(t)), over the payloads ``fake_payloads`` enumerates, and both are attained by m
copies of the maximising payload (docs/queries.md gives the proof; tests check it exactly).

A and B are read off the mechanism's own ``estimate`` by finite differences at the current
counts (exact for an affine map, up to floating-point rounding).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from deniable.core.mechanisms.base import FloatArray, LocalRandomiser

if TYPE_CHECKING:
    import numpy as np
else:
    from deniable.core.lazy import numpy as np

DEFAULT_FRACTION: Final = 0.01
DEFAULT_RULE: Final = "m = 1% of the counted reports, at least 1 (the bound scales linearly in m)"
OPERATOR_RULE: Final = (
    "m given by the operator (e.g. the per-source quota times the sources the shuffler saw)"
)
MAX_FAKE_REPORTS: Final = 2**53
"""Largest operator-given m: beyond it float products stop being exact integers' images."""
MAX_BUCKETS: Final = 256
"""Probing costs one estimate per count cell: beyond this many buckets the bound is not derived."""


def default_fake_reports(n: int) -> int:
    """The documented default m: 1% of the counted reports, at least 1."""
    return max(1, math.ceil(DEFAULT_FRACTION * n))


@dataclass(frozen=True)
class ReportShift:
    """Per bucket: the largest upward and downward move one fake report can cause (both >= 0)."""

    raise_per_report: FloatArray
    lower_per_report: FloatArray

    def for_reports(self, m: int) -> tuple[FloatArray, FloatArray]:
        """(raise, lower) per bucket for ``m`` fake reports."""
        return m * self.raise_per_report, m * self.lower_per_report


def _estimates(randomiser: LocalRandomiser, counts: FloatArray, n: int) -> FloatArray:
    values = randomiser.estimate([int(c) for c in counts], n)
    return np.array([e.estimate for e in values], dtype=np.float64)


_TALLIES: dict[tuple[object, ...], FloatArray | None] = {}
_CACHE_SIZE: Final = 64


def _tallies_for(randomiser: LocalRandomiser) -> FloatArray | None:
    """Distinct count-cell vectors of the enumerable fake payloads (cached per mechanism setting)."""
    key = _key(randomiser)
    if key not in _TALLIES:
        payloads = randomiser.fake_payloads()
        rows = (
            None
            if payloads is None
            else {tuple(int(x) for x in randomiser.tally([p]).counts) for p in payloads}
        )
        if len(_TALLIES) >= _CACHE_SIZE:
            _TALLIES.clear()
        _TALLIES[key] = None if rows is None else np.array(sorted(rows), dtype=np.float64)
    return _TALLIES[key]


def _key(randomiser: LocalRandomiser) -> tuple[object, ...]:
    params = tuple(sorted(randomiser.parameters().items()))
    return (type(randomiser).__name__, randomiser.epsilon0, randomiser.domain_size, params)


def report_shift(randomiser: LocalRandomiser, counts: Sequence[int], n: int) -> ReportShift | None:
    """The per-report bound, or None where it is not derived (multi-message protocols, payload
    sets too large to enumerate, more than MAX_BUCKETS buckets)."""
    if randomiser.multi_message or randomiser.domain_size > MAX_BUCKETS:
        return None
    tallies = _tallies_for(randomiser)
    if tallies is None or len(tallies) == 0:
        return None
    base = np.asarray(counts, dtype=np.float64)
    if n == 0:  # nothing counted: differences around one (fake-shaped) report
        base, n = tallies[0].copy(), 1
    at_base = _estimates(randomiser, base, n)
    per_n = _estimates(randomiser, base, n + 1) - at_base
    cells = len(base)
    slopes = np.empty((len(at_base), cells), dtype=np.float64)
    for i in range(cells):
        bumped = base.copy()
        bumped[i] += 1
        slopes[:, i] = _estimates(randomiser, bumped, n) - at_base
    shifts = tallies @ slopes.T + per_n  # one row per fake payload shape, one column per bucket
    return ReportShift(
        raise_per_report=np.maximum(shifts.max(axis=0), 0.0),
        lower_per_report=np.maximum(-shifts.min(axis=0), 0.0),
    )
