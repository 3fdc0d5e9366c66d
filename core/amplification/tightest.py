"""The tightest guarantee among the analyses a mechanism declares (ADR 0027).

Mechanisms say which analyses hold for them (``LocalRandomiser.shuffle_analyses``); this module
only evaluates them, so it names no mechanism. Generic analyses (FMT 2021 closed form and
numerical clones) hold for every epsilon0-LDP randomiser.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

from deniable.core.amplification.analyses import (
    Analysis,
    FMT21ClosedForm,
    FMT21NumericalClones,
    NotApplicable,
    check_inputs,
    is_amplified,
    local_only,
)
from deniable.core.amplification.shuffle import LOCAL_ONLY, AmplificationBound

# Beyond this e^eps0 overflows a float; shuffling cannot amplify such a randomiser anyway.
MAX_EPSILON0 = 700.0

DeclaredAnalyses = Callable[[], Sequence[Analysis]]


def generic_analyses(epsilon0: float, n: int) -> tuple[Analysis, ...]:
    """The analyses valid for n shuffled reports of any epsilon0-LDP randomiser."""
    return (FMT21ClosedForm(epsilon0, int(n)), FMT21NumericalClones(epsilon0, int(n)))


def unamplifiable(epsilon0: float, n: int) -> str | None:
    """Why no analysis can amplify at all here (None: the declared ones are worth evaluating)."""
    if n <= 1:
        return f"n={n}: no other reports to hide among; the local guarantee holds"
    if epsilon0 > MAX_EPSILON0:
        return f"epsilon0 > {MAX_EPSILON0:g}: e^epsilon0 overflows a float (no amplification)"
    return None


def tightest_bound(epsilon0: float, n: int, delta: float, declared: DeclaredAnalyses) -> AmplificationBound:
    """The smallest epsilon any declared analysis certifies at delta, naming it; never above epsilon0.

    ``declared`` is called only when amplification is possible (analyses refuse epsilon0 > 700).
    """
    check_inputs(epsilon0, n, delta)
    reason = unamplifiable(epsilon0, n)
    if reason is not None:
        return local_only(epsilon0, reason)
    return _tightest(float(epsilon0), int(n), float(delta), tuple(declared()))


@functools.lru_cache(maxsize=4096)
def _tightest(epsilon0: float, n: int, delta: float, analyses: tuple[Analysis, ...]) -> AmplificationBound:
    """Cached: analyses are frozen dataclasses, so equal declarations share one evaluation."""
    tried: list[str] = []
    best: tuple[float, Analysis] | None = None
    for analysis in analyses:
        if best is not None and analysis.epsilon_floor(delta) >= best[0]:
            tried.append(f"{analysis.name}: skipped (cannot beat {best[0]:.6g})")
            continue
        try:
            epsilon = analysis.epsilon_for_delta(delta)
        except NotApplicable as exc:
            tried.append(f"{analysis.name}: not applicable ({exc})")
            continue
        detail = analysis.detail()
        tried.append(f"{analysis.name}: {epsilon:.6g}" + (f" ({detail})" if detail else ""))
        if best is None or epsilon < best[0]:
            best = (epsilon, analysis)
    summary = "; ".join(tried)
    if best is None or not is_amplified(best[0], epsilon0):
        return local_only(epsilon0, f"no analysis amplifies at n={n}, delta={delta:g} [{summary}]")
    evaluated = getattr(best[1], "evaluated_n", n)
    return AmplificationBound(
        best[0], delta, best[1].name, True, f"tightest of: {summary}", evaluated if evaluated < n else 0
    )


def tightest_delta(epsilon0: float, n: int, epsilon: float, declared: DeclaredAnalyses) -> tuple[float, str]:
    """The privacy profile delta(epsilon) of n shuffled reports: the pointwise minimum of every
    declared analysis's profile (each is an upper bound, so their minimum is one), and its name.

    0 at or above epsilon0 (the local guarantee holds with delta = 0).
    """
    check_inputs(epsilon0, n)
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    if epsilon >= epsilon0:
        return 0.0, LOCAL_ONLY
    best, name = 1.0, LOCAL_ONLY
    if unamplifiable(epsilon0, n) is not None:
        return best, name
    for analysis in declared():
        delta = analysis.delta_for_epsilon(epsilon)
        if delta < best:
            best, name = delta, analysis.name
    return best, name


def clear_cache() -> None:
    """Forget cached guarantees (tests, or after changing a mechanism's thresholds)."""
    _tightest.cache_clear()
