"""Amplification-by-shuffling analyses behind one interface: a privacy profile and its inverse.

Each analysis is an upper bound on the privacy profile delta(eps) = sup over neighbouring datasets
of the hockey-stick divergence D_{e^eps} of the shuffled output, valid for the randomisers named in
its ``validity``. ``epsilon_for_delta`` returns the smallest eps (to ~1e-6 relative, rounded up)
whose profile is at most delta, never more than the local epsilon (which holds with delta = 0).
"""

from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from deniable.core.amplification import _binary_rr, _blanket
from deniable.core.amplification._mixtures import clone_delta
from deniable.core.amplification.shuffle import (
    FMT21_CLOSED_FORM,
    LOCAL_ONLY,
    AmplificationBound,
    fmt21_closed_form,
    fmt21_closed_form_applicable,
)

SEARCH_RELATIVE_TOLERANCE = 1e-6
# Work budget (configurations x FFT length) of the exact binary RR analysis (about 1 s here).
EXACT_RR_MAX_WORK = 20_000_000
# Beyond the budget: the configuration search stops within this relative distance (in eps) of
# an evaluated configuration's exact eps (a lower bound on the true one), or in delta for profiles.
GRID_TOLERANCE = 0.006
GRID_DELTA_TOLERANCE = 0.02
# Cells (u x t) per evaluation of the full GRR blanket (about 0.15 s here; ~15 per search).
FULL_BLANKET_MAX_CELLS = 4_000_000
# Beyond it, the u-blocked evaluation at n: (blocks x t values) per evaluation, ~0.7 us each on a loaded core.
BLOCKED_BLANKET_MAX_CELLS = 1_500_000


class NotApplicable(ValueError):
    """The analysis says nothing for these parameters (validity condition or cost cap)."""


def check_inputs(epsilon0: float, n: int, delta: float | None = None) -> None:
    """Positive finite epsilon0, n >= 0, delta in (0, 1) when given; ValueError otherwise."""
    if not (math.isfinite(epsilon0) and epsilon0 > 0):
        raise ValueError("epsilon0 must be positive and finite")
    if isinstance(n, bool) or int(n) != n or n < 0:
        raise ValueError("n must be a non-negative integer")
    if delta is not None and not 0 < delta < 1:
        raise ValueError("delta must lie in (0, 1)")


@dataclass(frozen=True)
class Analysis(ABC):
    """One amplification analysis for n shuffled reports of an epsilon0-LDP randomiser."""

    epsilon0: float
    n: int

    name: ClassVar[str]
    citation: ClassVar[str]
    validity: ClassVar[str]

    def __post_init__(self) -> None:
        check_inputs(self.epsilon0, self.n)
        if self.epsilon0 > 700:
            raise ValueError("epsilon0 > 700: e^epsilon0 overflows (and nothing amplifies)")

    @property
    def local_epsilon(self) -> float:
        """The epsilon that holds with delta = 0 before shuffling (the search's upper end)."""
        return self.epsilon0

    @abstractmethod
    def delta_for_epsilon(self, epsilon: float) -> float:
        """An upper bound on the privacy profile at epsilon (0 at or above the local epsilon)."""

    def not_applicable_reason(self, delta: float) -> str | None:
        """Why the analysis gives nothing at this delta, or None when it applies."""
        del delta
        return None

    def detail(self) -> str:
        """How this instance was evaluated, when that is worth a note (else empty)."""
        return ""

    def epsilon_floor(self, delta: float) -> float:
        """A cheap lower bound on epsilon_for_delta(delta), to skip analyses that cannot win."""
        del delta
        return 0.0

    def epsilon_for_delta(self, delta: float) -> float:
        """Smallest eps with delta_for_epsilon(eps) <= delta (search_epsilon); the valid end is returned."""
        check_inputs(self.epsilon0, self.n, delta)
        reason = self.not_applicable_reason(delta)
        if reason is not None:
            raise NotApplicable(reason)
        return search_epsilon(self.delta_for_epsilon, delta, self.local_epsilon)

    def bound(self, delta: float) -> AmplificationBound:
        """This analysis's guarantee at delta, or the local epsilon0 with delta 0 when it gives none."""
        try:
            epsilon = self.epsilon_for_delta(delta)
        except NotApplicable as exc:
            return local_only(self.epsilon0, f"{self.name} not applicable: {exc}")
        if not is_amplified(epsilon, self.epsilon0):
            return local_only(self.epsilon0, f"{self.name} gives no amplification (n={self.n})")
        return AmplificationBound(epsilon, delta, self.name, True, self.detail())


def largest_affordable_n(n: int, cost: Callable[[int], int], budget: int) -> int:
    """n when cost(n) <= budget, else the largest n' < n within it (cost rises with n).

    Valid for analyses of the true profile, which only falls with n (one more report is
    post-processing), so a bound computed at n' holds at n.
    """
    if cost(n) <= budget:
        return n
    lo, hi = 1, n  # cost(lo) is affordable, cost(hi) is not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if cost(mid) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def budget_detail(n: int, evaluated_n: int) -> str:
    """The note an analysis evaluated below n carries (empty when it ran at n)."""
    if evaluated_n == n:
        return ""
    return f"evaluated at n'={evaluated_n} < n (cost budget); valid because the profile falls with n"


def is_amplified(epsilon: float, epsilon0: float) -> bool:
    """Whether epsilon beats the local epsilon0 by more than the search tolerance."""
    return epsilon < epsilon0 * (1 - SEARCH_RELATIVE_TOLERANCE)


def local_only(epsilon0: float, note: str) -> AmplificationBound:
    """The local guarantee (epsilon0, 0), which holds for any n, with the reason in its note."""
    return AmplificationBound(epsilon0, 0.0, LOCAL_ONLY, False, note)


def search_epsilon(profile: Callable[[float], float], delta: float, upper: float) -> float:
    """Smallest eps in [0, upper] with profile(eps) <= delta, to ~1e-6 relative, from above.

    Brent's method on ln profile(eps) - ln delta keeps a bracket [valid, invalid] and stops when it
    is narrower than the tolerance; the valid end is returned. ``upper`` (the local epsilon,
    delta = 0) is valid by definition, so the answer never exceeds it.
    """
    log_target = math.log(delta)

    def gap(epsilon: float) -> float:
        return math.log(max(profile(epsilon), 1e-300)) - log_target

    g0 = gap(0.0)
    if g0 <= 0:
        return 0.0
    a, fa = 0.0, g0
    b, fb = upper, min(gap(upper), -1.0)
    c, fc = a, fa
    d = e = b - a
    for _ in range(200):
        if (fb > 0) == (fc > 0):
            c, fc = a, fa
            d = e = b - a
        if abs(fc) < abs(fb):
            a, b, c = b, c, b
            fa, fb, fc = fb, fc, fb
        tol = 0.5 * SEARCH_RELATIVE_TOLERANCE * abs(b) + 1e-300
        m = 0.5 * (c - b)
        if abs(m) <= tol or fb == 0:
            break
        if abs(e) >= tol and abs(fa) > abs(fb):
            s = fb / fa
            if a == c:
                p, q = 2 * m * s, 1 - s
            else:
                q, r = fa / fc, fb / fc
                p = s * (2 * m * q * (q - r) - (b - a) * (r - 1))
                q = (q - 1) * (r - 1) * (s - 1)
            if p > 0:
                q = -q
            else:
                p = -p
            if 2 * p < min(3 * m * q - abs(tol * q), abs(e * q)):
                e, d = d, p / q
            else:
                d = e = m
        else:
            d = e = m
        a, fa = b, fb
        b += d if abs(d) > tol else math.copysign(tol, m)
        fb = gap(b)
    return b if fb <= 0 else c


@dataclass(frozen=True)
class FMT21ClosedForm(Analysis):
    """Feldman-McMillan-Talwar 2021, Theorem 3.1: closed form, any epsilon0-LDP randomiser."""

    name: ClassVar[str] = FMT21_CLOSED_FORM
    citation: ClassVar[str] = (
        "V. Feldman, A. McMillan, K. Talwar, Hiding Among the Clones, FOCS 2021, Theorem 3.1"
    )
    validity: ClassVar[str] = "any epsilon0-LDP randomisers, when epsilon0 <= ln(n / (16 ln(2/delta)))"

    def not_applicable_reason(self, delta: float) -> str | None:
        if fmt21_closed_form_applicable(self.epsilon0, self.n, delta):
            return None
        return f"needs epsilon0 <= ln(n / (16 ln(2/delta))) (n={self.n}, delta={delta:g})"

    def epsilon_for_delta(self, delta: float) -> float:
        check_inputs(self.epsilon0, self.n, delta)
        reason = self.not_applicable_reason(delta)
        if reason is not None:
            raise NotApplicable(reason)
        return min(fmt21_closed_form(self.epsilon0, self.n, delta).epsilon, self.epsilon0)

    def delta_for_epsilon(self, epsilon: float) -> float:
        """Smallest delta the theorem certifies at epsilon: invert the formula, respect its condition."""
        if epsilon >= self.epsilon0:
            return 0.0
        if self.n < 1:
            return 1.0
        e0 = math.exp(self.epsilon0)
        beta = (e0 - 1) / (e0 + 1)
        root = ((math.expm1(epsilon) / beta) - 8 * e0 / self.n) * math.sqrt(self.n) / 8
        if root <= 0:
            return 1.0
        inverted = 4 * math.exp(-(root * root) / e0)
        smallest_valid = 2 * math.exp(-self.n / (16 * e0))
        candidate = max(inverted, smallest_valid)
        # Nudge up until the theorem, evaluated in floats, really gives <= epsilon there.
        for attempt in range(60):
            if candidate >= 1:
                return 1.0
            if (
                fmt21_closed_form_applicable(self.epsilon0, self.n, candidate)
                and fmt21_closed_form(self.epsilon0, self.n, candidate).epsilon <= epsilon
            ):
                return candidate
            candidate *= 1 + 1e-12 * 2.0**attempt
        return 1.0


@dataclass(frozen=True)
class FMT21NumericalClones(Analysis):
    """FMT 2021 Theorem 3.2 (clone reduction), its two binomial mixtures compared exactly."""

    name: ClassVar[str] = "FMT 2021 clone reduction (numerical)"
    citation: ClassVar[str] = (
        "V. Feldman, A. McMillan, K. Talwar, Hiding Among the Clones, FOCS 2021, Theorem 3.2 / Appendix E"
    )
    validity: ClassVar[str] = "any epsilon0-LDP randomisers (adaptive too), any n >= 1"

    def delta_for_epsilon(self, epsilon: float) -> float:
        if epsilon >= self.epsilon0:
            return 0.0
        e0 = math.exp(self.epsilon0)
        alpha = e0 / (e0 + 1)
        return clone_delta(epsilon, alpha, max(self.n - 1, 0), math.exp(-self.epsilon0), 1.0)


@dataclass(frozen=True)
class GRRBlanket(Analysis):
    """Privacy blanket of k-ary randomised response, restricted to the two differing outputs.

    Every GRR report is each value w.p. >= o (the "other" probability): w.p. o it is x0, w.p. o x1,
    else a residual the adversary is handed. With C ~ Bin(n-1, 2o) blanket reports on {x0, x1},
    delta(eps) = (p + o) E_C D_{e^eps}(P_C || Q_C), P_C the clone mixture with a = p / (p + o).
    """

    domain_size: int = 2
    keep_probability: float | None = None
    other_probability: float | None = None

    name: ClassVar[str] = "GRR privacy blanket (numerical)"
    citation: ClassVar[str] = (
        "B. Balle, J. Bell, A. Gascon, K. Nissim, The Privacy Blanket of the Shuffle Model, CRYPTO 2019"
    )
    validity: ClassVar[str] = "k-ary randomised response (GRR) only; binary RR is k = 2"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.domain_size < 2:
            raise ValueError("GRR needs at least 2 categories")
        p, o = self._probabilities()
        if not (0 < o <= p < 1) or abs(p + (self.domain_size - 1) * o - 1) > 1e-9:
            raise ValueError("keep/other probabilities do not describe a GRR over domain_size values")

    def _probabilities(self) -> tuple[float, float]:
        if self.keep_probability is not None and self.other_probability is not None:
            return self.keep_probability, self.other_probability
        e0 = math.exp(self.epsilon0)
        total = e0 + self.domain_size - 1
        return e0 / total, 1 / total

    @property
    def local_epsilon(self) -> float:
        p, o = self._probabilities()
        return min(self.epsilon0, math.log(p / o))

    def delta_for_epsilon(self, epsilon: float) -> float:
        p, o = self._probabilities()
        if epsilon >= self.local_epsilon:
            return 0.0
        return clone_delta(epsilon, p / (p + o), max(self.n - 1, 0), 2 * o, p + o)


@dataclass(frozen=True)
class GRRFullBlanket(GRRBlanket):
    """The full privacy blanket of k-ary RR (k >= 3): the adversary learns the number of blanket
    reports, not whether the victim's report fell outside the two differing values.

    Computed exactly over (blanket count u, reports t on {x0, x1}) within ``max_cells``; beyond
    it at the same n with u in blocks, each bounded by its first u (the conditional divergence
    falls with u: docs/amplification.md §3c). Only past ``blocked_max_cells`` too is it evaluated
    at the largest affordable n' < n (post-processing: the bound for n' users holds for n).
    """

    max_cells: int = field(default=FULL_BLANKET_MAX_CELLS, compare=False)
    blocked_max_cells: int = field(default=BLOCKED_BLANKET_MAX_CELLS, compare=False)

    name: ClassVar[str] = "GRR full privacy blanket (numerical)"
    citation: ClassVar[str] = (
        "B. Balle, J. Bell, A. Gascon, K. Nissim, The Privacy Blanket of the Shuffle Model, CRYPTO 2019"
        " (the blanket divergence computed exactly)"
    )
    validity: ClassVar[str] = "k-ary randomised response (GRR) with k >= 3"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.domain_size < 3:
            raise ValueError("the full blanket needs k >= 3 (for k = 2 use GRRBlanket or BinaryRRExact)")

    def _blanket_rate(self) -> float:
        _, o = self._probabilities()
        return min(1.0, self.domain_size * o)

    def _cells(self, n: int) -> int:
        return _blanket.window_cells(max(n - 1, 1), self._blanket_rate(), self.domain_size)

    def _blocked_cells(self, n: int) -> int:
        return _blanket.blocked_cells(max(n - 1, 1), self._blanket_rate(), self.domain_size)

    @property
    def blocked(self) -> bool:
        """Whether u is blocked (the exact double sum is past ``max_cells``)."""
        return self._cells(self.evaluated_n) > self.max_cells

    @property
    def evaluated_n(self) -> int:
        """n itself when exact or blocked is affordable, else the largest blocked n' < n."""
        if self._cells(self.n) <= self.max_cells:
            return self.n
        return largest_affordable_n(self.n, self._blocked_cells, self.blocked_max_cells)

    def detail(self) -> str:
        note = budget_detail(self.n, self.evaluated_n)
        if self.blocked:
            note = "; ".join(filter(None, [f"u in {_blanket.BLOCKS} blocks", note]))
        return note

    def delta_for_epsilon(self, epsilon: float) -> float:
        p, o = self._probabilities()
        if epsilon >= self.local_epsilon:
            return 0.0
        if self.blocked:
            return _blanket.blocked_delta(epsilon, p, o, self.domain_size, self.evaluated_n)
        return _blanket.full_blanket_delta(epsilon, p, o, self.domain_size, self.evaluated_n)

    def epsilon_for_delta(self, delta: float) -> float:
        p, o = self._probabilities()
        return _cached_full_blanket_epsilon(
            self.epsilon0, p, o, self.domain_size, self.evaluated_n, delta, self.blocked
        )


@functools.lru_cache(maxsize=256)
def _cached_full_blanket_epsilon(
    epsilon0: float, keep: float, other: float, k: int, n: int, delta: float, blocked: bool
) -> float:
    """About 15 evaluations of the double sum per search: remember the answers."""
    check_inputs(epsilon0, n, delta)
    if blocked:
        profile = functools.partial(_blanket.blocked_delta, keep=keep, other=other, k=k, n=n)
    else:
        profile = functools.partial(_blanket.full_blanket_delta, keep=keep, other=other, k=k, n=n)
    local = min(epsilon0, math.log(keep / other))
    return search_epsilon(lambda eps: 0.0 if eps >= local else profile(eps), delta, local)


@dataclass(frozen=True)
class BinaryRRExact(Analysis):
    """The exact profile of shuffled binary RR: the count of ones, worst case over all others' bits.

    Within the cost budget every configuration is evaluated. Beyond it, at the same n, the
    configurations are covered by intervals, each bounded by one smaller configuration (a user
    converted to a known constant is post-processing; docs/amplification.md §5), refined until
    the bound is within ``GRID_TOLERANCE`` of an evaluated configuration's exact value.
    """

    keep_probability: float | None = None
    max_work: int = field(default=EXACT_RR_MAX_WORK, compare=False)

    name: ClassVar[str] = "binary RR exact"
    citation: ClassVar[str] = "direct computation (hockey-stick of the shuffled count, all configurations)"
    validity: ClassVar[str] = "binary randomised response (GRR with k = 2) only"

    @property
    def keep(self) -> float:
        """Probability of reporting the true bit."""
        if self.keep_probability is not None:
            return self.keep_probability
        e0 = math.exp(self.epsilon0)
        return e0 / (e0 + 1)

    @property
    def local_epsilon(self) -> float:
        return min(self.epsilon0, math.log(self.keep / (1 - self.keep)))

    @property
    def evaluated_n(self) -> int:
        """Always n: beyond the budget the configuration search runs at n itself."""
        return self.n

    @property
    def exhaustive(self) -> bool:
        """Whether every configuration is evaluated (within ``max_work``), else the search."""
        return _binary_rr.work(self.keep, self.n) <= self.max_work

    def detail(self) -> str:
        if self.exhaustive:
            return ""
        return f"configuration search at n={self.n}, certified within {GRID_TOLERANCE:.1%} of exact"

    def delta_for_epsilon(self, epsilon: float) -> float:
        if epsilon >= self.local_epsilon:
            return 0.0
        if self.exhaustive:
            return _binary_rr.exact_delta(self.keep, self.n, epsilon)
        return _cached_grid_delta(self.keep, self.n, epsilon)

    def epsilon_floor(self, delta: float) -> float:
        """The all-zeros configuration alone (one of the sup's terms): cheap, and never above."""
        try:
            return min(_binary_rr.exact_epsilon(self.keep, self.n, delta, band=0), self.local_epsilon)
        except ValueError:
            return 0.0

    def epsilon_for_delta(self, delta: float) -> float:
        check_inputs(self.epsilon0, self.n, delta)
        try:
            epsilon = _cached_exact_epsilon(self.keep, self.n, delta, self.exhaustive)
        except ValueError as exc:
            raise NotApplicable(str(exc)) from None
        return min(epsilon * (1 + 1e-12), self.local_epsilon)


@functools.lru_cache(maxsize=256)
def _cached_exact_epsilon(keep: float, n: int, delta: float, exhaustive: bool) -> float:
    """The exact computation is the slow one (about 1 s at the budget): remember its answers."""
    if exhaustive:
        return _binary_rr.exact_epsilon(keep, n, delta)
    return _binary_rr.grid_epsilon(keep, n, delta, GRID_TOLERANCE).value


@functools.lru_cache(maxsize=1024)
def _cached_grid_delta(keep: float, n: int, epsilon: float) -> float:
    """The configuration search's profile (searches call it repeatedly at the same points)."""
    return _binary_rr.grid_delta(keep, n, epsilon, GRID_DELTA_TOLERANCE).value
