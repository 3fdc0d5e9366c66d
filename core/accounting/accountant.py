"""The accountant: every analysis valid for the mechanism, and the tightest guarantee among them.

Generic analyses (FMT 2021 closed form and numerical clones) hold for any epsilon0-LDP randomiser;
"binary_rr" and "grr" add the GRR privacy blanket and, for two values, the exact shuffled-count
profile, evaluated at the mechanism's realised probabilities (its integer thresholds make the
keep probability slightly below e^eps0 / (e^eps0 + k - 1)). Unknown mechanism names get the
generic analyses only, which hold for every epsilon0-LDP randomiser.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

from deniable.core.accounting.analyses import (
    Analysis,
    BinaryRRExact,
    FMT21ClosedForm,
    FMT21NumericalClones,
    GRRBlanket,
    GRRFullBlanket,
    NotApplicable,
    check_inputs,
    is_amplified,
    local_only,
)
from deniable.core.accounting.shuffle import LOCAL_ONLY, AmplificationBound

BINARY_RR = "binary_rr"
GRR = "grr"
# Beyond this e^eps0 overflows a float; shuffling cannot amplify such a randomiser anyway.
MAX_EPSILON0 = 700.0


def realised_probabilities(mechanism: str, epsilon0: float, domain_size: int) -> tuple[Fraction, Fraction]:
    """Exact (keep, other) probabilities of the registered randomiser with these parameters."""
    from deniable.core.mechanisms.direct import (  # lazy: accounting stays importable alone
        BinaryRandomisedResponse,
        GeneralisedRandomisedResponse,
    )

    if mechanism == BINARY_RR:
        rr = BinaryRandomisedResponse(epsilon0, domain_size)
        return rr.keep_probability, rr.other_probability
    if mechanism == GRR:
        grr = GeneralisedRandomisedResponse(epsilon0, domain_size)
        return grr.keep_probability, grr.other_probability
    raise ValueError(f"no realised probabilities for mechanism {mechanism!r}")


def _normalise(mechanism: str | None, domain_size: int | None) -> tuple[str | None, int | None]:
    if mechanism == BINARY_RR:
        if domain_size not in (None, 2):
            raise ValueError("binary_rr has a domain of exactly 2 values")
        return mechanism, 2
    if mechanism == GRR:
        if domain_size is None or domain_size < 2:
            raise ValueError("grr needs domain_size >= 2")
        return mechanism, int(domain_size)
    return mechanism, domain_size


def analyses_for(
    epsilon0: float, n: int, mechanism: str | None = None, domain_size: int | None = None
) -> list[Analysis]:
    """Every analysis valid for n shuffled reports of this mechanism (generic ones when None)."""
    check_inputs(epsilon0, n)
    mechanism, domain_size = _normalise(mechanism, domain_size)
    found: list[Analysis] = [FMT21ClosedForm(epsilon0, int(n)), FMT21NumericalClones(epsilon0, int(n))]
    if mechanism in (BINARY_RR, GRR) and domain_size is not None:
        keep, other = realised_probabilities(mechanism, epsilon0, domain_size)
        found.append(GRRBlanket(epsilon0, int(n), domain_size, float(keep), float(other)))
        if domain_size >= 3:
            found.append(GRRFullBlanket(epsilon0, int(n), domain_size, float(keep), float(other)))
        if domain_size == 2:
            found.append(BinaryRRExact(epsilon0, int(n), float(keep)))
    return found


def all_bounds(
    epsilon0: float,
    n: int,
    delta: float,
    mechanism: str | None = None,
    domain_size: int | None = None,
) -> list[AmplificationBound]:
    """Each valid analysis's own guarantee at delta (local, labelled, where it gives nothing)."""
    check_inputs(epsilon0, n, delta)
    return [analysis.bound(delta) for analysis in analyses_for(epsilon0, n, mechanism, domain_size)]


def best_bound(
    epsilon0: float,
    n: int,
    delta: float,
    mechanism: str | None = None,
    domain_size: int | None = None,
) -> AmplificationBound:
    """The smallest epsilon any valid analysis certifies at delta, naming it; never above epsilon0."""
    check_inputs(epsilon0, n, delta)
    mechanism, domain_size = _normalise(mechanism, domain_size)
    return _best_bound(float(epsilon0), int(n), float(delta), mechanism, domain_size)


@functools.lru_cache(maxsize=4096)
def _best_bound(
    epsilon0: float, n: int, delta: float, mechanism: str | None, domain_size: int | None
) -> AmplificationBound:
    if n <= 1:
        return local_only(epsilon0, f"n={n}: no other reports to hide among; the local guarantee holds")
    if epsilon0 > MAX_EPSILON0:
        return local_only(
            epsilon0, f"epsilon0 > {MAX_EPSILON0:g}: e^epsilon0 overflows a float (no amplification)"
        )
    tried: list[str] = []
    best: tuple[float, Analysis] | None = None
    for analysis in analyses_for(epsilon0, n, mechanism, domain_size):
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


def best_delta(
    epsilon0: float,
    n: int,
    epsilon: float,
    mechanism: str | None = None,
    domain_size: int | None = None,
) -> tuple[float, str]:
    """The privacy profile delta(epsilon) of n shuffled reports: the pointwise minimum of every
    valid analysis's profile (each is an upper bound, so their minimum is one), and its name.

    0 at or above epsilon0 (the local guarantee holds with delta = 0).
    """
    check_inputs(epsilon0, n)
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    mechanism, domain_size = _normalise(mechanism, domain_size)
    if epsilon >= epsilon0:
        return 0.0, LOCAL_ONLY
    best, name = 1.0, LOCAL_ONLY
    if n <= 1 or epsilon0 > MAX_EPSILON0:
        return best, name
    for analysis in analyses_for(epsilon0, n, mechanism, domain_size):
        delta = analysis.delta_for_epsilon(epsilon)
        if delta < best:
            best, name = delta, analysis.name
    return best, name


def clear_cache() -> None:
    """Forget cached guarantees (tests, or after changing a mechanism's thresholds)."""
    _best_bound.cache_clear()
