"""The accountant: every analysis a mechanism declares valid, and the tightest guarantee among them.

It names no mechanism (ADR 0027): a mechanism name is looked up in the registry and the class
says which analyses hold (``LocalRandomiser.shuffle_analyses``): the generic ones (FMT 2021
closed form and numerical clones) for any epsilon0-LDP randomiser, more where a mechanism has
them. ``mechanism=None`` (or a name the registry does not know) gets the generic analyses only.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Protocol, runtime_checkable

from deniable.core import mechanisms
from deniable.core.amplification import (
    MAX_EPSILON0,
    AmplificationBound,
    Analysis,
    DeclaredAnalyses,
    generic_analyses,
    tightest_bound,
    tightest_delta,
)
from deniable.core.amplification import tightest as _tightest
from deniable.core.amplification.analyses import check_inputs

__all__ = [
    "MAX_EPSILON0",
    "all_bounds",
    "analyses_for",
    "best_bound",
    "best_delta",
    "central_guarantee",
    "clear_cache",
    "realised_probabilities",
]


@runtime_checkable
class _KeepsOrReplaces(Protocol):
    """A randomiser that reports the true value w.p. keep and each other one w.p. other."""

    keep_probability: Fraction
    other_probability: Fraction


def realised_probabilities(mechanism: str, epsilon0: float, domain_size: int) -> tuple[Fraction, Fraction]:
    """Exact (keep, other) probabilities of the registered randomiser with these parameters."""
    randomiser = mechanisms.create(mechanism, epsilon0=epsilon0, domain_size=domain_size)
    if not isinstance(randomiser, _KeepsOrReplaces):
        raise ValueError(f"no realised probabilities for mechanism {mechanism!r}")
    return randomiser.keep_probability, randomiser.other_probability


def _declared(epsilon0: float, n: int, mechanism: str | None, domain_size: int | None) -> DeclaredAnalyses:
    """The mechanism's declaration of its analyses (domain checked now, analyses built on demand)."""
    epsilon0, n = float(epsilon0), int(n)
    if mechanism is None or mechanism not in mechanisms.names():  # unknown: what holds for any LDP
        return lambda: generic_analyses(epsilon0, n)
    randomiser = mechanisms.mechanism_class(mechanism)
    domain = randomiser.accounting_domain(domain_size)
    return lambda: randomiser.shuffle_analyses(epsilon0, n, domain)


def analyses_for(
    epsilon0: float, n: int, mechanism: str | None = None, domain_size: int | None = None
) -> list[Analysis]:
    """Every analysis valid for n shuffled reports of this mechanism (generic ones when None)."""
    check_inputs(epsilon0, n)
    return list(_declared(epsilon0, n, mechanism, domain_size)())


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
    declared = _declared(epsilon0, n, mechanism, domain_size)
    return tightest_bound(float(epsilon0), int(n), float(delta), declared)


def best_delta(
    epsilon0: float,
    n: int,
    epsilon: float,
    mechanism: str | None = None,
    domain_size: int | None = None,
) -> tuple[float, str]:
    """The privacy profile delta(epsilon) of n shuffled reports: the pointwise minimum of every
    valid analysis's profile, and its name; 0 at or above epsilon0."""
    check_inputs(epsilon0, n)
    declared = _declared(epsilon0, n, mechanism, domain_size)
    return tightest_delta(epsilon0, n, epsilon, declared)


def central_guarantee(
    epsilon0: float,
    n: int,
    delta: float,
    *,
    mechanism: str | None = None,
    domain_size: int | None = None,
) -> AmplificationBound:
    """The tightest valid central guarantee this accountant knows for n shuffled reports.

    Generic analyses for any epsilon0-LDP randomiser when ``mechanism`` is None; a named mechanism
    adds the analyses it declares. See ``best_bound``.
    """
    return best_bound(epsilon0, n, delta, mechanism=mechanism, domain_size=domain_size)


def clear_cache() -> None:
    """Forget cached guarantees (tests, or after changing a mechanism's thresholds)."""
    _tightest.clear_cache()
